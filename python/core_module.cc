// horovod_compat._core: a one-to-one translation of the C API (core/c_api.h) for the Python
// package. Policy (which exception to raise, argument checking) lives in horovod_compat/.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/c_api.h"

namespace py = pybind11;

namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// init(ranks, comm_addr, process_sets): ranks = subset of world ranks (empty = all), comm_addr =
// address of an MPI_Comm to borrow (0 = none), process_sets = extra sets registered at init.
int Init(const std::vector<int32_t>& ranks, std::uintptr_t comm_addr,
         const std::vector<std::vector<int32_t>>& process_sets) {
  std::vector<int32_t> flat;
  std::vector<int32_t> sizes;
  for (const auto& set : process_sets) {
    flat.insert(flat.end(), set.begin(), set.end());
    sizes.push_back(static_cast<int32_t>(set.size()));
  }
  hvdc_init_options options{};
  options.ranks = ranks.empty() ? nullptr : ranks.data();
  options.num_ranks = static_cast<int32_t>(ranks.size());
  options.mpi_comm = reinterpret_cast<void*>(comm_addr);
  options.process_set_ranks = flat.empty() ? nullptr : flat.data();
  options.process_set_sizes = sizes.empty() ? nullptr : sizes.data();
  options.num_process_sets = static_cast<int32_t>(sizes.size());
  return hvdc_init(&options);
}

// (code, ids): code < 0 on failure.
std::pair<int, std::vector<int32_t>> ProcessSetIds() {
  int n = hvdc_number_of_process_sets();
  if (n < 0) return {n, {}};
  std::vector<int32_t> ids(static_cast<size_t>(n) + 1);
  int count = hvdc_process_set_ids(ids.data(), static_cast<int32_t>(ids.size()));
  if (count < 0) return {count, {}};
  ids.resize(static_cast<size_t>(count));
  return {0, ids};
}

// (code, ranks): code < 0 on failure.
std::pair<int, std::vector<int32_t>> ProcessSetRanks(int32_t id) {
  int size = hvdc_process_set_size(id);
  if (size < 0) return {size, {}};
  std::vector<int32_t> ranks(static_cast<size_t>(size) + 1);
  int count = hvdc_process_set_ranks(id, ranks.data(), static_cast<int32_t>(ranks.size()));
  if (count < 0) return {count, {}};
  ranks.resize(static_cast<size_t>(count));
  return {0, ranks};
}

// A blocking barrier over a process set: (code, message). Called with the GIL released.
std::pair<int, std::string> Barrier(int32_t process_set_id, const std::string& name) {
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int code = HVDC_OK;
    std::string message;
  } waiter;
  hvdc_request request{};
  request.op = HVDC_OP_BARRIER;
  request.name = name.c_str();
  request.process_set_id = process_set_id;
  auto on_done = [](void* user, int code, const char* message) {
    auto* w = static_cast<Waiter*>(user);
    std::lock_guard<std::mutex> lock(w->mu);
    w->code = code;
    w->message = message != nullptr ? message : "";
    w->done = true;
    w->cv.notify_all();
  };
  int code = hvdc_enqueue(&request, 1, on_done, &waiter);
  if (code != HVDC_OK) return {code, hvdc_last_error()};
  std::unique_lock<std::mutex> lock(waiter.mu);
  waiter.cv.wait(lock, [&] { return waiter.done; });
  return {waiter.code, waiter.message};
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Bindings of the horovod_compat runtime's C API";

  m.def("init", &Init, py::arg("ranks"), py::arg("comm_addr"), py::arg("process_sets"), Release());
  m.def("shutdown", &hvdc_shutdown, Release());
  m.def("is_initialized", [] { return hvdc_is_initialized() == 1; });
  m.def("last_error", [] { return std::string(hvdc_last_error()); });

  m.def("rank", &hvdc_rank);
  m.def("size", &hvdc_size);
  m.def("local_rank", &hvdc_local_rank);
  m.def("local_size", &hvdc_local_size);
  m.def("cross_rank", &hvdc_cross_rank);
  m.def("cross_size", &hvdc_cross_size);
  m.def("is_homogeneous", &hvdc_is_homogeneous);
  m.def("mpi_threads_supported", &hvdc_mpi_threads_supported);
  m.def("mpi_enabled", [] { return hvdc_mpi_enabled() == 1; });
  m.def("mpi_built", [] { return hvdc_mpi_built() == 1; });
  m.def("gloo_enabled", [] { return hvdc_gloo_enabled() == 1; });
  m.def("gloo_built", [] { return hvdc_gloo_built() == 1; });
  m.def("nccl_built", &hvdc_nccl_built);
  m.def("cuda_built", [] { return hvdc_cuda_built() == 1; });
  m.def("version", [] { return std::string(hvdc_version()); });

  m.def(
      "add_process_set",
      [](const std::vector<int32_t>& ranks) {
        return hvdc_add_process_set(ranks.data(), static_cast<int32_t>(ranks.size()));
      },
      Release());
  m.def("remove_process_set", &hvdc_remove_process_set, Release());
  m.def("process_set_rank", &hvdc_process_set_rank);
  m.def("process_set_size", &hvdc_process_set_size);
  m.def("process_set_included", &hvdc_process_set_included);
  m.def("number_of_process_sets", &hvdc_number_of_process_sets);
  m.def("process_set_ids", &ProcessSetIds);
  m.def("process_set_ranks", &ProcessSetRanks);

  m.def("barrier", &Barrier, py::arg("process_set_id"), py::arg("name"), Release());
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    return hvdc_start_timeline(path.c_str(), mark_cycles ? 1 : 0);
  });
  m.def("stop_timeline", &hvdc_stop_timeline);

