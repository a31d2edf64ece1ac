#include "mpi_controller/mpi_transport.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/hash.h"
#include "core/logging.h"
#include "mpi_controller/mpi_context.h"
#include "mpi_controller/mpi_control_channel.h"
#include "mpi_controller/mpi_host_comm.h"

namespace hvdc {
namespace mpi {
namespace {

Status CheckRanks(const std::vector<int>& ranks, int world_size) {
  if (ranks.empty()) return Status::InvalidArgument("CreateProcessSet: the rank list is empty");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return Status::InvalidArgument(
          fmt::format("CreateProcessSet: ranks [{}] must be sorted, distinct and in [0, {})",
                      fmt::join(ranks, ", "), world_size));
    }
  }
  return Status::OK();
}

// The world collectives a PeerWatch's set-up needs, over the transport's own communicator.
class MpiWorldCollectives : public WorldCollectives {
 public:
  explicit MpiWorldCollectives(MPI_Comm comm) : comm_(comm) {}

  Status Broadcast(void* buf, int64_t bytes, int root, const char* what) override {
    return MpiStatus(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_),
                     Label("MPI_Bcast", what).c_str());
  }

  Status Allgather(const void* send, int64_t bytes, void* recv, const char* what) override {
    const int n = static_cast<int>(bytes);
    return MpiStatus(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_),
                     Label("MPI_Allgather", what).c_str());
  }

 private:
  // "MPI_Bcast (liveness token)", or the bare call when there is no label.
  static std::string Label(const char* call, const char* what) {
    return what && *what ? fmt::format("{} ({})", call, what) : std::string(call);
  }

  MPI_Comm comm_;
};

class MpiTransport : public Transport {
 public:
  MpiTransport(std::unique_ptr<MpiContext> context, UniqueComm admin, bool threads_supported,
               std::unique_ptr<PeerWatch> liveness)
      : context_(std::move(context)),
        admin_(std::move(admin)),
        threads_supported_(threads_supported),
        liveness_(std::move(liveness)) {}

  const Topology& topology() const override { return context_->topology(); }
  const char* name() const override { return "mpi"; }
  bool threads_supported() const override { return threads_supported_; }

  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    out->control.reset();
    out->data.reset();
    if (finalized_) return Status::UnknownError("CreateProcessSet: MPI transport is finalized");
    // Agree on the list before splitting: a rank with a different list would otherwise silently
    // build a different communicator than its peers.
    bool same = false;
    HVDC_RETURN_IF_ERROR(CheckAgreement(HashInts(world_ranks), &same));
    if (!same) {
      return Status::PreconditionError(
          fmt::format("CreateProcessSet: ranks passed different member lists (rank {} passed [{}])",
                      topology().rank, fmt::join(world_ranks, ", ")));
    }
    HVDC_RETURN_IF_ERROR(CheckRanks(world_ranks, topology().size));
    const bool member = std::binary_search(world_ranks.begin(), world_ranks.end(), topology().rank);
    UniqueComm set;
    HVDC_RETURN_IF_ERROR(MpiStatus(
        MPI_Comm_split(admin_.get(), member ? 0 : MPI_UNDEFINED, topology().rank, set.out()),
        "MPI_Comm_split"));
    if (!member) return Status::OK();
    UniqueComm control, data;
    HVDC_RETURN_IF_ERROR(DupWithErrorsReturn(set.get(), &control));
    HVDC_RETURN_IF_ERROR(DupWithErrorsReturn(set.get(), &data));
    std::unique_ptr<HostComm> host = MakeMpiHostComm(data.release());
    if (!host) return Status::UnknownError("CreateProcessSet: could not set up the data plane");
    out->control = std::make_unique<MpiControlChannel>(control.release());
    out->data = std::move(host);
    return Status::OK();
  }

  Status CheckAgreement(uint64_t value, bool* all_equal) override {
    if (finalized_) return Status::UnknownError("CheckAgreement: MPI transport is finalized");
    // max(value) and max(~value) = ~min(value) in one call.
    uint64_t v[2] = {value, ~value};
    HVDC_RETURN_IF_ERROR(MpiStatus(
        MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, admin_.get()), "MPI_Allreduce"));
    *all_equal = v[0] == ~v[1];
    return Status::OK();
  }

  void SetPeerLostHandler(PeerLostHandler handler) override {
    // The runtime sets its handler once logging is configured: say here whether one can come.
    if (handler && !told_) {
      told_ = true;
      LogDebug("MPI liveness side channel: {}",
               liveness_ ? "on (" + liveness_->description() + ")"
                         : std::string("off (HOROVOD_MPI_LIVENESS=0, or a world of one rank)"));
    }
    if (liveness_) liveness_->SetPeerLostHandler(std::move(handler));
  }

  void Finalize() override {
    if (finalized_) return;
    finalized_ = true;
    if (liveness_) liveness_->Close();  // goodbyes first: no peer takes our exit for a death
    admin_.reset();
    context_->Finalize();
  }

 private:
  std::unique_ptr<MpiContext> context_;
  UniqueComm admin_;  // world collectives of the transport itself; nothing else uses it
  const bool threads_supported_;
  std::unique_ptr<PeerWatch> liveness_;  // HOROVOD_MPI_LIVENESS (null when off or alone)
  bool finalized_ = false;
  bool told_ = false;
};

}  // namespace
}  // namespace mpi

Status MakeMpiTransport(const Config& config, const MpiTransportOptions& opts,
                        std::unique_ptr<Transport>* out) {
  mpi::MpiContextOptions options;
  options.serialized_only = config.mpi_threads_disable;
  options.yield_when_idle = !config.mpi_yield_when_idle_set;
  options.ranks = opts.ranks;
  options.borrowed_comm = static_cast<const MPI_Comm*>(opts.borrowed_comm);
  std::unique_ptr<mpi::MpiContext> context;
  HVDC_RETURN_IF_ERROR(mpi::MpiContext::Create(options, &context));
  mpi::UniqueComm admin;
  HVDC_RETURN_IF_ERROR(mpi::DupWithErrorsReturn(context->world(), &admin));
  const bool threads =
      context->thread_level() == MPI_THREAD_MULTIPLE && !config.mpi_threads_disable;
  std::unique_ptr<PeerWatch> liveness;
  if (opts.peer_watch && config.mpi_liveness && context->topology().size > 1) {
    mpi::MpiWorldCollectives world(admin.get());
    HVDC_RETURN_IF_ERROR(opts.peer_watch(config, context->topology(), &world, &liveness));
  }
  *out = std::make_unique<mpi::MpiTransport>(std::move(context), std::move(admin), threads,
                                             std::move(liveness));
  return Status::OK();
}

}  // namespace hvdc
