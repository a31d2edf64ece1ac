#include "shm_controller/shm_transport.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "core/logging.h"
#include "shm_controller/hierarchical_host_comm.h"
#include "shm_controller/host_layout.h"
#include "shm_controller/shm_control_channel.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_segment.h"

namespace hvdc {
namespace shm {
namespace {

constexpr int64_t kHostBytes = 256;  // host identities are compared on this many bytes
// Payload bytes per rank and round of the control channel: a round carries most negotiation
// messages whole (a longer one takes rounds).
constexpr int64_t kControlChunkBytes = 32 * 1024;

// The creator's verdict, broadcast to the members.
struct Offer {
  uint64_t job_id = 0;
  int64_t bytes = 0;  // the segment's size, as the creator chose it
  int32_t index = 0;
  int32_t created = 0;
};

uint64_t RandomJobId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (static_cast<uint64_t>(getpid()) << 16);
}

std::string LocalHostName() {
  char name[kHostBytes] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// What each world rank says about itself once, at the first set: its host and whether it asks for
// hierarchical allreduce / allgather.
struct HostRecord {
  char host[kHostBytes];
  int32_t allreduce;
  int32_t allgather;
};

class ShmTransport : public Transport {
 public:
  ShmTransport(std::unique_ptr<Transport> inner, ShmOptions options)
      : inner_(std::move(inner)), options_(std::move(options)) {}

  const Topology& topology() const override { return inner_->topology(); }
  const char* name() const override { return inner_->name(); }
  bool threads_supported() const override { return inner_->threads_supported(); }
  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    HVDC_RETURN_IF_ERROR(inner_->CreateProcessSet(world_ranks, out));
    options_.transport_reports_loss = inner_->loss_ends_every_wait();
    if (hosts_.empty()) HVDC_RETURN_IF_ERROR(GatherHosts(world_ranks, out->data.get()));
    // Every world rank decides alike (same layout, same agreed flags): the hierarchical set-up
    // below is collective over the world.
    if (agreed_.hierarchical_allreduce || agreed_.hierarchical_allgather) {
      const HostLayout layout = HostLayout::Of(world_ranks, hosts_);
      const int local_size = layout.local_size();
      if (layout.host_count() > 1 && local_size > 1) {
        std::unique_ptr<HostComm> flat = std::move(out->data);
        return CreateHierarchicalHostComm(*inner_, world_ranks, layout, agreed_, std::move(flat),
                                          &out->data);
      }
      // Said once, by the set's first rank.
      const bool first = inner_->topology().rank == world_ranks.front();
      if (layout.host_count() > 1 && local_size == 0 && first && !warned_uneven_) {
        warned_uneven_ = true;
        std::string counts;
        for (const auto& h : layout.hosts)
          counts += (counts.empty() ? "" : "+") + std::to_string(h.size());
        LogWarning(
            "rank {}: hierarchical allreduce/allgather needs the same number of ranks on every "
            "host, and a process set of {} ranks has {} per host; such sets use the flat data "
            "plane (said once)",
            inner_->topology().rank, world_ranks.size(), counts);
      }
    }
    if (!out->data) return Status::OK();
    std::unique_ptr<HostComm> plane;
    HVDC_RETURN_IF_ERROR(CreateShmHostComm(*out->data, world_ranks, options_, &plane));
    if (!plane) return Status::OK();
    // One host, and shared memory works there: negotiation can go through it too.
    if (options_.control) {
      std::unique_ptr<ControlChannel> control;
      HVDC_RETURN_IF_ERROR(CreateShmControlChannel(*out->data, world_ranks, options_, &control));
      if (control) out->control = std::move(control);
    }
    out->data = std::move(plane);
    return Status::OK();
  }
  Status CheckAgreement(uint64_t value, bool* all_equal) override {
    return inner_->CheckAgreement(value, all_equal);
  }
  void SetPeerLostHandler(PeerLostHandler handler) override {
    inner_->SetPeerLostHandler(std::move(handler));
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  // Collective over the world: every rank's host identity and hierarchical switches, over the
  // first set's comm when that set is the world, else over a world set made for this.
  Status GatherHosts(const std::vector<int>& world_ranks, HostComm* set_comm) {
    const int n = inner_->topology().size;
    ProcessSetChannels world;
    HostComm* comm = set_comm;
    if (static_cast<int>(world_ranks.size()) != n) {
      std::vector<int> all(static_cast<size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      HVDC_RETURN_IF_ERROR(inner_->CreateProcessSet(all, &world));
      comm = world.data.get();
    }
    if (!comm) return Status::UnknownError("shared-memory plane: no world channels on a member");
    HostRecord mine = {};
    std::memcpy(mine.host, options_.host.data(),
                std::min<size_t>(options_.host.size(), kHostBytes - 1));
    mine.allreduce = options_.hierarchical_allreduce ? 1 : 0;
    mine.allgather = options_.hierarchical_allgather ? 1 : 0;
    std::vector<HostRecord> all(static_cast<size_t>(n));
    HVDC_RETURN_IF_ERROR(comm->Allgatherv(&mine, sizeof(mine), all.data(),
                                          std::vector<int64_t>(n, sizeof(HostRecord))));
    agreed_ = options_;
    int allreduce = 0, allgather = 0;
    for (const HostRecord& r : all) {
      hosts_.emplace_back(r.host, strnlen(r.host, kHostBytes));
      allreduce += r.allreduce;
      allgather += r.allgather;
    }
    // Only what every rank asks for (a rank alone would wait for sub-groups nobody else makes).
    agreed_.hierarchical_allreduce = allreduce == n;
    agreed_.hierarchical_allgather = allgather == n;
    const bool split = (allreduce != 0 && allreduce != n) || (allgather != 0 && allgather != n);
    if (split && inner_->topology().rank == 0) {
      LogWarning(
          "rank {}: hierarchical allreduce asked for by {} of {} ranks, allgather by {}: only "
          "what every rank asks for is used",
          inner_->topology().rank, allreduce, n, allgather);
    }
    return Status::OK();
  }

  std::unique_ptr<Transport> inner_;
  ShmOptions options_;
  // Set once, by the first CreateProcessSet (the control thread's, like every set creation).
  std::vector<std::string> hosts_;  // [w]: world rank w's host identity
  ShmOptions agreed_;               // options_ with the switches every rank agrees on
  bool warned_uneven_ = false;
};

// Segments of one process: the index part of the name.
std::atomic<int> next_index{0};

}  // namespace

ShmOptions ShmOptions::FromConfig(const Config& config) {
  ShmOptions o;
  o.enabled = config.shm_enabled;
  o.control = config.shm_control;
  o.bytes = config.shm_bytes;
  o.host = config.gloo.hostname.empty() ? LocalHostName() : config.gloo.hostname;
  o.peer_timeout_s = config.peer_timeout_s;
  o.hierarchical_allreduce = config.hierarchical_allreduce;
  o.hierarchical_allgather = config.hierarchical_allgather;
  return o;
}

namespace {

// Collective over `boot`: whether every member has the same host identity.
Status SameHost(HostComm& boot, const std::string& identity, bool* same) {
  const int n = boot.size();
  std::vector<char> host(kHostBytes, 0), hosts(static_cast<size_t>(kHostBytes * n));
  std::memcpy(host.data(), identity.data(), std::min<size_t>(identity.size(), kHostBytes - 1));
  HVDC_RETURN_IF_ERROR(
      boot.Allgatherv(host.data(), kHostBytes, hosts.data(), std::vector<int64_t>(n, kHostBytes)));
  *same = true;
  for (int q = 1; q < n && *same; ++q) {
    *same = std::memcmp(hosts.data(), hosts.data() + q * kHostBytes, kHostBytes) == 0;
  }
  return Status::OK();
}

// Collective over `boot` (members of one host): member 0 creates a segment of `bytes` (its own
// value: the others take its size), every member attaches, and the name is gone before anyone
// returns. *out is null on every member when any could not (the reason logged by those that failed,
// naming `what`).
Status ShareSegment(HostComm& boot, const std::vector<int>& world_ranks, int64_t bytes,
                    const char* what, std::unique_ptr<Segment>* out) {
  out->reset();
  const int n = boot.size(), me = boot.rank();
  Offer offer;
  std::unique_ptr<Segment> segment;
  std::string name;
  Status made;
  if (me == 0) {
    offer.job_id = RandomJobId();
    offer.bytes = bytes;
    offer.index = next_index.fetch_add(1);
    name = SegmentName(offer.job_id, offer.index);
    made = Segment::Create(name, SegmentSpec{offer.job_id, n, bytes}, &segment);
    offer.created = made.ok() ? 1 : 0;
  }
  HVDC_RETURN_IF_ERROR(boot.Broadcast(&offer, sizeof(offer), 0));
  if (me != 0 && offer.created) {
    name = SegmentName(offer.job_id, offer.index);
    made = Segment::Attach(name, SegmentSpec{offer.job_id, n, offer.bytes}, &segment);
  }
  // Every member has attached (or given up): then the name goes, so no exit can leave it behind.
  int32_t attached = made.ok() && offer.created ? 1 : 0, all = 0;
  Status met = boot.Allreduce(&attached, &all, 1, DataType::kInt32, ReduceOp::kMin);
  // Every member unlinks (the first one does it; the others find it gone), so that no member
  // returns while the name is still there.
  if (offer.created) Segment::Unlink(name);
  HVDC_RETURN_IF_ERROR(met);
  if (all == 0) {
    if (!made.ok()) {
      LogWarning(
          "rank {}: shared-memory {} not used for a set of {} ranks ({}); the transport's "
          "own carries it",
          world_ranks[me], what, n, made.message());
    }
    return Status::OK();
  }
  *out = std::move(segment);
  return Status::OK();
}

}  // namespace

int64_t DefaultSegmentBytes(int nranks) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && nranks > cores) return 16LL << 20;
  return static_cast<int64_t>(nranks) << 20;
}

Status CreateShmHostComm(HostComm& boot, const std::vector<int>& world_ranks,
                         const ShmOptions& options, std::unique_ptr<HostComm>* out) {
  out->reset();
  const int n = boot.size(), me = boot.rank();
  if (!options.enabled || n < 2) return Status::OK();
  bool same = false;
  HVDC_RETURN_IF_ERROR(SameHost(boot, options.host, &same));
  if (!same) return Status::OK();  // ranks on several hosts: the transport's data plane, as before
  std::unique_ptr<Segment> segment;
  const int64_t bytes = options.bytes > 0 ? options.bytes : DefaultSegmentBytes(n);
  HVDC_RETURN_IF_ERROR(ShareSegment(boot, world_ranks, bytes, "data plane", &segment));
  if (!segment) return Status::OK();
  const int64_t size = segment->bytes();
  out->reset(new ShmHostComm(std::move(segment), me, world_ranks, options.peer_timeout_s));
  LogDebug("rank {}: shared-memory data plane for a set of {} ranks ({} bytes, {} per round)",
           world_ranks[me], n, size, static_cast<ShmHostComm*>(out->get())->slot_bytes());
  return Status::OK();
}

Status CreateShmControlChannel(HostComm& boot, const std::vector<int>& world_ranks,
                               const ShmOptions& options, std::unique_ptr<ControlChannel>* out) {
  out->reset();
  const int n = boot.size();
  const int64_t bytes = ShmControlChannel::SegmentBytes(n, kControlChunkBytes);
  std::unique_ptr<Segment> segment;
  HVDC_RETURN_IF_ERROR(ShareSegment(boot, world_ranks, bytes, "control channel", &segment));
  if (!segment) return Status::OK();
  // A transport that reports lost peers itself names them by address: it goes first.
  const double defer_s = options.transport_reports_loss ? ShmControlChannel::kDeferToTransportS : 0;
  out->reset(new ShmControlChannel(std::move(segment), boot.rank(), world_ranks,
                                   options.peer_timeout_s, defer_s));
  return Status::OK();
}

std::unique_ptr<Transport> MakeShmTransport(std::unique_ptr<Transport> inner,
                                            const ShmOptions& options) {
  return std::make_unique<ShmTransport>(std::move(inner), options);
}

}  // namespace shm
}  // namespace hvdc
