#include "bench/common.h"

#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/tcp_world.h"

#ifndef HVDC_BENCH_TENSOR_DIR
#define HVDC_BENCH_TENSOR_DIR "bench/tensor_sets"
#endif

namespace bench {

// ---------------------------------------------------------------- options

Options::Options(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    a = a.substr(2);
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      values_[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      values_[a] = argv[++i];
    } else {
      values_[a] = "1";
    }
  }
}

std::string Options::Str(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  return it == values_.end() ? def : it->second;
}

int64_t Options::Int(const std::string& key, int64_t def) const {
  auto it = values_.find(key);
  return it == values_.end() ? def : ParseBytes(it->second);
}

double Options::Double(const std::string& key, double def) const {
  auto it = values_.find(key);
  return it == values_.end() ? def : std::atof(it->second.c_str());
}

std::vector<std::string> Options::List(const std::string& key, const std::string& def) const {
  std::vector<std::string> out;
  std::stringstream ss(Str(key, def));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int64_t ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  int64_t mult = 1;
  if (end && *end) {
    switch (*end) {
      case 'k':
      case 'K':
        mult = KiB;
        break;
      case 'm':
      case 'M':
        mult = MiB;
        break;
      case 'g':
      case 'G':
        mult = 1024 * MiB;
        break;
      default:
        break;
    }
  }
  return static_cast<int64_t>(v * double(mult));
}

std::string FormatBytes(double b) {
  char buf[64];
  if (b < KiB) {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  } else if (b < MiB) {
    std::snprintf(buf, sizeof buf, "%.4g KiB", b / KiB);
  } else if (b < 1024.0 * MiB) {
    std::snprintf(buf, sizeof buf, "%.4g MiB", b / MiB);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g GiB", b / (1024.0 * MiB));
  }
  return buf;
}

// ---------------------------------------------------------------- statistics

static double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  // Nearest rank on a sorted copy: simple, and what "p99 over 10,000" usually means.
  size_t idx = static_cast<size_t>(std::ceil(q * double(sorted.size())));
  idx = idx == 0 ? 0 : idx - 1;
  return sorted[std::min(idx, sorted.size() - 1)];
}

Stats ComputeStats(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(sq / double(v.size() - 1)) : 0;
  s.p50 = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p90 = Percentile(v, 0.90);
  s.p99 = Percentile(v, 0.99);
  return s;
}

// ---------------------------------------------------------------- JSON

Json Json::FromStats(const Stats& s, double scale) {
  Json j = Object();
  j.Set("n", s.n)
      .Set("median", s.p50 * scale)
      .Set("p90", s.p90 * scale)
      .Set("p99", s.p99 * scale)
      .Set("mean", s.mean * scale)
      .Set("stddev", s.stddev * scale)
      .Set("ci95_halfwidth", 1.96 * s.stddev * scale)
      .Set("min", s.min * scale)
      .Set("max", s.max * scale);
  return j;
}

Json& Json::Set(const std::string& key, Json v) {
  for (auto& kv : obj_) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return *this;
    }
  }
  obj_.emplace_back(key, std::move(v));
  return *this;
}

Json& Json::Push(Json v) {
  arr_.push_back(std::move(v));
  return *this;
}

static void EscapeTo(std::string* out, const std::string& s) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void Json::DumpTo(std::string* out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out->push_back('\n');
    out->append(size_t(indent * d), ' ');
  };
  switch (kind_) {
    case kNull:
      *out += "null";
      break;
    case kBool:
      *out += bool_ ? "true" : "false";
      break;
    case kNumber: {
      if (!std::isfinite(num_)) {
        *out += "null";
      } else if (num_ == std::floor(num_) && std::fabs(num_) < 1e15) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.0f", num_);
        *out += buf;
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.6g", num_);
        *out += buf;
      }
      break;
    }
    case kString:
      EscapeTo(out, str_);
      break;
    case kObject: {
      out->push_back('{');
      for (size_t i = 0; i < obj_.size(); ++i) {
        if (i) out->push_back(',');
        newline(depth + 1);
        EscapeTo(out, obj_[i].first);
        *out += indent > 0 ? ": " : ":";
        obj_[i].second.DumpTo(out, indent, depth + 1);
      }
      if (!obj_.empty()) newline(depth);
      out->push_back('}');
      break;
    }
    case kArray: {
      // Arrays of plain numbers stay on one line.
      bool flat =
          std::all_of(arr_.begin(), arr_.end(), [](const Json& j) { return j.kind_ == kNumber; });
      out->push_back('[');
      for (size_t i = 0; i < arr_.size(); ++i) {
        if (i) *out += flat && indent > 0 ? ", " : ",";
        if (!flat) newline(depth + 1);
        arr_[i].DumpTo(out, indent, depth + 1);
      }
      if (!flat && !arr_.empty()) newline(depth);
      out->push_back(']');
      break;
    }
  }
}

