// What a build contains: the backends and transports compiled in. core/ declares the hook;
// builtins/builtins.cc (linked into libhvdc_core and the tests) defines it, so core/ never
// names MPI or NCCL.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/config.h"
#include "core/transport.h"

namespace hvdc {

struct InitOptions {
  std::vector<int> ranks;                      // subset of world ranks, or empty
  void* mpi_comm = nullptr;                    // borrowed MPI_Comm*, or null
  std::vector<std::vector<int>> process_sets;  // registered at init besides the global set
};

struct Builtins {
  std::vector<std::unique_ptr<Backend>> backends;
  // Null when MPI was not built.
  std::function<Status(const Config&, const InitOptions&, std::unique_ptr<Transport>*)>
      mpi_transport;
  // The TCP ("gloo") transport, ranks from HVDC_TCP_PEERS or the Gloo rendezvous variables.
  std::function<Status(const Config&, std::unique_ptr<Transport>*)> tcp_transport;
  // Rank 0 of 1, no launcher.
  std::function<std::unique_ptr<Transport>()> single_transport;
  bool mpi_built = false;
  bool gloo_built = false;
  bool cuda_built = false;
};

void RegisterBuiltins(Builtins* out);

}  // namespace hvdc
