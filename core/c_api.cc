// The C API: one funnel into the Runtime. Every function catches everything; synchronous failures
// leave a thread-local message for hvdc_last_error().
#include "core/c_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "core/build_config.h"
#include "core/builtin.h"
#include "core/logging.h"
#include "core/process_set_error.h"
#include "core/runtime.h"

namespace hvdc {
namespace {

thread_local std::string g_last_error;

// The only process-wide state: the current runtime and the compiled-in backends.
struct Global {
  std::mutex mu;  // guards runtime (replacement), transport_kind and builtins
  std::shared_ptr<Runtime> runtime;
  TransportKind transport_kind = TransportKind::kLocal;  // the runtime's (Builtins::transports)
  std::unique_ptr<Builtins> builtins;
};

Global& G() {
  static Global* g = new Global();  // never destroyed: callbacks may run during exit
  return *g;
}

std::shared_ptr<Runtime> Current() {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().runtime;
}

// The current runtime (or null) and the kind of transport it was made with.
std::shared_ptr<Runtime> Current(TransportKind* kind) {
  std::lock_guard<std::mutex> lock(G().mu);
  *kind = G().transport_kind;
  return G().runtime;
}

// The exit hook. It reports nothing through g_last_error: by the time atexit handlers run, the
// exiting thread's thread_local objects are destroyed, and writing one corrupts the heap (seen as
// a crash in MPI_Finalize, the next handler).
void ShutdownAtExit() {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(G().mu);
    rt = std::move(G().runtime);
  }
  if (!rt) return;
  try {
    Status s = rt->Shutdown();
    if (!s.ok()) LogWarning("shutdown at exit: {}", s.ToString());
  } catch (const std::exception& e) {
    LogWarning("shutdown at exit: {}", e.what());
  }
}

int Fail(StatusCode code, std::string msg) {
  g_last_error = std::move(msg);
  return static_cast<int>(code);
}

int Fail(const Status& s) { return Fail(s.code(), s.message()); }

// A process-set call's Status as Horovod's code: 0 for OK, else a HOROVOD_PROCESS_SET_ERROR_*
// value; the message becomes the last error (hvdc_last_error).
int ProcessSetCode(const Status& s) {
  if (s.ok()) return 0;
  g_last_error = s.message();
  switch (ProcessSetErrorOf(s)) {
    case ProcessSetError::kDynamicOff:
      return HVDC_PROCESS_SET_ERROR_DYNAMIC;
    case ProcessSetError::kUnknownSet:
      return HVDC_PROCESS_SET_ERROR_UNKNOWN_SET;
    case ProcessSetError::kForeignSet:
      return HVDC_PROCESS_SET_ERROR_FOREIGN_SET;
    case ProcessSetError::kShutDown:
      return HVDC_PROCESS_SET_ERROR_SHUTDOWN;
    case ProcessSetError::kExistingSet:
      return HVDC_PROCESS_SET_ERROR_EXISTING_SET;
    case ProcessSetError::kInit:
    case ProcessSetError::kNone:
      break;
  }
  return HVDC_PROCESS_SET_ERROR_INIT;
}

constexpr const char* kNotInitialized = "Horovod has not been initialized; use hvd.init().";

template <typename F>
int Guard(F&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Fail(StatusCode::kUnknownError, std::string("internal error: ") + e.what());
  } catch (...) {
    return Fail(StatusCode::kUnknownError, "internal error");
  }
}

Builtins& GetBuiltins() {
  if (!G().builtins) {
    G().builtins = std::make_unique<Builtins>();
    RegisterBuiltins(G().builtins.get());
  }
  return *G().builtins;
}

Status CheckTensor(const hvdc_tensor& t, const char* what) {
  if (!IsValidDataType(t.dtype)) {
    return Status::InvalidArgument(fmt::format("{}: invalid dtype {}", what, t.dtype));
  }
  if (t.ndim < 0 || t.ndim > HVDC_MAX_DIMS) {
    return Status::InvalidArgument(
        fmt::format("{}: invalid number of dimensions {}", what, t.ndim));
  }
  return Status::OK();
}

Status TranslateTensor(const hvdc_tensor& t, const char* what, Shape* shape) {
  HVDC_RETURN_IF_ERROR(CheckTensor(t, what));
  shape->assign(t.dims, t.dims + t.ndim);
  return Status::OK();
}

