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
  // Where to listen: HOROVOD_GLOO_IFACE's address, else HVDC_TCP_BIND_ADDRESS, else (static
  // list) this rank's own entry when it is an address of this machine; empty = the mesh's default
  // (the store's local address; every interface for a static list whose entry is not local).
  std::string bind_host;
  // For start-up errors: what chose the listening address, in the user's terms ("its TF_CONFIG
  // entry 'h:p'", "HOROVOD_GLOO_IFACE=eth1, set by horovodrun --gloo --network-interface", ...).
  std::string bind_origin;
  // For start-up errors: where the peers' addresses come from ("TF_CONFIG", "HVDC_TCP_PEERS", "the
  // rendezvous service at h:p (HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT, set by horovodrun --gloo)").
  std::string peers_origin;
  uint64_t job_token = 0;  // tcp_wire.h: JobToken of the peer list / rendezvous service and size
  std::string secret_key;  // HOROVOD_SECRET_KEY (never logged)
};

// Validates and combines the variables (every error names the variable and its value).
Status IdentityFromConfig(const Config& config, Identity* out);

// The IPv4 (else IPv6) address of network interface `name`; InvalidArgument naming
// HOROVOD_GLOO_IFACE when there is none.
Status InterfaceAddress(const std::string& name, std::string* address);

// Where a rank of a static list whose entry names `own_host` listens: `own_host` itself when it
// is an address of this machine, else the first address it resolves to that is; "" (every
// interface) when none is, with *note saying why (for a warning).
std::string StaticBindAddress(const std::string& own_host, std::string* note);

// Whether `address` (numeric) is one of this machine's (a socket can bind to it).
bool IsLocalAddress(const std::string& address);

// rank/size given; local and cross ranks from the config where set, else from equal hosts.
Status BuildTopology(int rank, int size, const std::vector<std::string>& hosts,
                     const Config& config, Topology* out);

}  // namespace tcp
}  // namespace hvdc