#define HVDC_CONST(name, value) m.attr(name) = static_cast<int>(value)
  HVDC_CONST("OK", HVDC_OK);
  HVDC_CONST("UNKNOWN_ERROR", HVDC_UNKNOWN_ERROR);
  HVDC_CONST("PEER_LOST", HVDC_PEER_LOST);
  HVDC_CONST("PRECONDITION_ERROR", HVDC_PRECONDITION_ERROR);
  HVDC_CONST("ABORTED", HVDC_ABORTED);
  HVDC_CONST("INVALID_ARGUMENT", HVDC_INVALID_ARGUMENT);
  HVDC_CONST("IN_PROGRESS", HVDC_IN_PROGRESS);

  HVDC_CONST("AVERAGE", HVDC_AVERAGE);
  HVDC_CONST("SUM", HVDC_SUM);
  HVDC_CONST("ADASUM", HVDC_ADASUM);
  HVDC_CONST("MIN", HVDC_MIN);
  HVDC_CONST("MAX", HVDC_MAX);
  HVDC_CONST("PRODUCT", HVDC_PRODUCT);

  HVDC_CONST("UINT8", HVDC_UINT8);
  HVDC_CONST("INT8", HVDC_INT8);
  HVDC_CONST("UINT16", HVDC_UINT16);
  HVDC_CONST("INT16", HVDC_INT16);
  HVDC_CONST("INT32", HVDC_INT32);
  HVDC_CONST("INT64", HVDC_INT64);
  HVDC_CONST("FLOAT16", HVDC_FLOAT16);
  HVDC_CONST("FLOAT32", HVDC_FLOAT32);
  HVDC_CONST("FLOAT64", HVDC_FLOAT64);
  HVDC_CONST("BOOL", HVDC_BOOL);
  HVDC_CONST("BFLOAT16", HVDC_BFLOAT16);

  HVDC_CONST("PROCESS_SET_ERROR_INIT", HVDC_PROCESS_SET_ERROR_INIT);
  HVDC_CONST("PROCESS_SET_ERROR_DYNAMIC", HVDC_PROCESS_SET_ERROR_DYNAMIC);
  HVDC_CONST("PROCESS_SET_ERROR_UNKNOWN_SET", HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
  HVDC_CONST("PROCESS_SET_ERROR_FOREIGN_SET", HVDC_PROCESS_SET_ERROR_FOREIGN_SET);
  HVDC_CONST("PROCESS_SET_ERROR_SHUTDOWN", HVDC_PROCESS_SET_ERROR_SHUTDOWN);
  HVDC_CONST("PROCESS_SET_ERROR_EXISTING_SET", HVDC_PROCESS_SET_ERROR_EXISTING_SET);
#undef HVDC_CONST
}
