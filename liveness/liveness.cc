#include "liveness/liveness.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "rendezvous/store.h"
#include "tcp_controller/tcp_identity.h"
#include "tcp_controller/tcp_mesh.h"

namespace hvdc {
namespace liveness {
namespace {

constexpr const char* kHint =
    "set HOROVOD_GLOO_IFACE to an interface every host can reach, or HOROVOD_MPI_LIVENESS=0 to "
    "run without the liveness side channel";

bool IsLoopbackV4(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

std::string V4String(const in_addr& a) {
  char text[INET_ADDRSTRLEN] = {};
  return inet_ntop(AF_INET, &a, text, sizeof(text)) ? text : "";
}

// The first non-loopback IPv4 address the host name resolves to, or "".
std::string HostNameAddress() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &list) != 0) return "";
  std::string found;
  for (addrinfo* a = list; a != nullptr && found.empty(); a = a->ai_next) {
    const in_addr addr = reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr;
    if (!IsLoopbackV4(addr)) found = V4String(addr);
  }
  freeaddrinfo(list);
  return found;
}

// The first IPv4 address of an interface that is up and not loopback, or "".
std::string FirstInterfaceAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
    const in_addr addr = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    if (!IsLoopbackV4(addr)) found = V4String(addr);
  }
  freeifaddrs(list);
  return found;
}

// The rendezvous Store of the mesh, answered by one allgather over the watched world:
// Set("rank_<r>", "host:port") gathers every rank's entry; a rank that could not listen joins with
// an empty one (Abstain()).
class AllgatherStore : public rendezvous::Store {
 public:
  static constexpr int kEntryBytes = 256;

  AllgatherStore(WorldCollectives* world, int rank, int size, std::string address)
      : world_(world), rank_(rank), size_(size), address_(std::move(address)) {}

  Status Set(const std::string& key, const std::string& value) override {
    if (key != fmt::format("rank_{}", rank_) || value.empty() ||
        value.size() >= static_cast<size_t>(kEntryBytes)) {
      return Status::InvalidArgument(fmt::format(
          "MPI liveness side channel: cannot publish {}='{}' (only this rank's entry, under {} "
          "bytes)",
          key, value, kEntryBytes));
    }
    HVDC_RETURN_IF_ERROR(Gather(value));
    std::vector<int> silent;
    for (int q = 0; q < size_; ++q) {
      if (values_[fmt::format("rank_{}", q)].empty()) silent.push_back(q);
    }
    if (!silent.empty()) {
      return Status::UnknownError(fmt::format(
          "MPI liveness side channel: ranks [{}] could not listen for it (see their errors); {}",
          fmt::join(silent, ", "), kHint));
    }
    return Status::OK();
  }

  Status Get(const std::string& key, std::string* value, bool* found) override {
    auto it = values_.find(key);
    *found = it != values_.end() && !it->second.empty();
    if (*found) *value = it->second;
    return Status::OK();
  }

  std::string Describe() const override { return "MPI_Allgather of the liveness addresses"; }
  std::string LocalAddress() const override { return address_; }

  // Joins the collective with an empty entry if Set never did (this rank failed before it).
  Status Abstain() { return gathered_ ? Status::OK() : Gather(""); }

 private:
  Status Gather(const std::string& value) {
    gathered_ = true;
    std::vector<char> mine(kEntryBytes, '\0'), all(static_cast<size_t>(kEntryBytes) * size_);
    std::memcpy(mine.data(), value.data(), value.size());
    HVDC_RETURN_IF_ERROR(world_->Allgather(mine.data(), kEntryBytes, all.data(), ""));
    for (int q = 0; q < size_; ++q) {
      const char* entry = all.data() + static_cast<size_t>(q) * kEntryBytes;
      values_[fmt::format("rank_{}", q)] = std::string(entry, strnlen(entry, kEntryBytes));
    }
    return Status::OK();
  }

  WorldCollectives* const world_;
  const int rank_, size_;
  const std::string address_;
  bool gathered_ = false;
  std::map<std::string, std::string> values_;
};

// "TCP transport: rank 1 (h:p) closed ..." -> "MPI liveness side channel: rank 1 (h:p) closed ...".
Status Relabel(const Status& lost) {
  std::string message = lost.message();
  const std::string prefix = "TCP transport: ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  return Status::UnknownError(
      fmt::format("MPI liveness side channel (HOROVOD_MPI_LIVENESS): {}", message));
}

