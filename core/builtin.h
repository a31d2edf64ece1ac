// What a build contains: the backends, and the transports in the order they are tried. core/
// declares the hook; builtins/builtins.cc (the hvdc_builtins library, linked into libhvdc_core and
// the tests) defines it, so core/ never names a transport, MPI or NCCL.
#pragma once

#include <functional>
#include <memory>
#include <string>
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

// What the Horovod API reports about the transport in use: mpi_enabled() for kMpi, gloo_enabled()
// for kTcp (Horovod's Gloo), and mpi_threads_supported() only means something for kMpi.
enum class TransportKind { kMpi, kTcp, kLocal };

struct TransportEntry {
  TransportKind kind = TransportKind::kLocal;
  // What init() names when the entry is recognised but not built: "this build has no <what>".
  std::string what;
  // Whether this process's environment (Config) and init()'s arguments ask for this transport.
  std::function<bool(const Config&, const InitOptions&)> recognises;
  // Makes it; null when this build does not have it.
  std::function<Status(const Config&, const InitOptions&, std::unique_ptr<Transport>*)> make;
};

struct Builtins {
  std::vector<std::unique_ptr<Backend>> backends;
  // In order of precedence: init() makes the first entry that recognises its environment (the
  // last entry recognises every environment).
  std::vector<TransportEntry> transports;
  bool cuda_built = false;

  // mpi_built(), gloo_built(): whether a transport of this kind can be made.
  bool Built(TransportKind kind) const {
    for (const TransportEntry& t : transports) {
      if (t.kind == kind && t.make) return true;
    }
    return false;
  }
};

void RegisterBuiltins(Builtins* out);

}  // namespace hvdc
