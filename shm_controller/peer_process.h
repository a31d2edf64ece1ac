// Whether a peer rank's process can still take part, seen from another process of the same host:
// the shared-memory plane and control channel ask this while they wait for a peer, so that a rank
// that has exited (or been killed) fails the wait at once and one stopped (SIGSTOP, a debugger)
// fails it after the peer timeout, instead of a hang.
#pragma once

#include <cstdint>

namespace hvdc {
namespace shm {

enum class ProcessLiveness { kRunning, kStopped, kExited };

// From kill(pid, 0) and the state letter in /proc/<pid>/stat (a zombie counts as exited).
ProcessLiveness LivenessOf(int pid);

// Tracks how long one peer has been seen stopped.
class StopClock {
 public:
  // Seen `liveness` at monotonic time now_ns: true once it has been stopped, without a running
  // sighting in between, for more than limit_s (<= 0: never).
  bool StoppedTooLong(ProcessLiveness liveness, int64_t now_ns, double limit_s);

 private:
  int64_t since_ns_ = 0;  // when first seen stopped, or 0
};

int64_t MonotonicNs();

}  // namespace shm
}  // namespace hvdc
