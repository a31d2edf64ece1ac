#include "tcp_controller/tcp_identity.h"

#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "core/logging.h"
#include "tcp_controller/tcp_mesh.h"
#include "tcp_controller/tcp_wire.h"

namespace hvdc {
namespace tcp {
namespace {

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool IsNumericAddress(const std::string& text) {
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* result = nullptr;
  if (getaddrinfo(text.c_str(), nullptr, &hints, &result) != 0) return false;
  freeaddrinfo(result);
  return true;
}

}  // namespace

bool IsLocalAddress(const std::string& address) {
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(address.c_str(), "0", &hints, &result) != 0) return false;
  bool local = false;
  const int fd = ::socket(result->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0) {
    local = ::bind(fd, result->ai_addr, result->ai_addrlen) == 0;
    ::close(fd);
  }
  freeaddrinfo(result);
  return local;
}

std::string StaticBindAddress(const std::string& own_host, std::string* note) {
  if (IsNumericAddress(own_host)) {
    if (IsLocalAddress(own_host)) return own_host;
    *note = fmt::format("its entry's address {} is not an address of this machine (behind NAT?)",
                        own_host);
    return "";
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(own_host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    *note = fmt::format("its entry's host '{}' does not resolve ({})", own_host, gai_strerror(rc));
    return "";
  }
  std::string found, tried;
  for (addrinfo* a = result; a != nullptr && found.empty(); a = a->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    if (IsLocalAddress(host)) {
      found = host;
    } else {
      tried += (tried.empty() ? "" : ", ") + std::string(host);
    }
  }
  freeaddrinfo(result);
  if (found.empty()) {
    *note = fmt::format("its entry's host '{}' resolves to no address of this machine ({})",
                        own_host, tried);
  }
  return found;
}

Status InterfaceAddress(const std::string& name, std::string* address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return Status::UnknownError("HOROVOD_GLOO_IFACE: cannot list the network interfaces");
  }
  std::string v4, v6;
  std::vector<std::string> names;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    names.push_back(a->ifa_name);
    if (name != a->ifa_name) continue;
    char host[NI_MAXHOST];
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(a->ifa_addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    std::string h = host;
    const size_t pct = h.find('%');  // a link-local scope suffix
    if (family == AF_INET && v4.empty()) v4 = h;
    if (family == AF_INET6 && v6.empty() && pct == std::string::npos) v6 = h;
  }
  freeifaddrs(list);
  *address = !v4.empty() ? v4 : v6;
  if (address->empty()) {
    std::string known;
    for (const auto& n : names) {
      if (known.find(n + ",") == std::string::npos) known += n + ",";
    }
    if (!known.empty()) known.pop_back();
    return Status::InvalidArgument(fmt::format(
        "HOROVOD_GLOO_IFACE='{}': no such network interface with an IP address (this host has: {})",
        name, known));
  }
  return Status::OK();
}

namespace {

// ", set by horovodrun --gloo" when a launcher set the variables, for messages naming them.
std::string SetBy(const Config& c) {
  return c.tcp_address_origin.empty() || c.tcp_address_origin == "TF_CONFIG"
             ? ""
             : fmt::format(", set by {}", c.tcp_address_origin);
}

}  // namespace

Status IdentityFromConfig(const Config& c, Identity* out) {
  Identity id;
  const auto& g = c.gloo;
  if (!c.tcp_peers.empty()) {
    // A TF_CONFIG cluster reaches us as HVDC_TCP_PEERS: errors name TF_CONFIG, which the user set.
    id.peers_origin = c.tcp_address_origin == "TF_CONFIG" ? "TF_CONFIG" : "HVDC_TCP_PEERS";
    id.peers = SplitCommas(c.tcp_peers);
    for (size_t i = 0; i < id.peers.size(); ++i) {
      std::string host;
      int port = 0;
      HVDC_RETURN_IF_ERROR(
          ParseHostPort(id.peers[i], fmt::format("{} entry {}", id.peers_origin, i), &host, &port));
      if (port == 0) {
        return Status::InvalidArgument(
            fmt::format("{} entry {} ('{}'): every rank needs a fixed port, not 0", id.peers_origin,
                        i, id.peers[i]));
      }
    }
    id.size = static_cast<int>(id.peers.size());
    if (g.rank < 0) {
      return Status::InvalidArgument(
          "HVDC_TCP_PEERS is set but HOROVOD_RANK is not: every process needs its rank (its "
          "index in the list)");
    }
    if (g.size >= 0 && g.size != id.size) {
      return Status::InvalidArgument(
          fmt::format("HOROVOD_SIZE={} but HVDC_TCP_PEERS lists {} ranks", g.size, id.size));
    }
    id.job_token = JobToken("peers:" + c.tcp_peers);
  } else if (!g.rendezvous_addr.empty()) {
    if (g.rendezvous_port < 0) {
      return Status::InvalidArgument(fmt::format(
          "HOROVOD_GLOO_RENDEZVOUS_ADDR={} is set but HOROVOD_GLOO_RENDEZVOUS_PORT is not",
          g.rendezvous_addr));
    }
    if (g.rank < 0 || g.size < 0) {
      return Status::InvalidArgument(fmt::format(
          "HOROVOD_GLOO_RENDEZVOUS_ADDR is set but {} not: horovodrun --gloo sets both",
          g.rank < 0 && g.size < 0 ? "HOROVOD_RANK and HOROVOD_SIZE are"
                                   : (g.rank < 0 ? "HOROVOD_RANK is" : "HOROVOD_SIZE is")));
    }
    id.size = g.size;
    id.peers_origin =
        fmt::format("the rendezvous service at {}:{} (HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT{})",
                    g.rendezvous_addr, g.rendezvous_port, SetBy(c));
    id.bind_origin = fmt::format("the address this host reaches {} from", id.peers_origin);
    id.rendezvous_host = g.rendezvous_addr;
    id.rendezvous_port = g.rendezvous_port;
    // The scope too: a rank of another world on the same service (an elastic job's earlier round)
    // that reaches this one's ports is refused as a stray.
    id.job_token = JobToken(fmt::format("rendezvous:{}:{}:{}:{}", g.rendezvous_addr,
                                        g.rendezvous_port, g.size, c.tcp_rendezvous_scope));
  } else {
    return Status::InvalidArgument(
        "the TCP (gloo) transport needs either HVDC_TCP_PEERS (with HOROVOD_RANK) or "
        "HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT (with HOROVOD_RANK and HOROVOD_SIZE)");
  }
  id.rank = g.rank;
  if (id.rank >= id.size) {
    return Status::InvalidArgument(fmt::format(
        "HOROVOD_RANK={} is not below the world size {}{}", id.rank, id.size,
        id.peers.empty() ? " (HOROVOD_SIZE)" : fmt::format(" (entries of {})", id.peers_origin)));
  }
  if (!c.gloo_iface.empty()) {
    // Horovod's --network-interface may list several (eth0,eth1): the first that has an address.
    Status first;
    for (const std::string& name : SplitCommas(c.gloo_iface)) {
      Status s = InterfaceAddress(name, &id.bind_host);
      if (s.ok()) break;
      if (first.ok()) first = s;
    }
    if (id.bind_host.empty()) {
      return SetBy(c).empty() ? first
                              : Status::FromCode(first.code(), first.message() + SetBy(c) +
                                                                   " (--network-interface)");
    }
    id.bind_origin = fmt::format("the address of HOROVOD_GLOO_IFACE={}{}", c.gloo_iface,
                                 SetBy(c).empty() ? "" : SetBy(c) + " --network-interface");
  } else if (!c.tcp_bind_address.empty()) {
    if (!IsNumericAddress(c.tcp_bind_address)) {
      return Status::InvalidArgument(fmt::format(
          "HVDC_TCP_BIND_ADDRESS='{}' is not an IP address (0.0.0.0 or :: = every interface)",
          c.tcp_bind_address));
    }
    id.bind_host = c.tcp_bind_address;
    id.bind_origin = "HVDC_TCP_BIND_ADDRESS";
  } else if (!id.peers.empty()) {
    std::string own_host, note;
    int port = 0;
    HVDC_RETURN_IF_ERROR(ParseHostPort(
        id.peers[id.rank], fmt::format("{} entry {}", id.peers_origin, id.rank), &own_host, &port));
    id.bind_host = StaticBindAddress(own_host, &note);
    id.bind_origin = fmt::format("its {} entry '{}'", id.peers_origin, id.peers[id.rank]);
    if (id.bind_host.empty()) {
      LogWarning(
          "TCP transport: rank {} listens on every interface: {} ({}; set HOROVOD_GLOO_IFACE or "
          "HVDC_TCP_BIND_ADDRESS to choose)",
          id.rank, note, id.bind_origin);
    }
  }
  id.secret_key = c.secret_key;
  *out = std::move(id);
  return Status::OK();
}

Status BuildTopology(int rank, int size, const std::vector<std::string>& hosts, const Config& c,
                     Topology* out) {
  Topology t;
  t.rank = rank;
  t.size = size;
  // Derived: local = ranks on my host (in rank order); cross = ranks with my local rank.
  std::vector<int> local_rank(size, 0);
  std::map<std::string, int> per_host;
  for (int r = 0; r < size; ++r) {
    const std::string& h = r < static_cast<int>(hosts.size()) ? hosts[r] : std::string();
    local_rank[r] = per_host[h]++;
  }
  const std::string mine = rank < static_cast<int>(hosts.size()) ? hosts[rank] : std::string();
  t.local_rank = local_rank[rank];
  t.local_size = per_host[mine];
  t.cross_rank = 0;
  t.cross_size = 0;
  for (int r = 0; r < size; ++r) {
    if (local_rank[r] != t.local_rank) continue;
    if (r < rank) ++t.cross_rank;
    ++t.cross_size;
  }
  t.homogeneous = true;
  for (const auto& kv : per_host) t.homogeneous = t.homogeneous && kv.second == t.local_size;
  const auto& g = c.gloo;
  if (g.local_rank >= 0) t.local_rank = g.local_rank;
  if (g.local_size >= 0) t.local_size = g.local_size;
  if (g.cross_rank >= 0) t.cross_rank = g.cross_rank;
  if (g.cross_size >= 0) t.cross_size = g.cross_size;
  if (t.local_rank >= t.local_size || t.cross_rank >= t.cross_size || t.local_size > size ||
      t.cross_size > size) {
    return Status::InvalidArgument(fmt::format(
        "inconsistent topology for rank {} of {}: local rank {} of {} (HOROVOD_LOCAL_RANK/_SIZE), "
        "cross rank {} of {} (HOROVOD_CROSS_RANK/_SIZE)",
        rank, size, t.local_rank, t.local_size, t.cross_rank, t.cross_size));
  }
  *out = t;
  return Status::OK();
}

}  // namespace tcp
}  // namespace hvdc
