#include "tcp_controller/tcp_transport.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "core/hash.h"
#include "core/logging.h"
#include "rendezvous/http_store.h"
#include "tcp_controller/tcp_control_channel.h"
#include "tcp_controller/tcp_group.h"
#include "tcp_controller/tcp_host_comm.h"
#include "tcp_controller/tcp_identity.h"

namespace hvdc {
namespace tcp {
namespace {

constexpr uint32_t kAdminChannel = 0;

class TcpTransport : public Transport {
 public:
  TcpTransport(std::shared_ptr<Mesh> mesh, Topology topology, int64_t segment_bytes,
               bool end_on_loss)
      : mesh_(std::move(mesh)),
        topology_(topology),
        segment_bytes_(segment_bytes),
        end_on_loss_(end_on_loss),
        admin_(mesh_, AllRanks(mesh_->size()), kAdminChannel) {}
  ~TcpTransport() override { Finalize(); }

  const Topology& topology() const override { return topology_; }
  const char* name() const override { return "gloo"; }
  bool threads_supported() const override { return true; }

  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    out->control.reset();
    out->data.reset();
    if (finalized_) return Status::UnknownError("CreateProcessSet: the TCP transport is finalized");
    bool same = false;
    HVDC_RETURN_IF_ERROR(CheckAgreement(HashInts(world_ranks), &same));
    if (!same) {
      return Status::PreconditionError(
          fmt::format("CreateProcessSet: ranks passed different member lists (rank {} passed [{}])",
                      topology_.rank, fmt::join(world_ranks, ", ")));
    }
    const int n = topology_.size;
    for (size_t i = 0; i < world_ranks.size(); ++i) {
      if (world_ranks[i] < 0 || world_ranks[i] >= n ||
          (i > 0 && world_ranks[i] <= world_ranks[i - 1])) {
        return Status::InvalidArgument(
            fmt::format("CreateProcessSet: ranks [{}] must be sorted, distinct and in [0, {})",
                        fmt::join(world_ranks, ", "), n));
      }
    }
    if (world_ranks.empty()) {
      return Status::InvalidArgument("CreateProcessSet: the rank list is empty");
    }
    const uint32_t k = next_set_++;  // every rank counts every set, member or not
    if (!std::binary_search(world_ranks.begin(), world_ranks.end(), topology_.rank)) {
      return Status::OK();
    }
    out->control = std::make_unique<TcpControlChannel>(Group(mesh_, world_ranks, 2 * k + 1));
    out->data = std::make_unique<TcpHostComm>(Group(mesh_, world_ranks, 2 * k + 2), segment_bytes_);
    return Status::OK();
  }

  Status CheckAgreement(uint64_t value, bool* all_equal) override {
    if (finalized_) return Status::UnknownError("CheckAgreement: the TCP transport is finalized");
    *all_equal = true;
    const int n = admin_.size(), r = admin_.rank();
    for (int k = 1; k < n; ++k) {
      HVDC_RETURN_IF_ERROR(admin_.Send((r + k) % n, &value, sizeof(value)));
    }
    for (int k = 1; k < n; ++k) {
      uint64_t theirs = 0;
      HVDC_RETURN_IF_ERROR(admin_.Recv((r + n - k) % n, &theirs, sizeof(theirs)));
      if (theirs != value) *all_equal = false;
    }
    return Status::OK();
  }

  void SetPeerLostHandler(PeerLostHandler handler) override {
    mesh_->SetPeerLostHandler(std::move(handler));
  }
  // MakeTcpTransport sets end_on_loss.
  bool loss_ends_every_wait() const override { return end_on_loss_; }

  void Finalize() override {
    if (finalized_) return;
    finalized_ = true;
    mesh_->Close();
  }

 private:
  static std::vector<int> AllRanks(int n) {
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) v[i] = i;
    return v;
  }

  std::shared_ptr<Mesh> mesh_;
  const Topology topology_;
  const int64_t segment_bytes_;
  const bool end_on_loss_;
  Group admin_;
  uint32_t next_set_ = 0;
  bool finalized_ = false;
};

}  // namespace
}  // namespace tcp

Status MakeTcpTransportOverMesh(std::shared_ptr<tcp::Mesh> mesh, const Config& config,
                                std::unique_ptr<Transport>* out, bool mesh_ends_on_loss) {
  Topology topology;
  HVDC_RETURN_IF_ERROR(
      tcp::BuildTopology(mesh->rank(), mesh->size(), mesh->hosts(), config, &topology));
  *out = std::make_unique<tcp::TcpTransport>(std::move(mesh), topology, config.chunk_bytes,
                                             mesh_ends_on_loss);
  return Status::OK();
}

Status MakeTcpTransport(const Config& config, std::unique_ptr<Transport>* out) {
  tcp::Identity id;
  HVDC_RETURN_IF_ERROR(tcp::IdentityFromConfig(config, &id));
  tcp::MeshOptions options;
  options.rank = id.rank;
  options.size = id.size;
  options.peers = id.peers;
  options.bind_host = id.bind_host;
  options.source = id.peers_origin;
  options.listen_origin = id.bind_origin;
  options.job_token = id.job_token;
  options.secret_key = id.secret_key;
  options.timeout = std::chrono::seconds(config.gloo_timeout_s);
  options.peer_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.peer_timeout_s * 1000.0));
  // The runtime ends the job on a lost peer: no operation may stay blocked on a live one.
  options.end_on_loss = true;
  options.goodbye_is_loss = config.elastic;
  std::unique_ptr<rendezvous::HttpStore> store;
  if (id.peers.empty()) {
    Status reached =
        rendezvous::HttpStore::Create(id.rendezvous_host, id.rendezvous_port,
                                      config.tcp_rendezvous_scope, options.timeout, &store);
    if (!reached.ok() && !config.tcp_address_origin.empty()) {
      // The message names the variables; say who set them (the user may never have).
      return Status::FromCode(reached.code(), fmt::format("{} (set by {})", reached.message(),
                                                          config.tcp_address_origin));
    }
    HVDC_RETURN_IF_ERROR(reached);
    store->set_secret(id.secret_key);
    options.store = store.get();
  }
  std::shared_ptr<tcp::Mesh> mesh;
  HVDC_RETURN_IF_ERROR(tcp::Mesh::Create(options, &mesh));
  LogDebug("TCP transport: rank {} of {} connected ({})", id.rank, id.size,
           id.peers.empty() ? store->Describe() : "HVDC_TCP_PEERS");
  return MakeTcpTransportOverMesh(std::move(mesh), config, out, options.end_on_loss);
}

}  // namespace hvdc
