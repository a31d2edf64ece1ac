#include "bench/tcp_world.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace bench {
namespace {

constexpr int kAddrLen = 64;  // INET6_ADDRSTRLEN (46) and a port fit

// The first IPv4 address of interface `iface`, else its first IPv6 one; "" if it has none.
std::string InterfaceAddress(const std::string& iface) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string v4, v6;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || iface != a->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      v4 = buf;
    } else if (a->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* s6 = reinterpret_cast<sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) continue;  // would need a scope id
      inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof buf);
      v6 = buf;
    }
  }
  freeifaddrs(list);
  return v4.empty() ? v6 : v4;
}

// A socket bound to (address, an ephemeral port) with SO_REUSEADDR, not listening; -1 on error.
int ReservePort(const Context& ctx, const std::string& address, int* port) {
  sockaddr_storage ss;
  std::memset(&ss, 0, sizeof ss);
  socklen_t len = 0;
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, address.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    len = sizeof *s4;
  } else if (inet_pton(AF_INET6, address.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    len = sizeof *s6;
  } else {
    Fail(ctx, "--tcp-address '%s' is not an IP address", address.c_str());
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Fail(ctx, "socket(): %s", std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    Fail(ctx, "cannot bind a port on %s: %s", address.c_str(), std::strerror(errno));
  }
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    Fail(ctx, "getsockname(): %s", std::strerror(errno));
  }
  *port = ntohs(ss.ss_family == AF_INET ? s4->sin_port : s6->sin6_port);
  return fd;
}

}  // namespace

int SetUpTcpWorld(Context& ctx) {
  const Options& o = *ctx.opts;
  std::string address = o.Str("tcp-address", "");
  const std::string iface = o.Str("tcp-iface", "");
  if (address.empty() && !iface.empty()) {
    address = InterfaceAddress(iface);
    if (address.empty())
      Fail(ctx, "--tcp-iface %s: no such interface with an IP address", iface.c_str());
    setenv("HOROVOD_GLOO_IFACE", iface.c_str(), 1);
  }
  if (address.empty()) address = "127.0.0.1";
  int port = 0;
  int fd = ReservePort(ctx, address, &port);

  std::string mine = address.find(':') != std::string::npos ? "[" + address + "]" : address;
  mine += ":" + std::to_string(port);
  char entry[kAddrLen] = {0};
  std::strncpy(entry, mine.c_str(), kAddrLen - 1);
  std::vector<char> all(size_t(kAddrLen) * size_t(ctx.size));
  MPI_Allgather(entry, kAddrLen, MPI_CHAR, all.data(), kAddrLen, MPI_CHAR, ctx.comm);
  std::string peers;
  for (int r = 0; r < ctx.size; ++r) {
    if (r) peers += ",";
    peers += std::string(&all[size_t(r) * kAddrLen]);
  }
  setenv("HOROVOD_CONTROLLER", "gloo", 1);
  setenv("HVDC_TCP_PEERS", peers.c_str(), 1);
  setenv("HOROVOD_RANK", std::to_string(ctx.rank).c_str(), 1);
  setenv("HOROVOD_SIZE", std::to_string(ctx.size).c_str(), 1);
  ctx.transport = "tcp";
  ctx.tcp_peers = peers;
  return fd;
}

void ReleaseTcpPort(int fd) {
  if (fd >= 0) close(fd);
}

std::string RawMpiTransport() {
  std::string out;
  for (const char* name : {"pml", "btl", "btl_tcp_if_include", "btl_tcp_if_exclude"}) {
    const char* v = std::getenv((std::string("OMPI_MCA_") + name).c_str());
    if (!v) continue;
    if (!out.empty()) out += " ";
    out += std::string(name) + "=" + v;
  }
  return out.empty() ? "Open MPI defaults" : out;
}

}  // namespace bench
