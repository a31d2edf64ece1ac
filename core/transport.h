// Transport: where ranks come from and how a process set gets its channels. One per Runtime.
// Each transport lives in its own folder -- mpi_controller/ (MPI), tcp_controller/ (TCP, Horovod's
// Gloo), local_controller/ (the in-memory world: the no-launcher rank 0 of 1 and threads-as-ranks)
// -- and is listed, with how it recognises its launch environment and how it is made, at the
// composition root (builtins/builtins.cc), which also wraps the MPI and TCP transports in
// shm_controller/'s, so that process sets on one host move their data through shared memory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/control_channel.h"
#include "core/host_comm.h"
#include "core/status.h"

namespace hvdc {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool homogeneous = true;
};

struct ProcessSetChannels {
  std::unique_ptr<ControlChannel> control;
  std::unique_ptr<HostComm> data;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const Topology& topology() const = 0;
  // "mpi", "gloo", "local": for logs and tests (init() chooses by the builtins list, never by
  // name).
  virtual const char* name() const = 0;
  // True when control and execution may run on separate threads (MPI_THREAD_MULTIPLE).
  virtual bool threads_supported() const = 0;
  // Collective over the whole world, called in the same order on every rank: creates the channels
  // for the set of (sorted, distinct) world ranks. Ranks outside the set get null channels.
  virtual Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) = 0;
  // Collective over the world: every rank passes a value; *all_equal says whether they agree.
  virtual Status CheckAgreement(uint64_t value, bool* all_equal) = 0;
  // Failure detection. A transport that can tell that a peer rank is lost (its connection closed
  // or reset without an orderly goodbye) calls the handler once per lost peer, from any thread,
  // with an error naming the rank and its host. Setting a null handler stops the calls: once it
  // returns, no call is running or will start. Transports that cannot detect loss ignore it.
  using PeerLostHandler = std::function<void(const Status& lost)>;
  virtual void SetPeerLostHandler(PeerLostHandler handler) { (void)handler; }
  // True when, once the handler has been called, every blocked and later operation of every
  // channel fails promptly (the TCP mesh's end_on_loss): a thread blocked in one then returns, so
  // shutdown after a loss can wait for it and free everything. False: a dead peer may block an
  // operation for good (MPI).
  virtual bool loss_ends_every_wait() const { return false; }
  // Releases MPI (managed mode) or nothing; called once after every thread has stopped.
  virtual void Finalize() = 0;
};

}  // namespace hvdc