Status Translate(const hvdc_request& r, EnqueueItem* item) {
  if (!IsValidOpType(r.op)) return Status::InvalidArgument(fmt::format("invalid op {}", r.op));
  Request& q = item->request;
  q.op = static_cast<OpType>(r.op);
  q.name = r.name ? r.name : "";
  if (q.op != OpType::kJoin && q.op != OpType::kBarrier) {
    HVDC_RETURN_IF_ERROR(TranslateTensor(r.input, "input", &q.shape));
    q.dtype = static_cast<DataType>(r.input.dtype);
    q.device = r.input.device < 0 ? -1 : r.input.device;
    if (r.input.data == nullptr && NumElements(q.shape) > 0) {
      return Status::InvalidArgument(fmt::format("tensor '{}' has no data", q.name));
    }
  }
  item->input = r.input.data;
  if ((r.ready_event != nullptr || r.done_stream != nullptr) && q.device < 0) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': ready_event and done_stream are for CUDA tensors (device >= 0)", q.name));
  }
  item->ready_event = r.ready_event;
  item->done_stream = r.done_stream;
  switch (q.op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      if (!IsValidReduceOp(r.reduce_op)) {
        return Status::InvalidArgument(fmt::format("invalid reduce op {}", r.reduce_op));
      }
      q.reduce_op = static_cast<ReduceOp>(r.reduce_op);
      q.prescale = r.prescale_factor == 0 ? 1.0 : r.prescale_factor;
      q.postscale = r.postscale_factor == 0 ? 1.0 : r.postscale_factor;
      if (q.op == OpType::kReducescatter) {
        if (r.allocate == nullptr)
          return Status::InvalidArgument("reducescatter needs an allocator");
        break;
      }
      [[fallthrough]];
    case OpType::kBroadcast: {
      HVDC_RETURN_IF_ERROR(CheckTensor(r.output, "output"));
      const bool same_shape = static_cast<size_t>(r.output.ndim) == q.shape.size() &&
                              std::equal(q.shape.begin(), q.shape.end(), r.output.dims);
      if (!same_shape || r.output.dtype != r.input.dtype) {
        return Status::InvalidArgument(
            fmt::format("tensor '{}': the output must have the input's shape and dtype", q.name));
      }
      if (r.output.data == nullptr && NumElements(q.shape) > 0) {
        return Status::InvalidArgument(fmt::format("tensor '{}' has no output buffer", q.name));
      }
      item->output = r.output.data;
      q.root_rank = r.root_rank;
      break;
    }
    case OpType::kAlltoall:
      if (r.num_splits < 0 || (r.num_splits > 0 && r.splits == nullptr)) {
        return Status::InvalidArgument("alltoall: invalid splits");
      }
      if (r.splits) q.splits.assign(r.splits, r.splits + r.num_splits);
      item->received_splits = r.received_splits;
      [[fallthrough]];
    case OpType::kAllgather:
      if (r.allocate == nullptr) {
        return Status::InvalidArgument(fmt::format("{} needs an allocator", OpTypeName(q.op)));
      }
      break;
    case OpType::kJoin:
      item->join_last_rank = r.join_last_rank;
      break;
    case OpType::kBarrier:
      break;
  }
  if (r.allocate) {
    hvdc_alloc_fn fn = r.allocate;
    void* user = r.allocate_user;
    item->allocate = [fn, user](const Shape& shape) {
      return fn(user, static_cast<int32_t>(shape.size()), shape.data());
    };
  }
  return Status::OK();
}

}  // namespace
}  // namespace hvdc

using namespace hvdc;  // NOLINT: the C functions below are the implementation of this namespace

