// Shared pieces of the benchmarks: options, statistics, a tiny JSON tree, timing across ranks,
// /proc readers (RSS, per-thread CPU time), tensor sets, and waiting for runtime callbacks.
#ifndef HVDC_BENCH_COMMON_H_
#define HVDC_BENCH_COMMON_H_

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only; Open MPI's C++ bindings do not build warning-free
#endif
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/c_api.h"

namespace bench {

constexpr int64_t KiB = 1024;
constexpr int64_t MiB = 1024 * 1024;

// ---------------------------------------------------------------- options

// "--key value", "--key=value" and bare "--flag" (value "1").
class Options {
 public:
  Options(int argc, char** argv);
  bool Has(const std::string& key) const { return values_.count(key) != 0; }
  std::string Str(const std::string& key, const std::string& def) const;
  int64_t Int(const std::string& key, int64_t def) const;  // accepts 4K, 16M, 1G suffixes
  double Double(const std::string& key, double def) const;
  std::vector<std::string> List(const std::string& key, const std::string& def) const;

 private:
  std::map<std::string, std::string> values_;
};

int64_t ParseBytes(const std::string& s);  // "256K", "4M", "1G", "123"
std::string FormatBytes(double bytes);     // "4 B", "1 KiB", "97.6 MiB"

// ---------------------------------------------------------------- statistics

struct Stats {
  size_t n = 0;
  double min = 0, max = 0, mean = 0, stddev = 0, p50 = 0, p90 = 0, p99 = 0;
};
Stats ComputeStats(std::vector<double> v);

// ---------------------------------------------------------------- JSON

class Json {
 public:
  Json() : kind_(kNull) {}
  Json(double v) : kind_(kNumber), num_(v) {}                  // NOLINT(runtime/explicit)
  Json(int v) : kind_(kNumber), num_(v) {}                     // NOLINT
  Json(int64_t v) : kind_(kNumber), num_(double(v)) {}         // NOLINT
  Json(size_t v) : kind_(kNumber), num_(double(v)) {}          // NOLINT
  Json(bool v) : kind_(kBool), bool_(v) {}                     // NOLINT
  Json(const char* v) : kind_(kString), str_(v) {}             // NOLINT
  Json(std::string v) : kind_(kString), str_(std::move(v)) {}  // NOLINT
  static Json Object() {
    Json j;
    j.kind_ = kObject;
    return j;
  }
  static Json Array() {
    Json j;
    j.kind_ = kArray;
    return j;
  }
  static Json FromStats(const Stats& s, double scale = 1.0);  // scale: e.g. 1e6 for µs

  Json& Set(const std::string& key, Json v);  // object; returns *this for chaining
  Json& Push(Json v);                         // array
  std::string Dump(int indent = 0) const;

 private:
  enum Kind { kNull, kNumber, kBool, kString, kObject, kArray };
  void DumpTo(std::string* out, int indent, int depth) const;
  Kind kind_;
  double num_ = 0;
  bool bool_ = false;
  std::string str_;
  std::vector<std::pair<std::string, Json>> obj_;
  std::vector<Json> arr_;
};

// ---------------------------------------------------------------- the run's context

// Everything a benchmark needs about the job; built once in main.
struct Context {
  MPI_Comm comm = MPI_COMM_NULL;  // the benchmark's own duplicate of MPI_COMM_WORLD (raw reference,
                                  // barriers, result reductions); the runtime never sees it
  int rank = 0;
  int size = 1;
  int cores = 1;                        // online CPUs on this host
  int cpus_allowed = 1;                 // CPUs in this rank's affinity mask (1 = bound to a core)
  bool oversubscribed = false;          // size > cores
  std::string name;                     // benchmark name ("b1", ...)
  std::set<int> pre_runtime_tids;       // threads that existed before hvdc_init (main + MPI's own)
  int64_t rss_after_mpi_init_kib = 0;   // VmRSS just before hvdc_init
  int64_t rss_after_hvdc_init_kib = 0;  // VmRSS just after it
  double init_seconds = 0;              // hvdc_init's wall time on this rank
  std::string transport = "mpi";        // the runtime's transport: "mpi" or "tcp" (--transport)
  std::string tcp_peers;                // HVDC_TCP_PEERS the ranks agreed on (--transport tcp)
  Options* opts = nullptr;

