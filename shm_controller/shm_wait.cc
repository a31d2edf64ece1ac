#include "shm_controller/shm_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace hvdc {
namespace shm {
namespace {

// Not FUTEX_PRIVATE_FLAG: the word is shared across processes (and across separate mappings of
// one segment within a process).
void FutexWait(uint32_t* word, uint32_t seen, int64_t ns) {
  struct timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

void Publish(RankLine* line, uint32_t value) {
  // Sequentially consistent on both sides (here: counter then sleepers; the waiter: sleepers then
  // counter), so a waiter going to sleep and this store cannot miss each other.
  __atomic_store_n(&line->counter, value, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&line->sleepers, __ATOMIC_SEQ_CST) != 0) FutexWakeAll(&line->counter);
}

void WakeAll(RankLine* line) { FutexWakeAll(&line->counter); }

Status WaitReached(RankLine* line, uint32_t target, const std::function<Status()>& check) {
  for (int i = 0; i < kSpinRounds; ++i) {
    if (Reached(__atomic_load_n(&line->counter, __ATOMIC_ACQUIRE), target)) return Status::OK();
    CpuRelax();
  }
  for (int i = 0; i < kYieldRounds; ++i) {
    if (Reached(__atomic_load_n(&line->counter, __ATOMIC_ACQUIRE), target)) return Status::OK();
    sched_yield();
  }
  for (;;) {
    HVDC_RETURN_IF_ERROR(check());
    __atomic_add_fetch(&line->sleepers, 1, __ATOMIC_SEQ_CST);
    const uint32_t seen = __atomic_load_n(&line->counter, __ATOMIC_SEQ_CST);
    if (!Reached(seen, target)) FutexWait(&line->counter, seen, kSleepSliceNs);
    __atomic_sub_fetch(&line->sleepers, 1, __ATOMIC_SEQ_CST);
    if (Reached(__atomic_load_n(&line->counter, __ATOMIC_ACQUIRE), target)) return Status::OK();
  }
}

}  // namespace shm
}  // namespace hvdc