// The side channel: the mesh, relabelling its losses as the liveness side channel's.
class Liveness : public PeerWatch {
 public:
  Liveness(std::shared_ptr<tcp::Mesh> mesh, std::string description)
      : mesh_(std::move(mesh)), description_(std::move(description)) {}
  ~Liveness() override { Close(); }
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  void SetPeerLostHandler(Transport::PeerLostHandler handler) override {
    if (!handler) {
      mesh_->SetPeerLostHandler(nullptr);
      return;
    }
    mesh_->SetPeerLostHandler(
        [handler = std::move(handler)](const Status& lost) { handler(Relabel(lost)); });
  }

  void Close() override { mesh_->Close(); }
  const std::string& description() const override { return description_; }

 private:
  std::shared_ptr<tcp::Mesh> mesh_;
  const std::string description_;
};

}  // namespace

Status LivenessAddress(const Config& config, bool single_host, std::string* address) {
  address->clear();
  if (!config.gloo_iface.empty()) {
    // Like the TCP transport: the first interface of the (comma-separated) list with an address.
    Status first;
    size_t start = 0;
    while (start <= config.gloo_iface.size()) {
      size_t comma = config.gloo_iface.find(',', start);
      if (comma == std::string::npos) comma = config.gloo_iface.size();
      std::string name = config.gloo_iface.substr(start, comma - start);
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      start = comma + 1;
      Status s = tcp::InterfaceAddress(name, address);
      if (s.ok()) return Status::OK();
      if (first.ok()) first = s;
    }
    return Status::InvalidArgument(
        fmt::format("MPI liveness side channel: {} (or HOROVOD_MPI_LIVENESS=0 to run without it)",
                    first.message()));
  }
  if (single_host) {
    *address = "127.0.0.1";
    return Status::OK();
  }
  *address = HostNameAddress();
  if (address->empty()) *address = FirstInterfaceAddress();
  if (address->empty()) {
    return Status::InvalidArgument(fmt::format(
        "MPI liveness side channel: this host has no IPv4 address other hosts could reach (its "
        "name resolves to none, and no interface but loopback has one); {}",
        kHint));
  }
  return Status::OK();
}

Status Start(const Config& config, const Topology& topology, WorldCollectives* world,
             std::unique_ptr<PeerWatch>* out) {
  out->reset();
  // A token of this job's, so a stray connection from another job is refused.
  uint64_t token = 0;
  if (topology.rank == 0) {
    std::random_device rd;
    token = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  HVDC_RETURN_IF_ERROR(world->Broadcast(&token, sizeof(token), 0, "liveness token"));

  std::string address;
  Status s = LivenessAddress(config, topology.local_size == topology.size, &address);
  AllgatherStore store(world, topology.rank, topology.size, address);
  std::shared_ptr<tcp::Mesh> mesh;
  if (s.ok()) {
    tcp::MeshOptions options;
    options.rank = topology.rank;
    options.size = topology.size;
    options.store = &store;
    options.bind_host = address;
    options.job_token = token;
    options.timeout = std::chrono::seconds(config.gloo_timeout_s);
    options.peer_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.peer_timeout_s * 1000.0));
    options.source = "MPI liveness side channel";
    s = tcp::Mesh::Create(options, &mesh);
  }
  if (!s.ok()) HVDC_RETURN_IF_ERROR(store.Abstain());

  // Every rank agrees whether the mesh is complete: one that failed must not leave the others
  // running with a partial mesh (or stuck in the next MPI call).
  int ok = s.ok() ? 1 : 0;
  std::vector<int> oks(topology.size, 0);
  HVDC_RETURN_IF_ERROR(world->Allgather(&ok, sizeof(ok), oks.data(), "liveness set-up"));
  std::vector<int> failed;
  for (int q = 0; q < topology.size; ++q) {
    if (!oks[q]) failed.push_back(q);
  }
  if (!s.ok()) return s;
  if (!failed.empty()) {
    return Status::UnknownError(
        fmt::format("MPI liveness side channel: ranks [{}] could not set it up (see their "
                    "errors); {}",
                    fmt::join(failed, ", "), kHint));
  }
  *out = std::make_unique<Liveness>(
      std::move(mesh), fmt::format("rank {} at {}, heartbeat timeout {:g} s", topology.rank,
                                   address, config.peer_timeout_s));
  return Status::OK();
}

}  // namespace liveness
}  // namespace hvdc
