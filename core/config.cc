#include "core/config.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

namespace hvdc {
namespace {

constexpr int64_t kMaxBytes = 1LL << 40;  // 1 TiB: anything larger is a typo, not a buffer size
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

std::string_view Trim(std::string_view s) {
  const char* kSpace = " \t\r\n\v\f";
  size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  size_t end = s.find_last_not_of(kSpace);
  return s.substr(begin, end - begin + 1);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// The value as quoted in an error message: long values are cut so a pasted blob stays readable.
std::string Quote(std::string_view raw) {
  constexpr size_t kMax = 64;
  if (raw.size() <= kMax) return fmt::format("'{}'", raw);
  return fmt::format("'{}...'", raw.substr(0, kMax));
}

enum class IntSyntax { kOk, kInvalid, kTooLarge };

// Strict whole decimal integer: an optional '+' or '-', then digits only.
IntSyntax ParseWholeInt(std::string_view s, int64_t* out) {
  bool plus = !s.empty() && s[0] == '+';
  if (plus) s.remove_prefix(1);
  // from_chars reads a '-' itself; only digits may follow the sign.
  std::string_view digits = (!plus && !s.empty() && s[0] == '-') ? s.substr(1) : s;
  if (digits.empty()) return IntSyntax::kInvalid;
  for (char c : digits) {
    if (c < '0' || c > '9') return IntSyntax::kInvalid;
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  if (ec == std::errc::result_out_of_range) return IntSyntax::kTooLarge;
  return ec == std::errc() && ptr == s.data() + s.size() ? IntSyntax::kOk : IntSyntax::kInvalid;
}

std::string RangeText(int64_t min, int64_t max) {
  if (max == std::numeric_limits<int64_t>::max()) return fmt::format("must be >= {}", min);
  return fmt::format("must be between {} and {}", min, max);
}

// How a no-effect setting's value is checked: a switch, or a whole number in [min, max], or a
// number >= 0, or any text.
enum class ValueKind { kSwitch, kInt, kNumber, kText };

struct NoEffectEntry {
  NoEffectSetting setting;
  ValueKind kind;
  const char* what = "";  // the unit named in a value error
  int64_t min = 0;
  int64_t max = 0;
};

// The one list of accepted-but-inactive settings (docs: README's variable table and
// docs/differences.md say the same).
const std::vector<NoEffectEntry>& NoEffectEntries() {
  constexpr const char* kAutotune = "autotune is not implemented; the fixed settings are used";
  constexpr const char* kGpu = "a GPU (NCCL) path option, and the NCCL backend does not read it";
  static const std::vector<NoEffectEntry> entries = {
      {{"HOROVOD_AUTOTUNE", kAutotune}, ValueKind::kSwitch},
      {{"HOROVOD_AUTOTUNE_LOG", kAutotune}, ValueKind::kText},
      {{"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", kAutotune}, ValueKind::kInt, "samples", 0, kIntMax},
      {{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", kAutotune}, ValueKind::kInt, "cycles", 1, kIntMax},
      {{"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", kAutotune},
       ValueKind::kInt,
       "samples",
       1,
       kIntMax},
      {{"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", kAutotune}, ValueKind::kNumber, "noise"},
      {{"HOROVOD_TORUS_ALLREDUCE", kGpu}, ValueKind::kSwitch},
      {{"HOROVOD_NUM_NCCL_STREAMS", kGpu},
       ValueKind::kInt,
       "streams",
       std::numeric_limits<int>::min(),
       kIntMax},
      {{"HOROVOD_ENABLE_ASYNC_COMPLETION", kGpu}, ValueKind::kSwitch},
      {{"HOROVOD_BATCH_D2D_MEMCOPIES", kGpu}, ValueKind::kSwitch},
      {{"HOROVOD_DISABLE_NVTX_RANGES", kGpu}, ValueKind::kSwitch},
      {{"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "Adasum is not implemented"},
       ValueKind::kInt,
       "bytes",
       1,
       kMaxBytes},
  };
  return entries;
}

// Reads the variables in a fixed order; the first invalid one becomes the error. Setters leave
// the target untouched when the variable is unset or empty.
class EnvReader {
 public:
  explicit EnvReader(const Config::EnvLookup& lookup) : lookup_(lookup) {}

  const Status& status() const { return status_; }

  // The raw value, or nullopt when unset or all whitespace (or after an earlier error).
  std::optional<std::string> Raw(const char* name) {
    if (!status_.ok()) return std::nullopt;
    std::optional<std::string> v = lookup_(name);
    if (!v || Trim(*v).empty()) return std::nullopt;
    return v;
  }

  bool Present(const char* name) const { return lookup_(name).has_value(); }

  template <typename T>
  bool Int(const char* name, const char* what, int64_t min, int64_t max, T* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    int64_t v = 0;
    IntSyntax syntax = ParseWholeInt(Trim(*raw), &v);
    if (syntax == IntSyntax::kInvalid) {
      return Fail(fmt::format("{}={} is not a valid integer ({})", name, Quote(*raw), what));
    }
    if (syntax == IntSyntax::kTooLarge || v < min || v > max) {
      return Fail(fmt::format("{}={} is out of range ({}; {})", name, Quote(*raw), what,
                              RangeText(min, max)));
    }
    *out = static_cast<T>(v);
    return true;
  }

  // A finite number >= min (or > min when min_exclusive).
  bool Number(const char* name, const char* what, double min, bool min_exclusive, double* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    std::string_view s = Trim(*raw);
    if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
    double v = 0;
    // from_chars is locale-independent (strtod would read "1,5" under some locales) and rejects
    // hex; it accepts "inf"/"nan", which the finiteness check below turns away.
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) {
      if (ec == std::errc::result_out_of_range) {
        return Fail(fmt::format("{}={} is out of range ({})", name, Quote(*raw), what));
      }
      return Fail(fmt::format("{}={} is not a valid number ({})", name, Quote(*raw), what));
    }
    if (!std::isfinite(v)) {
      return Fail(fmt::format("{}={} is not a finite number ({})", name, Quote(*raw), what));
    }
    if (v < min || (min_exclusive && v == min)) {
      return Fail(fmt::format("{}={} is out of range ({}; must be {} {})", name, Quote(*raw), what,
                              min_exclusive ? ">" : ">=", min));
    }
    *out = v;
    return true;
  }

  bool Bool(const char* name, bool* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    std::string v = Lower(Trim(*raw));
    int64_t n = 0;
    if (ParseWholeInt(v, &n) == IntSyntax::kOk && n >= 0) {
      *out = n > 0;
    } else if (v == "true" || v == "yes" || v == "on") {
      *out = true;
    } else if (v == "false" || v == "no" || v == "off") {
      *out = false;
    } else {
      return Fail(fmt::format("{}={} is not a valid boolean (0 or 1, true/false, yes/no, on/off)",
                              name, Quote(*raw)));
    }
    return true;
  }

  bool String(const char* name, std::string* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    *out = std::move(*raw);
    return true;
  }

  // HOROVOD_CONTROLLER / HOROVOD_CPU_OPERATIONS: "mpi" and "gloo" (the TCP transport) are
  // available; `later` are Horovod's other valid choices.
  bool Backend(const char* name, std::initializer_list<const char*> later, std::string* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    std::string v = Lower(Trim(*raw));
    if (v == "mpi" || v == "gloo") {
      *out = v;
      return true;
    }
    for (const char* b : later) {
      if (v == b) {
        return Fail(
            fmt::format("{}={}: the {} backend is not available yet (only 'mpi' and "
                        "'gloo' are)",
                        name, Quote(*raw), b));
      }
    }
    std::string valid = "mpi, gloo";
    for (const char* b : later) valid += fmt::format(", {}", b);
    return Fail(fmt::format("{}={} is not a valid choice ({})", name, Quote(*raw), valid));
  }

  bool Level(const char* name, LogLevel* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    std::string v = Lower(Trim(*raw));
    for (int l = static_cast<int>(LogLevel::kTrace); l <= static_cast<int>(LogLevel::kFatal); ++l) {
      if (v == LogLevelName(static_cast<LogLevel>(l))) {
        *out = static_cast<LogLevel>(l);
        return true;
      }
    }
    return Fail(
        fmt::format("{}={} is not a valid log level (trace, debug, info, warning, error, fatal)",
                    name, Quote(*raw)));
  }

  // Validates a no-effect setting; true when it is set to something that asks for an effect
  // (anything but a switch set to false). *raw gets the value as given.
  bool NoEffect(const NoEffectEntry& e, std::string* raw) {
    std::optional<std::string> value = Raw(e.setting.name);
    if (!value) return false;
    *raw = *value;
    bool on = true;
    int64_t i = 0;
    double d = 0;
    std::string text;
    switch (e.kind) {
      case ValueKind::kSwitch:
        return Bool(e.setting.name, &on) && on;
      case ValueKind::kInt:
        return Int(e.setting.name, e.what, e.min, e.max, &i);
      case ValueKind::kNumber:
        return Number(e.setting.name, e.what, 0.0, false, &d);
      case ValueKind::kText:
        return String(e.setting.name, &text);
    }
    return false;
  }

  // One URL path segment: 1..128 of [A-Za-z0-9._-] (what a rendezvous scope may be).
  bool PathSegment(const char* name, std::string* out) {
    constexpr size_t kMaxLength = 128;
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    std::string_view v = Trim(*raw);
    bool valid = v.size() <= kMaxLength && v != "." && v != "..";
    for (char c : v) {
      bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (!alnum && c != '.' && c != '_' && c != '-') valid = false;
    }
    if (!valid) {
      return Fail(
          fmt::format("{}={} is not a valid scope (1 to {} letters, digits, '.', '_' or "
                      "'-')",
                      name, Quote(*raw), kMaxLength));
    }
    *out = std::string(v);
    return true;
  }

  bool IntList(const char* name, std::vector<int>* out) {
    std::optional<std::string> raw = Raw(name);
    if (!raw) return false;
    std::vector<int> values;
    std::string_view rest = *raw;
    while (true) {
      size_t comma = rest.find(',');
      std::string_view item = Trim(rest.substr(0, comma));
      int64_t v = 0;
      if (ParseWholeInt(item, &v) != IntSyntax::kOk || v < 0 || v > kIntMax) {
        return Fail(fmt::format(
            "{}={} is not a valid list of core ids (comma-separated non-negative integers; "
            "'{}' is not one)",
            name, Quote(*raw), item));
      }
      values.push_back(static_cast<int>(v));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    *out = std::move(values);
    return true;
  }

 private:
  bool Fail(std::string message) {
    status_ = Status::InvalidArgument(std::move(message));
    return false;
  }

  const Config::EnvLookup& lookup_;
  Status status_;
};

}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kFatal:
      return "fatal";
  }
  return "unknown";
}

Status Config::FromEnv(const EnvLookup& getenv, Config* out, std::vector<std::string>* warnings) {
  Config c;
  std::vector<std::string> warn;
  EnvReader env(getenv);

  env.Int("HOROVOD_FUSION_THRESHOLD", "bytes", 0, kMaxBytes, &c.fusion_threshold_bytes);
  bool xla_ops = false;
  if (env.Bool("HOROVOD_ENABLE_XLA_OPS", &xla_ops) && xla_ops) {
    // As in Horovod, XLA ops want no batching delay (the only effect of this variable here).
    c.cycle_time_ms = 0.0;
  }
  env.Number("HOROVOD_CYCLE_TIME", "milliseconds", 0.0, false, &c.cycle_time_ms);
  env.Int("HOROVOD_CACHE_CAPACITY", "entries", 0, kIntMax, &c.cache_capacity);
  env.String("HOROVOD_TIMELINE", &c.timeline_path);
  env.Bool("HOROVOD_TIMELINE_MARK_CYCLES", &c.timeline_mark_cycles);
  env.Bool("HOROVOD_STALL_CHECK_DISABLE", &c.stall_check_disable);
  env.Number("HOROVOD_STALL_CHECK_TIME_SECONDS", "seconds", 0.0, true, &c.stall_check_time_s);
  env.Number("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "seconds", 0.0, false,
             &c.stall_shutdown_time_s);
  env.Number("HOROVOD_PEER_LOSS_EXIT_SECONDS", "seconds", 0.0, false, &c.peer_loss_exit_s);
  env.Bool("HOROVOD_ELASTIC", &c.elastic);
  env.Number("HOROVOD_PEER_TIMEOUT_SECONDS", "seconds", 0.0, false, &c.peer_timeout_s);
  env.Bool("HOROVOD_MPI_THREADS_DISABLE", &c.mpi_threads_disable);
  env.Bool("HOROVOD_MPI_LIVENESS", &c.mpi_liveness);
  env.Level("HOROVOD_LOG_LEVEL", &c.log_level);
  env.Bool("HOROVOD_LOG_HIDE_TIME", &c.log_hide_time);
  // Horovod's controllers are MPI and Gloo; its CPU operations MPI, Gloo and oneCCL.
  env.Backend("HOROVOD_CONTROLLER", {}, &c.controller);
  env.Backend("HOROVOD_CPU_OPERATIONS", {"ccl"}, &c.cpu_operations);
  env.Bool("HOROVOD_DYNAMIC_PROCESS_SETS", &c.dynamic_process_sets);
  env.Bool("HOROVOD_DISABLE_GROUP_FUSION", &c.disable_group_fusion);
  env.IntList("HOROVOD_THREAD_AFFINITY", &c.thread_affinity);
  env.String("HOROVOD_GLOO_IFACE", &c.gloo_iface);
  env.Int("HOROVOD_GLOO_TIMEOUT_SECONDS", "seconds", 1, kIntMax, &c.gloo_timeout_s);
  env.Int("HOROVOD_RANK", "rank", 0, kIntMax, &c.gloo.rank);
  env.Int("HOROVOD_SIZE", "ranks", 1, kIntMax, &c.gloo.size);
  env.Int("HOROVOD_LOCAL_RANK", "rank", 0, kIntMax, &c.gloo.local_rank);
  env.Int("HOROVOD_LOCAL_SIZE", "ranks", 1, kIntMax, &c.gloo.local_size);
  env.Int("HOROVOD_CROSS_RANK", "rank", 0, kIntMax, &c.gloo.cross_rank);
  env.Int("HOROVOD_CROSS_SIZE", "ranks", 1, kIntMax, &c.gloo.cross_size);
  env.String("HOROVOD_HOSTNAME", &c.gloo.hostname);
  env.String("HOROVOD_GLOO_RENDEZVOUS_ADDR", &c.gloo.rendezvous_addr);
  env.Int("HOROVOD_GLOO_RENDEZVOUS_PORT", "port", 1, 65535, &c.gloo.rendezvous_port);
  env.String("HVDC_TCP_PEERS", &c.tcp_peers);
  env.String("HOROVOD_SECRET_KEY", &c.secret_key);
  env.String("HVDC_TCP_BIND_ADDRESS", &c.tcp_bind_address);
  env.String("HVDC_TCP_ADDRESS_ORIGIN", &c.tcp_address_origin);
  env.PathSegment("HVDC_TCP_RENDEZVOUS_SCOPE", &c.tcp_rendezvous_scope);
  env.Int("HVDC_CHUNK_BYTES", "bytes", 1, kMaxBytes, &c.chunk_bytes);
  env.Int("HVDC_ZERO_COPY_BYTES", "bytes", 1, kMaxBytes, &c.zero_copy_bytes);
  env.Bool("HVDC_SHM", &c.shm_enabled);
  env.Bool("HVDC_SHM_CONTROL", &c.shm_control);
  env.Int("HVDC_SHM_BYTES", "bytes", 1, kMaxBytes, &c.shm_bytes);
  env.Bool("HOROVOD_HIERARCHICAL_ALLREDUCE", &c.hierarchical_allreduce);
  env.Bool("HOROVOD_HIERARCHICAL_ALLGATHER", &c.hierarchical_allgather);
  for (const NoEffectEntry& e : NoEffectEntries()) {
    std::string raw;
    if (env.NoEffect(e, &raw)) {
      warn.push_back(fmt::format("{}={} is accepted but has no effect here: {}", e.setting.name,
                                 Quote(raw), e.setting.why));
    }
  }
  if (!env.status().ok()) return env.status();

  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (env.Present(name)) c.under_launcher = true;
  }
  c.mpi_yield_when_idle_set = env.Present("OMPI_MCA_mpi_yield_when_idle");

  if (c.stall_shutdown_time_s > 0 && c.stall_shutdown_time_s < c.stall_check_time_s) {
    warn.push_back(fmt::format(
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={} is less than HOROVOD_STALL_CHECK_TIME_SECONDS={} "
        "and is ignored: stalled jobs will not be shut down",
        c.stall_shutdown_time_s, c.stall_check_time_s));
    c.stall_shutdown_time_s = 0.0;
  }
  *out = std::move(c);
  if (warnings != nullptr) {
    for (std::string& w : warn) warnings->push_back(std::move(w));
  }
  return Status::OK();
}

// The one place in the codebase that reads the process environment.
Status Config::FromProcessEnv(Config* out, std::vector<std::string>* warnings) {
  return FromEnv(
      [](const char* name) -> std::optional<std::string> {
        const char* v = std::getenv(name);
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      },
      out, warnings);
}

const std::vector<NoEffectSetting>& NoEffectSettings() {
  static const std::vector<NoEffectSetting> settings = [] {
    std::vector<NoEffectSetting> out;
    for (const NoEffectEntry& e : NoEffectEntries()) out.push_back(e.setting);
    return out;
  }();
  return settings;
}

std::string Config::Describe() const {
  std::string affinity;
  for (size_t i = 0; i < thread_affinity.size(); ++i) {
    affinity += fmt::format("{}{}", i == 0 ? "" : ",", thread_affinity[i]);
  }
  auto b = [](bool v) { return v ? 1 : 0; };
  std::string s;
  auto line = [&s](const char* name, const auto& value) {
    fmt::format_to(std::back_inserter(s), "{}={}\n", name, value);
  };
  line("HOROVOD_FUSION_THRESHOLD", fusion_threshold_bytes);
  line("HOROVOD_CYCLE_TIME", cycle_time_ms);
  line("HOROVOD_CACHE_CAPACITY", cache_capacity);
  line("HOROVOD_TIMELINE", timeline_path);
  line("HOROVOD_TIMELINE_MARK_CYCLES", b(timeline_mark_cycles));
  line("HOROVOD_STALL_CHECK_DISABLE", b(stall_check_disable));
  line("HOROVOD_STALL_CHECK_TIME_SECONDS", stall_check_time_s);
  line("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", stall_shutdown_time_s);
  line("HOROVOD_PEER_LOSS_EXIT_SECONDS", peer_loss_exit_s);
  line("HOROVOD_ELASTIC", b(elastic));
  line("HOROVOD_PEER_TIMEOUT_SECONDS", peer_timeout_s);
  line("HOROVOD_MPI_THREADS_DISABLE", b(mpi_threads_disable));
  line("HOROVOD_MPI_LIVENESS", b(mpi_liveness));
  line("HOROVOD_LOG_LEVEL", LogLevelName(log_level));
  line("HOROVOD_LOG_HIDE_TIME", b(log_hide_time));
  line("HOROVOD_CONTROLLER", controller);
  line("HOROVOD_CPU_OPERATIONS", cpu_operations);
  line("HOROVOD_DYNAMIC_PROCESS_SETS", b(dynamic_process_sets));
  line("HOROVOD_DISABLE_GROUP_FUSION", b(disable_group_fusion));
  line("HOROVOD_THREAD_AFFINITY", affinity);
  line("HOROVOD_GLOO_IFACE", gloo_iface);
  line("HOROVOD_GLOO_TIMEOUT_SECONDS", gloo_timeout_s);
  line("HOROVOD_RANK", gloo.rank);
  line("HOROVOD_SIZE", gloo.size);
  line("HOROVOD_LOCAL_RANK", gloo.local_rank);
  line("HOROVOD_LOCAL_SIZE", gloo.local_size);
  line("HOROVOD_CROSS_RANK", gloo.cross_rank);
  line("HOROVOD_CROSS_SIZE", gloo.cross_size);
  line("HOROVOD_HOSTNAME", gloo.hostname);
  line("HOROVOD_GLOO_RENDEZVOUS_ADDR", gloo.rendezvous_addr);
  line("HOROVOD_GLOO_RENDEZVOUS_PORT", gloo.rendezvous_port);
  line("HVDC_TCP_PEERS", tcp_peers);
  line("HOROVOD_SECRET_KEY", secret_key.empty() ? "(not set)" : "(set)");
  line("HVDC_TCP_BIND_ADDRESS", tcp_bind_address);
  line("HVDC_TCP_ADDRESS_ORIGIN", tcp_address_origin);
  line("HVDC_TCP_RENDEZVOUS_SCOPE", tcp_rendezvous_scope);
  line("HVDC_CHUNK_BYTES", chunk_bytes);
  line("HVDC_ZERO_COPY_BYTES", zero_copy_bytes);
  line("HVDC_SHM", b(shm_enabled));
  line("HVDC_SHM_CONTROL", b(shm_control));
  line("HVDC_SHM_BYTES", shm_bytes == 0 ? std::string("auto") : std::to_string(shm_bytes));
  line("HOROVOD_HIERARCHICAL_ALLREDUCE", b(hierarchical_allreduce));
  line("HOROVOD_HIERARCHICAL_ALLGATHER", b(hierarchical_allgather));
  line("under_launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, PMI_RANK)", b(under_launcher));
  line("mpi_yield_when_idle_set (OMPI_MCA_mpi_yield_when_idle)", b(mpi_yield_when_idle_set));
  return s;
}

}  // namespace hvdc
