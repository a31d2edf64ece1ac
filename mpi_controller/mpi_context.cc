#include "mpi_controller/mpi_context.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace hvdc {
namespace mpi {
namespace {

// MPI itself is process-wide state, and so is the answer to "did we initialize it". When we
// initialize MPI we finalize it at process exit, not at shutdown(): MPI cannot be initialized
// twice, and init() after shutdown() must start a fresh runtime.
std::mutex g_init_mu;
bool g_initialized_by_us = false;  // guarded by g_init_mu
int g_owners = 0;                  // live contexts that own MPI; guarded by g_init_mu

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

void FinalizeAtExit() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized && !MpiFinalized()) MPI_Finalize();
}

// Initializes MPI unless it already is; *owns says whether it is ours to finalize.
Status AcquireMpi(const MpiContextOptions& options, bool* owns) {
  std::lock_guard<std::mutex> lock(g_init_mu);
  *owns = false;
  if (MpiFinalized()) {
    return Status::PreconditionError(
        "MPI has already been finalized in this process (by the program: horovod_compat "
        "finalizes it only at exit); MPI cannot be initialized a second time");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Read by Open MPI's MCA parameters inside MPI_Init; no overwrite of a value already there.
    if (options.yield_when_idle) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    const int required = options.serialized_only ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
    int provided = MPI_THREAD_SINGLE;
    HVDC_RETURN_IF_ERROR(
        MpiStatus(MPI_Init_thread(nullptr, nullptr, required, &provided), "MPI_Init_thread"));
    g_initialized_by_us = true;
    std::atexit(FinalizeAtExit);
  }
  if (g_initialized_by_us) {
    *owns = true;
    ++g_owners;
  }
  return Status::OK();
}

// Drops one owner (MPI itself is finalized at exit).
void ReleaseMpi(bool /*finalize*/) {
  std::lock_guard<std::mutex> lock(g_init_mu);
  --g_owners;
}

std::string RanksString(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

}  // namespace

Status MpiStatus(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    return Status::UnknownError(fmt::format("{} failed: MPI error {}", call, rc));
  }
  return Status::UnknownError(fmt::format("{} failed: {}", call, std::string(text, len)));
}

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown MPI thread level";
}

UniqueComm& UniqueComm::operator=(UniqueComm&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = other.release();
  }
  return *this;
}

MPI_Comm UniqueComm::release() {
  MPI_Comm comm = comm_;
  comm_ = MPI_COMM_NULL;
  return comm;
}

void UniqueComm::reset() {
  if (comm_ != MPI_COMM_NULL && !MpiFinalized()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

Status DupWithErrorsReturn(MPI_Comm comm, UniqueComm* out) {
  UniqueComm dup;
  HVDC_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(comm, dup.out()), "MPI_Comm_dup"));
  HVDC_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_set_errhandler(dup.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"));
  *out = std::move(dup);
  return Status::OK();
}

Status MpiContext::Create(const MpiContextOptions& options, std::unique_ptr<MpiContext>* out) {
  if (options.borrowed_comm != nullptr && !options.ranks.empty()) {
    return Status::InvalidArgument("MPI init: pass either a communicator or a rank list, not both");
  }
  std::unique_ptr<MpiContext> context(new MpiContext());
  if (options.borrowed_comm != nullptr) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || MpiFinalized()) {
      return Status::PreconditionError(
          "MPI init: a communicator was passed but MPI is not initialized (or already "
          "finalized)");
    }
  } else {
    HVDC_RETURN_IF_ERROR(AcquireMpi(options, &context->owns_mpi_));
  }
  MPI_Query_thread(&context->thread_level_);
  HVDC_RETURN_IF_ERROR(context->InitWorld(options));
  HVDC_RETURN_IF_ERROR(context->InitTopology());
  *out = std::move(context);
  return Status::OK();
}

MpiContext::~MpiContext() {
  if (finalized_) return;
  cross_.reset();
  local_.reset();
  world_.reset();
  if (owns_mpi_) ReleaseMpi(/*finalize=*/false);
}

void MpiContext::Finalize() {
  if (finalized_) return;
  finalized_ = true;
  cross_.reset();
  local_.reset();
  world_.reset();
  if (owns_mpi_) ReleaseMpi(/*finalize=*/true);
}

Status MpiContext::InitWorld(const MpiContextOptions& options) {
  if (options.borrowed_comm != nullptr) {
    if (*options.borrowed_comm == MPI_COMM_NULL) {
      return Status::InvalidArgument("MPI init: the communicator passed is MPI_COMM_NULL");
    }
    return DupWithErrorsReturn(*options.borrowed_comm, &world_);
  }
  if (options.ranks.empty()) return DupWithErrorsReturn(MPI_COMM_WORLD, &world_);

  // Rank subset. Only the listed ranks call MPI_Comm_create_group (it is collective over the
  // group alone), so the others can fail without waiting for anyone.
  int world_size = 0, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::vector<int> sorted = options.ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || sorted.back() >= world_size ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Status::InvalidArgument(
        fmt::format("MPI init: ranks {} must be distinct ranks of MPI_COMM_WORLD (size {})",
                    RanksString(options.ranks), world_size));
  }
  if (!std::binary_search(sorted.begin(), sorted.end(), world_rank)) {
    return Status::InvalidArgument(fmt::format(
        "MPI init: this process (rank {} of MPI_COMM_WORLD) is not in the requested ranks {}; "
        "only those ranks may initialize",
        world_rank, RanksString(options.ranks)));
  }
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, static_cast<int>(options.ranks.size()), options.ranks.data(), &group);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, /*tag=*/0, world_.out());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  HVDC_RETURN_IF_ERROR(MpiStatus(rc, "MPI_Comm_create_group"));
  return MpiStatus(MPI_Comm_set_errhandler(world_.get(), MPI_ERRORS_RETURN),
                   "MPI_Comm_set_errhandler");
}

Status MpiContext::InitTopology() {
  Topology& t = topology_;
  MPI_Comm_rank(world_.get(), &t.rank);
  MPI_Comm_size(world_.get(), &t.size);
  HVDC_RETURN_IF_ERROR(MpiStatus(
      MPI_Comm_split_type(world_.get(), MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, local_.out()),
      "MPI_Comm_split_type"));
  HVDC_RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(local_.get(), MPI_ERRORS_RETURN),
                                 "MPI_Comm_set_errhandler"));
  MPI_Comm_rank(local_.get(), &t.local_rank);
  MPI_Comm_size(local_.get(), &t.local_size);
  HVDC_RETURN_IF_ERROR(MpiStatus(MPI_Comm_split(world_.get(), t.local_rank, t.rank, cross_.out()),
                                 "MPI_Comm_split"));
  HVDC_RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(cross_.get(), MPI_ERRORS_RETURN),
                                 "MPI_Comm_set_errhandler"));
  MPI_Comm_rank(cross_.get(), &t.cross_rank);
  MPI_Comm_size(cross_.get(), &t.cross_size);
  // Homogeneous: every node runs the same number of ranks (max and min local size agree).
  int extremes[2] = {t.local_size, -t.local_size};
  HVDC_RETURN_IF_ERROR(MpiStatus(
      MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT, MPI_MAX, world_.get()), "MPI_Allreduce"));
  t.homogeneous = extremes[0] == -extremes[1];
  return Status::OK();
}

}  // namespace mpi
}  // namespace hvdc
