#include "shm_controller/peer_process.h"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>

namespace hvdc {
namespace shm {
namespace {

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...), or 0 when unreadable.
char ProcessState(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}

}  // namespace

ProcessLiveness LivenessOf(int pid) {
  const char state = ProcessState(pid);
  if ((kill(pid, 0) != 0 && errno == ESRCH) || state == 'Z' || state == 'X') {
    return ProcessLiveness::kExited;
  }
  return state == 'T' || state == 't' ? ProcessLiveness::kStopped : ProcessLiveness::kRunning;
}

bool StopClock::StoppedTooLong(ProcessLiveness liveness, int64_t now_ns, double limit_s) {
  if (liveness != ProcessLiveness::kStopped) {
    since_ns_ = 0;
    return false;
  }
  if (since_ns_ == 0) since_ns_ = now_ns;
  return limit_s > 0 && now_ns - since_ns_ > static_cast<int64_t>(limit_s * 1e9);
}

int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace shm
}  // namespace hvdc
