// Config::FromEnv over an injected environment (never the real one).
#include "core/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace hvdc {
namespace {

using Env = std::map<std::string, std::string>;

Status Parse(const Env& env, Config* out, std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> ignored;
  return Config::FromEnv(
      [&env](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      out, warnings != nullptr ? warnings : &ignored);
}

Config ParseOk(const Env& env, std::vector<std::string>* warnings = nullptr) {
  Config c;
  Status s = Parse(env, &c, warnings);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

// Expects InvalidArgument naming the variable and quoting the value.
std::string ParseFails(const std::string& var, const std::string& value) {
  Config c;
  Status s = Parse({{var, value}}, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << var << "=" << value << ": " << s.ToString();
  EXPECT_NE(s.message().find(var + "='" + value + "'"), std::string::npos)
      << var << "=" << value << " gave: " << s.message();
  return s.message();
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  std::vector<std::string> warnings;
  Config c = ParseOk({}, &warnings);
  Config d;
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(c.fusion_threshold_bytes, 128LL * 1024 * 1024);
  EXPECT_EQ(c.cycle_time_ms, 1.0);
  EXPECT_EQ(c.cache_capacity, 1024);
  EXPECT_EQ(c.timeline_path, "");
  EXPECT_FALSE(c.timeline_mark_cycles);
  EXPECT_FALSE(c.stall_check_disable);
  EXPECT_EQ(c.stall_check_time_s, 60.0);
  EXPECT_EQ(c.stall_shutdown_time_s, 0.0);
  EXPECT_EQ(c.log_level, LogLevel::kWarning);
  EXPECT_EQ(c.controller, "mpi");
  EXPECT_EQ(c.cpu_operations, "mpi");
  EXPECT_TRUE(c.thread_affinity.empty());
  EXPECT_EQ(c.gloo_timeout_s, 30);
  EXPECT_EQ(c.chunk_bytes, d.chunk_bytes);
  EXPECT_EQ(c.zero_copy_bytes, d.zero_copy_bytes);
  EXPECT_TRUE(c.shm_enabled);
  EXPECT_EQ(c.shm_bytes, 0);  // chosen per process set
  EXPECT_FALSE(c.hierarchical_allreduce);
  EXPECT_FALSE(c.hierarchical_allgather);
  EXPECT_FALSE(c.under_launcher);
  EXPECT_EQ(c.Describe(), d.Describe());
}

TEST(ConfigTest, EveryVariableValid) {
  std::vector<std::string> warnings;
  Config c = ParseOk({{"HOROVOD_FUSION_THRESHOLD", "67108864"},
                      {"HOROVOD_CYCLE_TIME", "2.5"},
                      {"HOROVOD_CACHE_CAPACITY", "0"},
                      {"HOROVOD_TIMELINE", "/tmp/t.json"},
                      {"HOROVOD_TIMELINE_MARK_CYCLES", "1"},
                      {"HOROVOD_STALL_CHECK_DISABLE", "1"},
                      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "30"},
                      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "90"},
                      {"HOROVOD_MPI_THREADS_DISABLE", "1"},
                      {"HOROVOD_MPI_LIVENESS", "0"},
                      {"HOROVOD_LOG_LEVEL", "DEBUG"},
                      {"HOROVOD_LOG_HIDE_TIME", "1"},
                      {"HOROVOD_CONTROLLER", "MPI"},
                      {"HOROVOD_CPU_OPERATIONS", "Mpi"},
                      {"HOROVOD_DYNAMIC_PROCESS_SETS", "1"},
                      {"HOROVOD_DISABLE_GROUP_FUSION", "1"},
                      {"HOROVOD_THREAD_AFFINITY", "0, 2,4"},
                      {"HOROVOD_ENABLE_XLA_OPS", "0"},
                      {"HOROVOD_GLOO_IFACE", "eth0"},
                      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "60"},
                      {"HVDC_CHUNK_BYTES", "8192"},
                      {"HVDC_ZERO_COPY_BYTES", "16384"},
                      {"HVDC_SHM", "0"},
                      {"HVDC_SHM_BYTES", "1048576"},
                      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"},
                      {"HOROVOD_HIERARCHICAL_ALLGATHER", "true"}},
                     &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_TRUE(c.hierarchical_allreduce);
  EXPECT_TRUE(c.hierarchical_allgather);
  EXPECT_FALSE(c.shm_enabled);
  EXPECT_EQ(c.shm_bytes, 1048576);
  EXPECT_EQ(c.fusion_threshold_bytes, 67108864);
  EXPECT_EQ(c.cycle_time_ms, 2.5);
  EXPECT_EQ(c.cache_capacity, 0);
  EXPECT_EQ(c.timeline_path, "/tmp/t.json");
  EXPECT_TRUE(c.timeline_mark_cycles);
  EXPECT_TRUE(c.stall_check_disable);
  EXPECT_EQ(c.stall_check_time_s, 30.0);
  EXPECT_EQ(c.stall_shutdown_time_s, 90.0);
  EXPECT_TRUE(c.mpi_threads_disable);
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
  EXPECT_TRUE(c.log_hide_time);
  EXPECT_EQ(c.controller, "mpi");
  EXPECT_EQ(c.cpu_operations, "mpi");
  EXPECT_TRUE(c.dynamic_process_sets);
  EXPECT_TRUE(c.disable_group_fusion);
  EXPECT_EQ(c.thread_affinity, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(c.gloo_iface, "eth0");
  EXPECT_EQ(c.gloo_timeout_s, 60);
  EXPECT_EQ(c.chunk_bytes, 8192);
  EXPECT_EQ(c.zero_copy_bytes, 16384);
}

TEST(ConfigTest, ExactMessageForABadInteger) {
  Config c;
  Status s = Parse({{"HOROVOD_FUSION_THRESHOLD", "abc"}}, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "HOROVOD_FUSION_THRESHOLD='abc' is not a valid integer (bytes)");
}

TEST(ConfigTest, IntegerSyntax) {
  EXPECT_EQ(ParseOk({{"HOROVOD_FUSION_THRESHOLD", "+64"}}).fusion_threshold_bytes, 64);
  EXPECT_EQ(ParseOk({{"HOROVOD_FUSION_THRESHOLD", " 64 "}}).fusion_threshold_bytes, 64);
  EXPECT_EQ(ParseOk({{"HOROVOD_FUSION_THRESHOLD", "007"}}).fusion_threshold_bytes, 7);
  EXPECT_EQ(ParseOk({{"HOROVOD_FUSION_THRESHOLD", "0"}}).fusion_threshold_bytes, 0);
  // Empty or blank means unset.
  EXPECT_EQ(ParseOk({{"HOROVOD_FUSION_THRESHOLD", ""}}).fusion_threshold_bytes,
            128LL * 1024 * 1024);
  EXPECT_EQ(ParseOk({{"HOROVOD_FUSION_THRESHOLD", "  "}}).fusion_threshold_bytes,
            128LL * 1024 * 1024);
  for (const char* bad : {"abc", "12abc", "1e6", "1.0", "0x10", "--1", "+-1", "-", "+", "1 2"}) {
    std::string msg = ParseFails("HOROVOD_FUSION_THRESHOLD", bad);
    EXPECT_NE(msg.find("not a valid integer (bytes)"), std::string::npos) << msg;
  }
  for (const char* big : {"-1", "99999999999999999999", "-99999999999999999999"}) {
    std::string msg = ParseFails("HOROVOD_FUSION_THRESHOLD", big);
    EXPECT_NE(msg.find("is out of range (bytes; must be between 0 and"), std::string::npos) << msg;
  }
}

struct IntCase {
  const char* var;
  const char* good;
  std::vector<const char*> bad;
};

TEST(ConfigTest, EveryIntegerVariableRejectsGarbageAndOutOfRange) {
  const std::vector<IntCase> cases = {
      {"HOROVOD_FUSION_THRESHOLD", "1024", {"x", "-1", "2000000000000"}},
      {"HOROVOD_CACHE_CAPACITY", "10", {"ten", "-1", "1.5", "3000000000"}},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0", {"a", "-1"}},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "1", {"a", "0"}},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "1", {"a", "0"}},
      {"HOROVOD_NUM_NCCL_STREAMS", "2", {"two", "1.0", "99999999999"}},
      {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "4096", {"big", "0", "-5"}},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "5", {"soon", "0", "-1"}},
      {"HVDC_CHUNK_BYTES", "1", {"4MB", "0", "-4096"}},
      {"HVDC_ZERO_COPY_BYTES", "1", {"1M", "0", "-1"}},
      {"HVDC_SHM_BYTES", "4096", {"16MB", "0", "-1"}},
  };
  for (const IntCase& k : cases) {
    ParseOk({{k.var, k.good}});
    for (const char* bad : k.bad) ParseFails(k.var, bad);
  }
}

TEST(ConfigTest, EveryNumberVariableRejectsGarbageNegativeAndNonFinite) {
  EXPECT_EQ(ParseOk({{"HOROVOD_CYCLE_TIME", "0"}}).cycle_time_ms, 0.0);
  EXPECT_EQ(ParseOk({{"HOROVOD_CYCLE_TIME", "1e-1"}}).cycle_time_ms, 0.1);
  EXPECT_EQ(ParseOk({{"HOROVOD_CYCLE_TIME", "+3"}}).cycle_time_ms, 3.0);
  EXPECT_EQ(ParseOk({{"HOROVOD_CYCLE_TIME", ".5"}}).cycle_time_ms, 0.5);
  for (const char* var :
       {"HOROVOD_CYCLE_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"}) {
    ParseOk({{var, "1.5"}});
    for (const char* bad :
         {"abc", "-1", "-0.5", "nan", "inf", "-inf", "1,5", "1.5ms", "0x1p3", "+-1", "1e999"}) {
      ParseFails(var, bad);
    }
  }
  std::string msg = ParseFails("HOROVOD_CYCLE_TIME", "fast");
  EXPECT_EQ(msg, "HOROVOD_CYCLE_TIME='fast' is not a valid number (milliseconds)");
  // A zero check time would report every tensor as stalled.
  ParseFails("HOROVOD_STALL_CHECK_TIME_SECONDS", "0");
  EXPECT_EQ(ParseOk({{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0"}}).stall_shutdown_time_s, 0.0);
}

// The MPI liveness side channel is the one boolean that defaults to on.
TEST(ConfigTest, MpiLivenessDefaultsOn) {
  EXPECT_TRUE(ParseOk({}).mpi_liveness);
  EXPECT_FALSE(ParseOk({{"HOROVOD_MPI_LIVENESS", "0"}}).mpi_liveness);
  const std::string msg = ParseFails("HOROVOD_MPI_LIVENESS", "sometimes");
  EXPECT_NE(msg.find("HOROVOD_MPI_LIVENESS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is not a valid boolean"), std::string::npos) << msg;
}

TEST(ConfigTest, EveryBooleanVariable) {
  const std::vector<std::pair<const char*, bool Config::*>> vars = {
      {"HOROVOD_TIMELINE_MARK_CYCLES", &Config::timeline_mark_cycles},
      {"HOROVOD_STALL_CHECK_DISABLE", &Config::stall_check_disable},
      {"HOROVOD_MPI_THREADS_DISABLE", &Config::mpi_threads_disable},
      {"HOROVOD_MPI_LIVENESS", &Config::mpi_liveness},
      {"HOROVOD_LOG_HIDE_TIME", &Config::log_hide_time},
      {"HOROVOD_DYNAMIC_PROCESS_SETS", &Config::dynamic_process_sets},
      {"HOROVOD_DISABLE_GROUP_FUSION", &Config::disable_group_fusion},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", &Config::hierarchical_allreduce},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", &Config::hierarchical_allgather},
  };
  for (const auto& [var, field] : vars) {
    for (const char* yes : {"1", "2", "true", "TRUE", "Yes", "on", " 1 "}) {
      EXPECT_TRUE(ParseOk({{var, yes}}).*field) << var << "=" << yes;
    }
    for (const char* no : {"0", "00", "false", "False", "NO", "off"}) {
      EXPECT_FALSE(ParseOk({{var, no}}).*field) << var << "=" << no;
    }
    for (const char* bad : {"-1", "maybe", "1.0", "y", "enable"}) {
      std::string msg = ParseFails(var, bad);
      EXPECT_NE(msg.find("is not a valid boolean"), std::string::npos) << msg;
    }
  }
}

TEST(ConfigTest, LogLevel) {
  const std::vector<std::pair<const char*, LogLevel>> levels = {
      {"trace", LogLevel::kTrace},     {"Debug", LogLevel::kDebug}, {"INFO", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"error", LogLevel::kError}, {"FaTaL", LogLevel::kFatal}};
  for (const auto& [text, level] : levels) {
    EXPECT_EQ(ParseOk({{"HOROVOD_LOG_LEVEL", text}}).log_level, level) << text;
  }
  std::string msg = ParseFails("HOROVOD_LOG_LEVEL", "verbose");
  EXPECT_NE(msg.find("trace, debug, info, warning, error, fatal"), std::string::npos) << msg;
  ParseFails("HOROVOD_LOG_LEVEL", "warn");
  ParseFails("HOROVOD_LOG_LEVEL", "3");
}

TEST(ConfigTest, ControllerAndCpuOperations) {
  for (const char* var : {"HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"}) {
    ParseOk({{var, "mpi"}});
    ParseOk({{var, "MPI"}});
    EXPECT_EQ(ParseOk({{var, "gloo"}}).controller == "gloo",
              std::string(var) == "HOROVOD_CONTROLLER");
    EXPECT_EQ(ParseOk({{var, " GLOO "}}).cpu_operations == "gloo",
              std::string(var) == "HOROVOD_CPU_OPERATIONS");
    std::string msg = ParseFails(var, "nccl");
    EXPECT_NE(msg.find("is not a valid choice"), std::string::npos) << msg;
  }
  // oneCCL is a CPU-operations backend in Horovod, never a controller.
  std::string msg = ParseFails("HOROVOD_CPU_OPERATIONS", "ccl");
  EXPECT_NE(msg.find("ccl backend is not available yet"), std::string::npos) << msg;
  msg = ParseFails("HOROVOD_CONTROLLER", "ccl");
  EXPECT_NE(msg.find("is not a valid choice (mpi, gloo)"), std::string::npos) << msg;
}

TEST(ConfigTest, ThreadAffinity) {
  EXPECT_EQ(ParseOk({{"HOROVOD_THREAD_AFFINITY", "3"}}).thread_affinity, std::vector<int>{3});
  EXPECT_EQ(ParseOk({{"HOROVOD_THREAD_AFFINITY", " 1 , 0 "}}).thread_affinity,
            (std::vector<int>{1, 0}));
  for (const char* bad : {"a", "1,,2", "1,", ",1", ",", "-1", "1;2", "1.5", "99999999999"}) {
    std::string msg = ParseFails("HOROVOD_THREAD_AFFINITY", bad);
    EXPECT_NE(msg.find("comma-separated non-negative integers"), std::string::npos) << msg;
  }
}

TEST(ConfigTest, StallShutdownBelowCheckTimeIsIgnoredWithAWarning) {
  std::vector<std::string> warnings;
  Config c = ParseOk({{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10"}}, &warnings);
  EXPECT_EQ(c.stall_shutdown_time_s, 0.0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), std::string::npos);
  EXPECT_NE(warnings[0].find("HOROVOD_STALL_CHECK_TIME_SECONDS"), std::string::npos);

  warnings.clear();
  c = ParseOk(
      {{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "5"}, {"HOROVOD_STALL_CHECK_TIME_SECONDS", "2"}},
      &warnings);
  EXPECT_EQ(c.stall_shutdown_time_s, 5.0);
  EXPECT_EQ(c.stall_check_time_s, 2.0);
  EXPECT_TRUE(warnings.empty());

  c = ParseOk({{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "60"}}, &warnings);
  EXPECT_EQ(c.stall_shutdown_time_s, 60.0);  // equal to the check time is fine
  EXPECT_TRUE(warnings.empty());
}

// Every accepted-but-inactive setting: set to "1" (valid for each kind), it is named in exactly
// one warning and changes nothing; a switch set to false says nothing.
TEST(ConfigTest, NoEffectSettingsWarnOnceAndChangeNothing) {
  ASSERT_FALSE(NoEffectSettings().empty());
  const std::string defaults = Config().Describe();
  Env all;
  for (const NoEffectSetting& n : NoEffectSettings()) {
    std::vector<std::string> warnings;
    Config c = ParseOk({{n.name, "1"}}, &warnings);
    ASSERT_EQ(warnings.size(), 1u) << n.name;
    EXPECT_EQ(warnings[0],
              std::string(n.name) + "='1' is accepted but has no effect here: " + n.why);
    EXPECT_EQ(c.Describe(), defaults) << n.name;
    all[n.name] = "1";
  }
  std::vector<std::string> warnings;
  ParseOk(all, &warnings);
  EXPECT_EQ(warnings.size(), NoEffectSettings().size());

  for (const char* off : {"HOROVOD_AUTOTUNE", "HOROVOD_ENABLE_ASYNC_COMPLETION",
                          "HOROVOD_DISABLE_NVTX_RANGES", "HOROVOD_BATCH_D2D_MEMCOPIES"}) {
    warnings.clear();
    ParseOk({{off, "0"}, {"HOROVOD_TORUS_ALLREDUCE", "false"}}, &warnings);
    EXPECT_TRUE(warnings.empty()) << off << ": " << warnings[0];
  }
  // Their values are still checked.
  for (const char* sw : {"HOROVOD_AUTOTUNE", "HOROVOD_ENABLE_ASYNC_COMPLETION",
                         "HOROVOD_TORUS_ALLREDUCE", "HOROVOD_DISABLE_NVTX_RANGES"}) {
    std::string msg = ParseFails(sw, "maybe");
    EXPECT_NE(msg.find("is not a valid boolean"), std::string::npos) << msg;
  }
  ParseFails("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "-1");
}

// The variables that act are not in the no-effect list, and the list has no repeats.
TEST(ConfigTest, NoEffectListNamesNoActingVariable) {
  const std::string described = Config().Describe();
  std::vector<std::string> seen;
  for (const NoEffectSetting& n : NoEffectSettings()) {
    EXPECT_EQ(("\n" + described).find(std::string("\n") + n.name + "="), std::string::npos)
        << n.name;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), n.name), 0) << n.name;
    seen.push_back(n.name);
  }
}

TEST(ConfigTest, XlaOpsImplyZeroCycleTime) {
  Config c = ParseOk({{"HOROVOD_ENABLE_XLA_OPS", "1"}});
  EXPECT_EQ(c.cycle_time_ms, 0.0);
  c = ParseOk({{"HOROVOD_ENABLE_XLA_OPS", "1"}, {"HOROVOD_CYCLE_TIME", "5"}});
  EXPECT_EQ(c.cycle_time_ms, 5.0);
  EXPECT_EQ(ParseOk({{"HOROVOD_ENABLE_XLA_OPS", "0"}}).cycle_time_ms, 1.0);
  ParseFails("HOROVOD_ENABLE_XLA_OPS", "perhaps");
}

TEST(ConfigTest, UnderLauncher) {
  EXPECT_FALSE(ParseOk({{"HOROVOD_RANK", "0"}, {"OMPI_COMM_WORLD_RANK", "0"}}).under_launcher);
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    EXPECT_TRUE(ParseOk({{var, "2"}}).under_launcher) << var;
    EXPECT_TRUE(ParseOk({{var, ""}}).under_launcher) << var << " (empty)";
  }
}

TEST(ConfigTest, MpiYieldWhenIdleSet) {
  EXPECT_FALSE(ParseOk({}).mpi_yield_when_idle_set);
  EXPECT_FALSE(ParseOk({{"OMPI_MCA_mpi_yield_when_idle_x", "1"}}).mpi_yield_when_idle_set);
  for (const char* value : {"0", "1", ""}) {
    EXPECT_TRUE(ParseOk({{"OMPI_MCA_mpi_yield_when_idle", value}}).mpi_yield_when_idle_set)
        << "'" << value << "'";
  }
}

TEST(ConfigTest, AnErrorLeavesTheOutputsUntouched) {
  Config c;
  c.fusion_threshold_bytes = 17;
  std::vector<std::string> warnings = {"earlier"};
  Status s = Parse({{"HOROVOD_AUTOTUNE", "1"}, {"HOROVOD_CYCLE_TIME", "-1"}}, &c, &warnings);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.fusion_threshold_bytes, 17);
  EXPECT_EQ(warnings, std::vector<std::string>{"earlier"});
}

TEST(ConfigTest, LongValuesAreCutInMessages) {
  std::string value(1000, '9');
  Config c;
  Status s = Parse({{"HVDC_CHUNK_BYTES", value}}, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 200u) << s.message();
  EXPECT_NE(s.message().find("HVDC_CHUNK_BYTES='9999"), std::string::npos);
}

TEST(ConfigTest, NullWarningsIsAllowed) {
  Config c;
  Status s = Config::FromEnv(
      [](const char* name) -> std::optional<std::string> {
        if (std::string(name) == "HOROVOD_AUTOTUNE") return "1";
        return std::nullopt;
      },
      &c, nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// HOROVOD_ELASTIC acts (no exit timer after a lost peer; runtime_shutdown.cc): no warning.
TEST(ConfigTest, Elastic) {
  EXPECT_FALSE(ParseOk({}).elastic);
  for (const char* on : {"1", "true", "YES"}) {
    std::vector<std::string> warnings;
    EXPECT_TRUE(ParseOk({{"HOROVOD_ELASTIC", on}}, &warnings).elastic) << on;
    EXPECT_TRUE(warnings.empty()) << warnings[0];
  }
  EXPECT_FALSE(ParseOk({{"HOROVOD_ELASTIC", "0"}}).elastic);
  std::string msg = ParseFails("HOROVOD_ELASTIC", "maybe");
  EXPECT_NE(msg.find("is not a valid boolean"), std::string::npos) << msg;
  EXPECT_NE(ParseOk({{"HOROVOD_ELASTIC", "1"}}).Describe().find("HOROVOD_ELASTIC=1\n"),
            std::string::npos);
}

TEST(ConfigTest, TcpRendezvousScope) {
  EXPECT_EQ(ParseOk({}).tcp_rendezvous_scope, "global");
  EXPECT_EQ(ParseOk({{"HVDC_TCP_RENDEZVOUS_SCOPE", " "}}).tcp_rendezvous_scope, "global");
  EXPECT_EQ(ParseOk({{"HVDC_TCP_RENDEZVOUS_SCOPE", "elastic-12"}}).tcp_rendezvous_scope,
            "elastic-12");
  EXPECT_EQ(ParseOk({{"HVDC_TCP_RENDEZVOUS_SCOPE", " Job_3.a "}}).tcp_rendezvous_scope, "Job_3.a");
  EXPECT_EQ(ParseOk({{"HVDC_TCP_RENDEZVOUS_SCOPE", std::string(128, 'x')}}).tcp_rendezvous_scope,
            std::string(128, 'x'));
  // Anything that is not one plain URL path segment.
  for (std::string bad : {"a/b", "a b", "round?1", "%41", "..", ".", "r\u00e9", "a#b"}) {
    std::string msg = ParseFails("HVDC_TCP_RENDEZVOUS_SCOPE", bad);
    EXPECT_NE(msg.find("is not a valid scope (1 to 128 letters, digits, '.', '_' or '-')"),
              std::string::npos)
        << msg;
  }
  Config c;
  EXPECT_EQ(Parse({{"HVDC_TCP_RENDEZVOUS_SCOPE", std::string(129, 'x')}}, &c).code(),
            StatusCode::kInvalidArgument);
  EXPECT_NE(ParseOk({{"HVDC_TCP_RENDEZVOUS_SCOPE", "r1"}})
                .Describe()
                .find("HVDC_TCP_RENDEZVOUS_SCOPE=r1\n"),
            std::string::npos);
}

TEST(ConfigTest, DescribeListsEveryVariable) {
  Config c = ParseOk({{"HOROVOD_THREAD_AFFINITY", "1,2"}, {"HOROVOD_LOG_LEVEL", "info"}});
  std::string d = c.Describe();
  EXPECT_NE(d.find("HOROVOD_FUSION_THRESHOLD=134217728\n"), std::string::npos) << d;
  EXPECT_NE(d.find("HOROVOD_THREAD_AFFINITY=1,2\n"), std::string::npos) << d;
  EXPECT_NE(d.find("HOROVOD_LOG_LEVEL=info\n"), std::string::npos) << d;
  EXPECT_NE(d.find("HOROVOD_CYCLE_TIME=1\n"), std::string::npos) << d;
  for (const char* var : {"HOROVOD_FUSION_THRESHOLD",
                          "HOROVOD_CYCLE_TIME",
                          "HOROVOD_CACHE_CAPACITY",
                          "HOROVOD_TIMELINE",
                          "HOROVOD_TIMELINE_MARK_CYCLES",
                          "HOROVOD_STALL_CHECK_DISABLE",
                          "HOROVOD_STALL_CHECK_TIME_SECONDS",
                          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                          "HOROVOD_MPI_THREADS_DISABLE",
                          "HOROVOD_MPI_LIVENESS",
                          "HOROVOD_LOG_LEVEL",
                          "HOROVOD_LOG_HIDE_TIME",
                          "HOROVOD_CONTROLLER",
                          "HOROVOD_CPU_OPERATIONS",
                          "HOROVOD_DYNAMIC_PROCESS_SETS",
                          "HOROVOD_DISABLE_GROUP_FUSION",
                          "HOROVOD_THREAD_AFFINITY",
                          "HOROVOD_GLOO_IFACE",
                          "HOROVOD_GLOO_TIMEOUT_SECONDS",
                          "HVDC_CHUNK_BYTES",
                          "HVDC_ZERO_COPY_BYTES",
                          "HVDC_SHM",
                          "HVDC_SHM_BYTES",
                          "HOROVOD_HIERARCHICAL_ALLREDUCE",
                          "HOROVOD_HIERARCHICAL_ALLGATHER",
                          "HOROVOD_ELASTIC",
                          "HVDC_TCP_RENDEZVOUS_SCOPE",
                          "under_launcher",
                          "mpi_yield_when_idle_set"}) {
    // Each variable starts a line.
    EXPECT_NE(("\n" + d).find(std::string("\n") + var), std::string::npos) << var;
  }
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