std::string Json::Dump(int indent) const {
  std::string out;
  DumpTo(&out, indent, 0);
  return out;
}

// ---------------------------------------------------------------- context helpers

void Log(const Context& ctx, const char* fmt, ...) {
  if (!ctx.root()) return;
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fflush(stdout);
}

void Fail(const Context& ctx, const char* fmt, ...) {
  std::fprintf(stderr, "[rank %d] %s: FAILED: ", ctx.rank, ctx.name.c_str());
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::_Exit(2);
}

std::vector<double> MaxOverRanks(const Context& ctx, const std::vector<double>& local) {
  std::vector<double> out(local.size());
  int n = static_cast<int>(local.size());
  int n_max = 0;
  MPI_Allreduce(&n, &n_max, 1, MPI_INT, MPI_MAX, ctx.comm);
  if (n != n_max) Fail(ctx, "ranks disagree on the number of samples (%d vs %d)", n, n_max);
  if (n > 0) MPI_Allreduce(local.data(), out.data(), n, MPI_DOUBLE, MPI_MAX, ctx.comm);
  return out;
}

double MaxOverRanks(const Context& ctx, double local) {
  double out = 0;
  MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_MAX, ctx.comm);
  return out;
}

double SumOverRanks(const Context& ctx, double local) {
  double out = 0;
  MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_SUM, ctx.comm);
  return out;
}

bool AllOk(const Context& ctx, bool ok) {
  int in = ok ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, ctx.comm);
  return out == 1;
}

Json ResultHeader(const Context& ctx) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  char date[64];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  int allowed_max = static_cast<int>(MaxOverRanks(ctx, double(ctx.cpus_allowed)));
  std::string loadavg;
  {
    std::ifstream f("/proc/loadavg");
    std::getline(f, loadavg);
  }
  Json j = Json::Object();
  j.Set("benchmark", ctx.name)
      .Set("np", ctx.size)
      .Set("date", std::string(date))
      .Set("host", std::string(host))
      .Set("cores", ctx.cores)
      .Set("max_cpus_allowed_per_rank", allowed_max)
      .Set("pinned", allowed_max == 1)
      .Set("oversubscribed", ctx.oversubscribed)
      .Set("loadavg_at_end", loadavg)
      .Set("transport", ctx.transport)
      .Set("raw_mpi_transport", RawMpiTransport())
      .Set("runtime_version", std::string(hvdc_version() ? hvdc_version() : "?"));
  if (ctx.transport == "tcp") j.Set("tcp_peers", ctx.tcp_peers);
  return j;
}

void WriteResult(const Context& ctx, const Json& result) {
  if (!ctx.root()) return;
  std::string path = ctx.opts->Str("out", "");
  if (path.empty()) {
    path = "bench/results/" + ctx.name + (ctx.transport == "tcp" ? "-tcp" : "") + "-np" +
           std::to_string(ctx.size) + ".json";
  }
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream f(path);
  if (!f) {
    std::fprintf(stderr, "%s: cannot write %s\n", ctx.name.c_str(), path.c_str());
    return;
  }
  f << result.Dump(2) << "\n";
  std::printf("%s: wrote %s\n", ctx.name.c_str(), path.c_str());
}

// ---------------------------------------------------------------- /proc readers

int64_t ReadStatusKiB(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  size_t len = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, len, field) == 0) return std::atoll(line.c_str() + len);
  }
  return -1;
}

bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  return bool(f);
}

std::set<int> ThreadIds() {
  std::set<int> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9') out.insert(std::atoi(e->d_name));
  }
  closedir(d);
  return out;
}

double ThreadCpuSeconds(int tid) {
  // schedstat's first field is the nanoseconds run on a CPU; stat's utime+stime (ticks) is the
  // coarse fallback.
  char path[96];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
  if (FILE* f = std::fopen(path, "r")) {
    unsigned long long ns = 0;
    int got = std::fscanf(f, "%llu", &ns);
    std::fclose(f);
    if (got == 1) return double(ns) * 1e-9;
  }
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  std::ifstream f(path);
  if (!f) return -1;
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields after the name start at field 3 (state); utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

static double TimevalSeconds(const timeval& tv) { return double(tv.tv_sec) + 1e-6 * tv.tv_usec; }

RuntimeCpu::Sample RuntimeCpu::Take() const {
  Sample s;
  rusage self{}, thread{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_THREAD, &thread);
  s.process_minus_main = TimevalSeconds(self.ru_utime) + TimevalSeconds(self.ru_stime) -
                         TimevalSeconds(thread.ru_utime) - TimevalSeconds(thread.ru_stime);
  int main_tid = static_cast<int>(getpid());
  for (int tid : ctx_.pre_runtime_tids) {
    if (tid == main_tid) continue;
    double c = ThreadCpuSeconds(tid);
    if (c > 0) s.pre_existing += c;
  }
  return s;
}

std::vector<ThreadInfo> ListThreads(const Context& ctx) {
  std::vector<ThreadInfo> out;
  for (int tid : ThreadIds()) {
    ThreadInfo t{tid, "", ThreadCpuSeconds(tid), ctx.pre_runtime_tids.count(tid) != 0};
    char path[96];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
    std::ifstream f(path);
    std::getline(f, t.name);
    out.push_back(t);
  }
  return out;
}

// ---------------------------------------------------------------- tensor sets

int64_t TensorSet::total_elements() const {
  int64_t t = 0;
  for (int64_t e : elements) t += e;
  return t;
}

TensorSet LoadTensorSet(const Context& ctx, const std::string& spec) {
  std::vector<std::string> candidates;
  if (spec.find('/') != std::string::npos || spec.find(".txt") != std::string::npos) {
    candidates.push_back(spec);
  }
  std::string file = spec.find(".txt") == std::string::npos ? spec + ".txt" : spec;
  std::string base = std::filesystem::path(file).filename().string();
  if (ctx.opts->Has("tensor-dir"))
    candidates.push_back(ctx.opts->Str("tensor-dir", "") + "/" + base);
  candidates.push_back(std::string(HVDC_BENCH_TENSOR_DIR) + "/" + base);
  candidates.push_back("bench/tensor_sets/" + base);
  candidates.push_back("../shared/bench/tensor_sets/" + base);
  for (const auto& path : candidates) {
    std::ifstream f(path);
    if (!f) continue;
    TensorSet set;
    set.name = std::filesystem::path(base).stem().string();
    std::string line;
    while (std::getline(f, line)) {
      auto first = line.find_first_not_of(" \t\r");
      if (first == std::string::npos || line[first] == '#') continue;
      int64_t n = std::atoll(line.c_str() + first);
      if (n <= 0) Fail(ctx, "%s: bad element count '%s'", path.c_str(), line.c_str());
      set.elements.push_back(n);
    }
    if (set.elements.empty()) Fail(ctx, "%s: no tensors", path.c_str());
    return set;
  }
  Fail(ctx, "tensor set '%s' not found (try --tensor-dir)", spec.c_str());
}

TensorSet UniformSet(const std::string& name, int count, int64_t elements) {
  TensorSet set;
  set.name = name;
  set.elements.assign(size_t(count), elements);
  return set;
}

static size_t MappedBytes(int64_t n) {
  size_t page = 4096;
  size_t bytes = size_t(std::max<int64_t>(n, 1)) * sizeof(float);
  return (bytes + page - 1) / page * page;
}

float* AllocFloats(int64_t n) {
  size_t bytes = MappedBytes(n);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "out of memory mapping %zu bytes\n", bytes);
    std::abort();
  }
  std::memset(p, 0, bytes);  // touch every page now, not inside a timed step
  return static_cast<float*>(p);
}

