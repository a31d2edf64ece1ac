// One checked allreduce through the C API, for the suites whose ranks are processes that may lose a
// peer (tcp_peer_loss_test, mpi_liveness_test): it waits for the callback and reports its code and
// message, or -100 when a value is wrong. After a failure the runtime may still hold the request
// and a stuck executor thread may still touch the buffers, so those are kept (leaked on purpose).
#pragma once

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/c_api.h"

namespace hvdc {
namespace checked_step {

constexpr int kWrongValue = -100;

struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  int code = -1;
  std::string message;
};

// Prints "DOUBLE callback" if it runs twice for one request (the drivers look for it).
inline void Done(void* user, int code, const char* message) {
  auto* p = static_cast<Pending*>(user);
  std::lock_guard<std::mutex> lock(p->mu);
  if (++p->calls > 1) {
    std::printf("DOUBLE callback\n");
    std::fflush(stdout);
  }
  p->code = code;
  p->message = message ? message : "";
  p->cv.notify_all();
}

// Allreduces n floats (rank + 1) * (i % period) + step named `<prefix><step>` and checks the sum
// over `size` ranks.
inline int Step(const std::string& prefix, int n, int period, int rank, int size, int step,
                std::string* message) {
  std::vector<float> in(n), out(n, 0.f);
  for (int i = 0; i < n; ++i) in[i] = static_cast<float>((rank + 1) * (i % period) + step);
  hvdc_request req = {};
  req.op = HVDC_OP_ALLREDUCE;
  const std::string name = prefix + std::to_string(step);
  req.name = name.c_str();
  req.input.dtype = HVDC_FLOAT32;
  req.input.ndim = 1;
  req.input.dims[0] = n;
  req.input.device = -1;
  req.input.data = in.data();
  req.output = req.input;
  req.output.data = out.data();
  req.reduce_op = HVDC_SUM;
  auto* pending = new Pending;
  const int rc = hvdc_enqueue(&req, 1, Done, pending);
  if (rc != HVDC_OK) {
    *message = hvdc_last_error();
    return rc;
  }
  std::unique_lock<std::mutex> lock(pending->mu);
  pending->cv.wait(lock, [&] { return pending->calls > 0; });
  *message = pending->message;
  if (pending->code != HVDC_OK) {
    (void)new std::vector<float>(std::move(in));
    (void)new std::vector<float>(std::move(out));
    return pending->code;
  }
  int ranks_sum = 0;
  for (int r = 0; r < size; ++r) ranks_sum += r + 1;
  for (int i = 0; i < n; ++i) {
    if (out[i] != static_cast<float>(ranks_sum * (i % period) + size * step)) {
      *message = "wrong value at " + std::to_string(i);
      return kWrongValue;
    }
  }
  return HVDC_OK;
}

}  // namespace checked_step
}  // namespace hvdc