  bool root() const { return rank == 0; }
  double BusFactor() const { return size > 1 ? 2.0 * (size - 1) / size : 1.0; }
};

// Prints on rank 0 only (printf-style).
void Log(const Context& ctx, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Prints the message on every rank that calls it, then aborts the job with `code`.
[[noreturn]] void Fail(const Context& ctx, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Collective over ctx.comm: element-wise max over ranks of per-rank samples, returned on every
// rank.
std::vector<double> MaxOverRanks(const Context& ctx, const std::vector<double>& local);
double MaxOverRanks(const Context& ctx, double local);
double SumOverRanks(const Context& ctx, double local);
// Collective: true on every rank iff `ok` on every rank.
bool AllOk(const Context& ctx, bool ok);

// Fills the standard header of a result file (benchmark, np, date, host, binding ...).
Json ResultHeader(const Context& ctx);
// Writes `result` to --out (default bench/results/<name>-np<N>.json) on rank 0.
void WriteResult(const Context& ctx, const Json& result);

// ---------------------------------------------------------------- /proc readers

int64_t ReadStatusKiB(const char* field);  // e.g. "VmHWM:", "VmRSS:"; -1 if absent
bool ResetPeakRss();                       // writes 5 to /proc/self/clear_refs
std::set<int> ThreadIds();
// CPU time (user+system, seconds) of thread `tid` of this process; -1 if it is gone.
double ThreadCpuSeconds(int tid);

// CPU accounting for the runtime's threads: everything except the main thread and the threads that
// existed before hvdc_init. Exited threads are still counted (through RUSAGE_SELF). Call Sample()
// from the main thread.
class RuntimeCpu {
 public:
  explicit RuntimeCpu(const Context& ctx) : ctx_(ctx) {}
  struct Sample {
    double process_minus_main = 0;  // s: RUSAGE_SELF - RUSAGE_THREAD(main)
    double pre_existing = 0;        // s: threads alive before hvdc_init, except main (MPI's own)
    double runtime() const { return process_minus_main - pre_existing; }
  };
  Sample Take() const;

 private:
  const Context& ctx_;
};

// One line per live thread: tid, name (comm), CPU seconds. For diagnostics in B4i.
struct ThreadInfo {
  int tid;
  std::string name;
  double cpu_s;
  bool pre_existing;
};
std::vector<ThreadInfo> ListThreads(const Context& ctx);

// ---------------------------------------------------------------- tensor sets

struct TensorSet {
  std::string name;               // file stem, e.g. "resnet50_keras"
  std::vector<int64_t> elements;  // fp32 element counts, in enqueue (backward) order
  int64_t total_elements() const;
  int64_t total_bytes() const { return total_elements() * 4; }
};
// Reads a tensor list ("# comment" lines, then one element count per line). `spec` is a path, or
// a bare name looked up in --tensor-dir (default: the directory holding the tensor lists next to
// the binary's sources, then bench/tensor_sets, then ../shared/bench/tensor_sets).
TensorSet LoadTensorSet(const Context& ctx, const std::string& spec);
TensorSet UniformSet(const std::string& name, int count, int64_t elements);

// Page-aligned, touched fp32 buffers, one per tensor (as a framework allocates them).
class Buffers {
 public:
  explicit Buffers(const TensorSet& set);
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  size_t count() const { return ptrs_.size(); }
  float* data(size_t i) const { return ptrs_[i]; }
  int64_t elements(size_t i) const { return elems_[i]; }
  int64_t total_bytes() const;

 private:
  std::vector<float*> ptrs_;
  std::vector<int64_t> elems_;
};
// Page-aligned, touched anonymous mappings (so freeing really returns the memory, which B6 relies
// on when it measures two sets in one process).
float* AllocFloats(int64_t n);
void FreeFloats(float* p, int64_t n);

// Closed-form test data: value(rank, tensor, j) is a small integer, so sums are exact in fp32.
void FillPattern(float* p, int64_t n, int rank, int64_t tensor_index);
// Checks p against the reduction of FillPattern over `size` ranks; returns the number of wrong
// elements (and describes the first in *first_error).
int64_t CheckPattern(const float* p, int64_t n, int size, int64_t tensor_index, int reduce_op,
                     std::string* first_error);

// Busy-waits (no syscalls) until MPI_Wtime() >= t.
void SpinUntil(double t);
// Sleeps until MPI_Wtime() >= t.
void SleepUntil(double t);

// ---------------------------------------------------------------- targets

// A BENCHMARKS.md target of the form "value <= limit". `text` reads e.g.
// "1.23 <= 1.10: MISSED by 11.8%" and goes into the table and the JSON.
struct Target {
  std::string what;
  double value = 0;
  double limit = 0;
  bool met = false;
  std::string text;
  Json ToJson() const;
};
Target AtMost(const std::string& what, double value, double limit, const char* unit = "");

// ---------------------------------------------------------------- timing

// One thing to time. `step` runs between a barrier and the clock stop; `before`/`after` run outside
// the timed region (for CPU accounting or re-filling data).
struct Variant {
  std::string name;
  std::function<void()> step;
  std::function<void()> before;
  std::function<void()> after;
};

// Runs `warmup` untimed then `steps` timed rounds; each round runs every variant once, in an order
// rotated per round (so none always runs on a cache warmed or cooled by the same neighbour). Each
// step starts after a barrier on ctx.comm; the result holds, per variant, the per-step time in
// seconds, max over ranks.
std::vector<std::vector<double>> TimeInterleaved(const Context& ctx,
                                                 const std::vector<Variant>& variants, int warmup,
                                                 int steps);

}  // namespace bench

#endif  // HVDC_BENCH_COMMON_H_