extern "C" {

int hvdc_init(const hvdc_init_options* options) {
  return Guard([&]() -> int {
    std::lock_guard<std::mutex> lock(G().mu);
    if (G().runtime) return HVDC_OK;  // init() twice is harmless
    Config config;
    std::vector<std::string> warnings;
    Status s = Config::FromProcessEnv(&config, &warnings);
    if (!s.ok()) return Fail(s);
    InitOptions opts;
    if (options) {
      if (options->ranks) opts.ranks.assign(options->ranks, options->ranks + options->num_ranks);
      opts.mpi_comm = options->mpi_comm;
      const int32_t* p = options->process_set_ranks;
      for (int32_t i = 0; i < options->num_process_sets; ++i) {
        const int32_t n = options->process_set_sizes[i];
        opts.process_sets.emplace_back(p, p + n);
        p += n;
      }
    }
    Builtins& b = GetBuiltins();
    // The first transport (in order of precedence) that recognises this environment.
    const TransportEntry* chosen = nullptr;
    for (const TransportEntry& t : b.transports) {
      if (t.recognises(config, opts)) {
        chosen = &t;
        break;
      }
    }
    if (!chosen) return Fail(StatusCode::kUnknownError, "this build has no transport");
    if (!chosen->make) {
      return Fail(StatusCode::kUnknownError, fmt::format("this build has no {}", chosen->what));
    }
    std::unique_ptr<Transport> transport;
    s = chosen->make(config, opts, &transport);
    if (!s.ok()) return Fail(s);
    std::vector<Backend*> backends;
    for (auto& be : b.backends) backends.push_back(be.get());
    std::unique_ptr<Runtime> rt;
    s = Runtime::Create(std::move(config), std::move(transport), backends, opts.process_sets, &rt);
    if (!s.ok()) return Fail(s);
    for (const auto& w : warnings) LogWarning("{}", w);
    G().runtime = std::move(rt);
    G().transport_kind = chosen->kind;
    // Programs that never call shutdown() still stop the runtime's threads before anything that
    // was registered earlier (MPI_Finalize, when we initialized MPI) runs at exit.
    static bool exit_hook = (std::atexit(ShutdownAtExit), true);
    (void)exit_hook;
    return HVDC_OK;
  });
}

int hvdc_shutdown(void) {
  return Guard([&]() -> int {
    std::shared_ptr<Runtime> rt;
    {
      std::lock_guard<std::mutex> lock(G().mu);
      rt = std::move(G().runtime);
    }
    if (rt) return Fail(rt->Shutdown());
    return HVDC_OK;
  });
}

int hvdc_is_initialized(void) { return Current() ? 1 : 0; }
const char* hvdc_last_error(void) { return g_last_error.c_str(); }

#define HVDC_TOPOLOGY_QUERY(fn, field)     \
  int fn(void) {                           \
    auto rt = Current();                   \
    return rt ? rt->topology().field : -1; \
  }
HVDC_TOPOLOGY_QUERY(hvdc_rank, rank)
HVDC_TOPOLOGY_QUERY(hvdc_size, size)
HVDC_TOPOLOGY_QUERY(hvdc_local_rank, local_rank)
HVDC_TOPOLOGY_QUERY(hvdc_local_size, local_size)
HVDC_TOPOLOGY_QUERY(hvdc_cross_rank, cross_rank)
HVDC_TOPOLOGY_QUERY(hvdc_cross_size, cross_size)
#undef HVDC_TOPOLOGY_QUERY

int hvdc_is_homogeneous(void) {
  auto rt = Current();
  return rt ? (rt->topology().homogeneous ? 1 : 0) : -1;
}

int hvdc_mpi_threads_supported(void) {
  TransportKind kind;
  auto rt = Current(&kind);
  if (!rt || kind != TransportKind::kMpi) return -1;
  return rt->transport().threads_supported() ? 1 : 0;
}

int hvdc_mpi_enabled(void) {
  TransportKind kind;
  auto rt = Current(&kind);
  return rt && kind == TransportKind::kMpi ? 1 : 0;
}

int hvdc_gloo_enabled(void) {
  TransportKind kind;
  auto rt = Current(&kind);
  return rt && kind == TransportKind::kTcp ? 1 : 0;
}

int hvdc_gloo_built(void) {
  std::lock_guard<std::mutex> lock(G().mu);
  return GetBuiltins().Built(TransportKind::kTcp) ? 1 : 0;
}

int hvdc_mpi_built(void) {
  std::lock_guard<std::mutex> lock(G().mu);
  return GetBuiltins().Built(TransportKind::kMpi) ? 1 : 0;
}

int hvdc_nccl_built(void) { return HVDC_NCCL_VERSION_CODE; }

int hvdc_cuda_built(void) {
  std::lock_guard<std::mutex> lock(G().mu);
  return GetBuiltins().cuda_built ? 1 : 0;
}

const char* hvdc_version(void) { return HVDC_VERSION; }

int hvdc_add_process_set(const int32_t* ranks, int32_t num_ranks) {
  return Guard([&]() -> int {
    auto rt = Current();
    if (!rt) return HVDC_PROCESS_SET_ERROR_INIT;
    if (num_ranks < 0 || (num_ranks > 0 && !ranks)) return HVDC_PROCESS_SET_ERROR_INIT;
    int id = 0;
    Status s = rt->AddProcessSet(std::vector<int>(ranks, ranks + num_ranks), &id);
    return s.ok() ? id : ProcessSetCode(s);
  });
}

int hvdc_remove_process_set(int32_t id) {
  return Guard([&]() -> int {
    auto rt = Current();
    return rt ? ProcessSetCode(rt->RemoveProcessSet(id)) : HVDC_PROCESS_SET_ERROR_INIT;
  });
}

int hvdc_process_set_rank(int32_t id) {
  auto rt = Current();
  if (!rt) return HVDC_PROCESS_SET_ERROR_INIT;
  int rank = 0;
  Status s = rt->ProcessSetRank(id, &rank);
  return s.ok() ? rank : ProcessSetCode(s);
}

int hvdc_process_set_size(int32_t id) {
  auto rt = Current();
  if (!rt) return HVDC_PROCESS_SET_ERROR_INIT;
  int size = 0;
  Status s = rt->ProcessSetSize(id, &size);
  return s.ok() ? size : ProcessSetCode(s);
}

int hvdc_process_set_included(int32_t id) {
  auto rt = Current();
  if (!rt) return HVDC_PROCESS_SET_ERROR_INIT;
  bool included = false;
  Status s = rt->ProcessSetIncluded(id, &included);
  return s.ok() ? (included ? 1 : 0) : ProcessSetCode(s);
}

int hvdc_number_of_process_sets(void) {
  auto rt = Current();
  return rt ? static_cast<int>(rt->ProcessSetIds().size()) : HVDC_PROCESS_SET_ERROR_INIT;
}

int hvdc_process_set_ids(int32_t* ids_out, int32_t capacity) {
  auto rt = Current();
  if (!rt) return HVDC_PROCESS_SET_ERROR_INIT;
  auto ids = rt->ProcessSetIds();
  for (size_t i = 0; i < ids.size() && static_cast<int32_t>(i) < capacity; ++i) ids_out[i] = ids[i];
  return static_cast<int>(ids.size());
}

int hvdc_process_set_ranks(int32_t id, int32_t* ranks_out, int32_t capacity) {
  auto rt = Current();
  if (!rt) return HVDC_PROCESS_SET_ERROR_INIT;
  std::vector<int> ranks;
  Status s = rt->ProcessSetRanks(id, &ranks);
  if (!s.ok()) return ProcessSetCode(s);
  for (size_t i = 0; i < ranks.size() && static_cast<int32_t>(i) < capacity; ++i) {
    ranks_out[i] = ranks[i];
  }
  return static_cast<int>(ranks.size());
}

int hvdc_enqueue(const hvdc_request* requests, int32_t count, hvdc_done_fn done, void* user) {
  return Guard([&]() -> int {
    auto rt = Current();
    if (!rt) return Fail(StatusCode::kPreconditionError, kNotInitialized);
    if (count <= 0 || requests == nullptr) {
      return Fail(StatusCode::kInvalidArgument, "hvdc_enqueue: no requests");
    }
    if (done == nullptr) return Fail(StatusCode::kInvalidArgument, "hvdc_enqueue: no callback");
    // One tensor (the common call) needs no vector.
    EnqueueItem one;
    std::vector<EnqueueItem> many(count > 1 ? static_cast<size_t>(count) : 0);
    EnqueueItem* items = count > 1 ? many.data() : &one;
    bool may_complete_inline = true;
    for (int32_t i = 0; i < count; ++i) {
      may_complete_inline &= (requests[i].flags & HVDC_REQUEST_MAY_COMPLETE_INLINE) != 0;
      if (requests[i].process_set_id != requests[0].process_set_id) {
        return Fail(StatusCode::kInvalidArgument, "a group must be in one process set");
      }
      Status s = Translate(requests[i], &items[i]);
      if (!s.ok()) return Fail(s);
    }
    Status s = rt->Enqueue(
        requests[0].process_set_id, items, static_cast<size_t>(count),
        [done, user](const Status& st) {
          done(user, static_cast<int>(st.code()), st.message().c_str());
        },
        may_complete_inline);
    return s.ok() ? HVDC_OK : Fail(s);
  });
}

int hvdc_start_timeline(const char* path, int mark_cycles) {
  return Guard([&]() -> int {
    auto rt = Current();
    if (!rt) return Fail(StatusCode::kPreconditionError, kNotInitialized);
    Status s = rt->StartTimeline(path ? path : "", mark_cycles != 0);
    return s.ok() ? HVDC_OK : Fail(s);
  });
}

int hvdc_stop_timeline(void) {
  return Guard([&]() -> int {
    auto rt = Current();
    if (!rt) return Fail(StatusCode::kPreconditionError, kNotInitialized);
    Status s = rt->StopTimeline();
    return s.ok() ? HVDC_OK : Fail(s);
  });
}

}  // extern "C"
