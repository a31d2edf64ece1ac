#include "shm_controller/shm_transport.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <utility>

#include "core/logging.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_segment.h"

namespace hvdc {
namespace shm {
namespace {

constexpr int64_t kHostBytes = 256;  // host identities are compared on this many bytes

// The creator's verdict, broadcast to the members.
struct Offer {
  uint64_t job_id = 0;
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

class ShmTransport : public Transport {
 public:
  ShmTransport(std::unique_ptr<Transport> inner, ShmOptions options)
      : inner_(std::move(inner)), options_(std::move(options)) {}

  const Topology& topology() const override { return inner_->topology(); }
  const char* name() const override { return inner_->name(); }
  bool threads_supported() const override { return inner_->threads_supported(); }
  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    HVDC_RETURN_IF_ERROR(inner_->CreateProcessSet(world_ranks, out));
    if (!out->data) return Status::OK();
    std::unique_ptr<HostComm> plane;
    HVDC_RETURN_IF_ERROR(CreateShmHostComm(*out->data, world_ranks, options_, &plane));
    if (plane) out->data = std::move(plane);
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
  std::unique_ptr<Transport> inner_;
  const ShmOptions options_;
};

// Segments of one process: the index part of the name.
std::atomic<int> next_index{0};

}  // namespace

ShmOptions ShmOptions::FromConfig(const Config& config) {
  ShmOptions o;
  o.enabled = config.shm_enabled;
  o.bytes = config.shm_bytes;
  o.host = config.gloo.hostname.empty() ? LocalHostName() : config.gloo.hostname;
  o.peer_timeout_s = config.peer_timeout_s;
  return o;
}

Status CreateShmHostComm(HostComm& boot, const std::vector<int>& world_ranks,
                         const ShmOptions& options, std::unique_ptr<HostComm>* out) {
  out->reset();
  const int n = boot.size(), me = boot.rank();
  if (!options.enabled || n < 2) return Status::OK();

  // Same host on every member?
  std::vector<char> host(kHostBytes, 0), hosts(static_cast<size_t>(kHostBytes * n));
  std::memcpy(host.data(), options.host.data(),
              std::min<size_t>(options.host.size(), kHostBytes - 1));
  HVDC_RETURN_IF_ERROR(
      boot.Allgatherv(host.data(), kHostBytes, hosts.data(), std::vector<int64_t>(n, kHostBytes)));
  for (int q = 1; q < n; ++q) {
    if (std::memcmp(hosts.data(), hosts.data() + q * kHostBytes, kHostBytes) != 0) {
      return Status::OK();  // ranks on several hosts: the transport's data plane, as before
    }
  }

  // Member 0 creates the segment and says whether it could.
  const SegmentSpec spec{0, n, options.bytes};
  Offer offer;
  std::unique_ptr<Segment> segment;
  std::string name;
  Status made;
  if (me == 0) {
    offer.job_id = RandomJobId();
    offer.index = next_index.fetch_add(1);
    name = SegmentName(offer.job_id, offer.index);
    SegmentSpec mine = spec;
    mine.job_id = offer.job_id;
    made = Segment::Create(name, mine, &segment);
    offer.created = made.ok() ? 1 : 0;
  }
  HVDC_RETURN_IF_ERROR(boot.Broadcast(&offer, sizeof(offer), 0));
  if (me != 0 && offer.created) {
    name = SegmentName(offer.job_id, offer.index);
    SegmentSpec theirs = spec;
    theirs.job_id = offer.job_id;
    made = Segment::Attach(name, theirs, &segment);
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
          "rank {}: shared-memory data plane not used for a set of {} ranks ({}); the "
          "transport's own data plane carries it",
          world_ranks[me], n, made.message());
    }
    return Status::OK();
  }
  out->reset(new ShmHostComm(std::move(segment), me, world_ranks, options.peer_timeout_s));
  LogDebug("rank {}: shared-memory data plane for a set of {} ranks ({} bytes, {} per round)",
           world_ranks[me], n, options.bytes, static_cast<ShmHostComm*>(out->get())->slot_bytes());
  return Status::OK();
}

std::unique_ptr<Transport> MakeShmTransport(std::unique_ptr<Transport> inner,
                                            const ShmOptions& options) {
  return std::make_unique<ShmTransport>(std::move(inner), options);
}

}  // namespace shm
}  // namespace hvdc
