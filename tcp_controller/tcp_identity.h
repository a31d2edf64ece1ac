// From Config to what the mesh and the topology need: the rendezvous mode, the peer list, the
// address to bind, the job token, and the local/cross ranks (internal to tcp_controller/).
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"
#include "core/transport.h"

namespace hvdc {
namespace tcp {

struct Identity {
  int rank = 0;
  int size = 1;
  std::vector<std::string> peers;  // static list (HVDC_TCP_PEERS), or empty
  std::string rendezvous_host;     // rendezvous service, when peers is empty
  int rendezvous_port = 0;
  std::string bind_host;  // HOROVOD_GLOO_IFACE's address, or empty
  uint64_t job_token = 0;
};

// Validates and combines the variables (every error names the variable and its value).
Status IdentityFromConfig(const Config& config, Identity* out);

// The IPv4 (else IPv6) address of network interface `name`; InvalidArgument naming
// HOROVOD_GLOO_IFACE when there is none.
Status InterfaceAddress(const std::string& name, std::string* address);

// rank/size given; local and cross ranks from the config where set, else from equal hosts.
Status BuildTopology(int rank, int size, const std::vector<std::string>& hosts,
                     const Config& config, Topology* out);

}  // namespace tcp
}  // namespace hvdc