void FreeFloats(float* p, int64_t n) {
  if (p) munmap(p, MappedBytes(n));
}

Buffers::Buffers(const TensorSet& set) {
  for (int64_t e : set.elements) {
    ptrs_.push_back(AllocFloats(e));
    elems_.push_back(e);
  }
}

Buffers::~Buffers() {
  for (size_t i = 0; i < ptrs_.size(); ++i) FreeFloats(ptrs_[i], elems_[i]);
}

int64_t Buffers::total_bytes() const {
  int64_t t = 0;
  for (int64_t e : elems_) t += e * 4;
  return t;
}

static inline int PatternBase(int64_t tensor_index, int64_t j) {
  return int((j + 3 * tensor_index) % 7);
}

void FillPattern(float* p, int64_t n, int rank, int64_t tensor_index) {
  for (int64_t j = 0; j < n; ++j) p[j] = float(rank + 1 + PatternBase(tensor_index, j));
}

int64_t CheckPattern(const float* p, int64_t n, int size, int64_t tensor_index, int reduce_op,
                     std::string* first_error) {
  int64_t wrong = 0;
  for (int64_t j = 0; j < n; ++j) {
    double sum = double(size) * (size + 1) / 2 + double(size) * PatternBase(tensor_index, j);
    double expect = reduce_op == HVDC_AVERAGE ? sum / size : sum;
    double got = p[j];
    bool ok = std::fabs(got - expect) <= 1e-5 * std::fabs(expect) + 1e-6;
    if (!ok) {
      if (wrong == 0 && first_error) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "tensor %lld element %lld: got %.9g, expected %.9g",
                      (long long)tensor_index, (long long)j, got, expect);
        *first_error = buf;
      }
      ++wrong;
    }
  }
  return wrong;
}

Target AtMost(const std::string& what, double value, double limit, const char* unit) {
  Target t;
  t.what = what;
  t.value = value;
  t.limit = limit;
  t.met = value <= limit;
  char buf[200];
  if (t.met) {
    std::snprintf(buf, sizeof buf, "%.3g%s <= %.3g%s: met", value, unit, limit, unit);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g%s > %.3g%s: MISSED by %.0f%%", value, unit, limit, unit,
                  limit > 0 ? (value / limit - 1) * 100 : 100.0);
  }
  t.text = buf;
  return t;
}

Json Target::ToJson() const {
  return Json::Object()
      .Set("what", what)
      .Set("value", value)
      .Set("limit", limit)
      .Set("met", met)
      .Set("text", text);
}

void SleepUntil(double t) {
  for (double now = MPI_Wtime(); now < t; now = MPI_Wtime()) {
    double d = t - now;
    timespec ts;
    ts.tv_sec = static_cast<time_t>(d);
    ts.tv_nsec = static_cast<long>((d - double(ts.tv_sec)) * 1e9);
    nanosleep(&ts, nullptr);
  }
}

void SpinUntil(double t) {
  while (MPI_Wtime() < t) {
  }
}

}  // namespace bench

namespace bench {

std::vector<std::vector<double>> TimeInterleaved(const Context& ctx,
                                                 const std::vector<Variant>& variants, int warmup,
                                                 int steps) {
  size_t nv = variants.size();
  std::vector<std::vector<double>> local(nv);
  for (int round = 0; round < warmup + steps; ++round) {
    for (size_t k = 0; k < nv; ++k) {
      const Variant& v = variants[(k + size_t(round)) % nv];
      size_t idx = (k + size_t(round)) % nv;
      if (v.before) v.before();
      MPI_Barrier(ctx.comm);
      double t0 = MPI_Wtime();
      v.step();
      double t = MPI_Wtime() - t0;
      if (v.after) v.after();
      if (round >= warmup) local[idx].push_back(t);
    }
  }
  std::vector<std::vector<double>> out(nv);
  for (size_t k = 0; k < nv; ++k) out[k] = MaxOverRanks(ctx, local[k]);
  return out;
}

}  // namespace bench
