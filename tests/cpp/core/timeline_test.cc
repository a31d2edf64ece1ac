// Timeline: events from several threads, then the file is parsed back with a small strict JSON
// parser and checked structurally (a closed array, named rows, balanced begin/end per row,
// timestamps in order, the expected event sequence per tensor).
#include "core/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hvdc {
namespace {

// ---- A minimal strict JSON reader (RFC 8259 grammar; enough to validate the trace). ----

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* Get(const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : s_(text) {}

  // Parses the whole text as one value; on failure *error says where.
  bool Parse(Json* out, std::string* error) {
    bool ok = Value(out, 0);
    SkipSpace();
    if (ok && pos_ != s_.size()) ok = Fail("trailing characters");
    if (!ok) *error = error_;
    return ok;
  }

 private:
  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at offset " + std::to_string(pos_);
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(pos_, n, word) != 0) return Fail(std::string("expected ") + word);
    pos_ += n;
    return true;
  }
  bool Value(Json* out, int depth) {
    if (depth > 64) return Fail("nesting too deep");
    SkipSpace();
    if (pos_ >= s_.size()) return Fail("unexpected end");
    char c = s_[pos_];
    if (c == '[') return Array(out, depth);
    if (c == '{') return Object(out, depth);
    if (c == '"') {
      out->type = Json::Type::kString;
      return String(&out->string);
    }
    if (c == 't' || c == 'f') {
      out->type = Json::Type::kBool;
      out->boolean = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return Literal("null");
    return Number(out);
  }
  bool Array(Json* out, int depth) {
    out->type = Json::Type::kArray;
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      out->array.emplace_back();
      if (!Value(&out->array.back(), depth + 1)) return false;
      SkipSpace();
      if (pos_ >= s_.size()) return Fail("unterminated array");
      if (s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      if (s_[pos_] != ',') return Fail("expected ',' or ']'");
      ++pos_;
    }
  }
  bool Object(Json* out, int depth) {
    out->type = Json::Type::kObject;
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      std::string key;
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a key");
      if (!String(&key)) return false;
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      out->object.emplace_back(key, Json());
      if (!Value(&out->object.back().second, depth + 1)) return false;
      SkipSpace();
      if (pos_ >= s_.size()) return Fail("unterminated object");
      if (s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      if (s_[pos_] != ',') return Fail("expected ',' or '}'");
      ++pos_;
    }
  }
  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool String(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return Fail("raw control character in a string");
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (pos_ >= s_.size()) return Fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return Fail("short \\u escape");
          uint32_t cp = 0;
          for (int i = 0; i < 4; ++i) {
            char h = s_[pos_++];
            cp <<= 4;
            if (h >= '0' && h <= '9') {
              cp |= h - '0';
            } else if (h >= 'a' && h <= 'f') {
              cp |= h - 'a' + 10;
            } else if (h >= 'A' && h <= 'F') {
              cp |= h - 'A' + 10;
            } else {
              return Fail("bad \\u escape");
            }
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) return Fail("surrogate escape (not produced by us)");
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
  }
  bool Number(Json* out) {
    size_t start = pos_;
    auto digits = [this]() {
      size_t n = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_, ++n;
      return n;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      return Fail("bad value");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return Fail("bad fraction");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Fail("bad exponent");
    }
    out->type = Json::Type::kNumber;
    out->number = std::stod(s_.substr(start, pos_ - start));
    return true;
  }

  const std::string& s_;
  size_t pos_ = 0;
  std::string error_;
};

// ---- What a trace file says, row by row. ----

struct Trace {
  std::map<int, std::string> row_names;                  // pid -> tensor
  std::map<std::string, std::vector<std::string>> rows;  // tensor -> "B:NAME", "E", "i:NAME"
  int cycles = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses and checks the file; test failures describe what is wrong.
void LoadTrace(const std::string& path, Trace* trace) {
  std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.front(), '[');
  EXPECT_EQ(text[text.find_last_not_of('\n')], ']') << "the array is not closed";
  Json root;
  std::string error;
  ASSERT_TRUE(JsonReader(text).Parse(&root, &error)) << error;
  ASSERT_EQ(root.type, Json::Type::kArray);

  std::map<int, int> depth;
  std::map<int, double> last_ts;
  for (const Json& e : root.array) {
    ASSERT_EQ(e.type, Json::Type::kObject);
    const Json* ph = e.Get("ph");
    const Json* pid = e.Get("pid");
    ASSERT_TRUE(ph != nullptr && ph->type == Json::Type::kString);
    ASSERT_TRUE(pid != nullptr && pid->type == Json::Type::kNumber);
    int p = static_cast<int>(pid->number);
    const Json* name = e.Get("name");
    if (ph->string == "M") {
      ASSERT_NE(name, nullptr);
      if (name->string == "process_name") {
        const Json* args = e.Get("args");
        ASSERT_NE(args, nullptr);
        ASSERT_NE(args->Get("name"), nullptr);
        EXPECT_EQ(trace->row_names.count(p), 0u) << "row " << p << " named twice";
        trace->row_names[p] = args->Get("name")->string;
      }
      continue;
    }
    const Json* ts = e.Get("ts");
    ASSERT_TRUE(ts != nullptr && ts->type == Json::Type::kNumber);
    EXPECT_GE(ts->number, 0);
    if (ph->string == "i" && name != nullptr && name->string == "CYCLE_START") {
      const Json* scope = e.Get("s");
      ASSERT_TRUE(scope != nullptr && scope->string == "g");
      ++trace->cycles;
      continue;
    }
    ASSERT_EQ(trace->row_names.count(p), 1u) << "event on row " << p << " before its name";
    EXPECT_GE(ts->number, last_ts[p]) << "time went backwards on row " << p;
    last_ts[p] = ts->number;
    std::vector<std::string>& row = trace->rows[trace->row_names[p]];
    if (ph->string == "B") {
      ASSERT_NE(name, nullptr);
      row.push_back("B:" + name->string);
      ++depth[p];
    } else if (ph->string == "E") {
      EXPECT_GT(depth[p], 0) << "end without begin on row " << p;
      --depth[p];
      row.push_back("E");
    } else if (ph->string == "i") {
      ASSERT_NE(name, nullptr);
      row.push_back("i:" + name->string);
    } else {
      ADD_FAILURE() << "unexpected phase " << ph->string;
    }
  }
  for (const auto& [p, d] : depth) EXPECT_EQ(d, 0) << "unbalanced row " << p;
}

std::string TempPath(const std::string& tag) {
  static std::atomic<int> counter{0};
  return ::testing::TempDir() + "hvdc_timeline_test_" + std::to_string(::getpid()) + "_" + tag +
         "_" + std::to_string(counter++) + ".json";
}

// The sequence a well-behaved caller produces for one allreduce.
void FullAllreduce(Timeline& tl, const std::string& tensor, int ranks) {
  // As the coordinator does: a start for every rank's request; only the first opens the block.
  for (int r = 0; r < ranks; ++r) {
    tl.NegotiateStart(tensor, OpType::kAllreduce);
    tl.NegotiateRankReady(tensor, r);
  }
  tl.NegotiateEnd(tensor);
  tl.OpStart(tensor, OpType::kAllreduce);
  for (const char* a :
       {timeline_activity::kWaitForData, timeline_activity::kMemcpyInFusionBuffer,
        timeline_activity::kMpiAllreduce, timeline_activity::kMemcpyOutFusionBuffer}) {
    tl.ActivityStart(tensor, a);
    tl.ActivityEnd(tensor);
  }
  tl.OpEnd(tensor);
}

std::vector<std::string> FullAllreduceRow(int ranks) {
  std::vector<std::string> row = {"B:NEGOTIATE_ALLREDUCE"};
  for (int r = 0; r < ranks; ++r) row.push_back("i:" + std::to_string(r));
  row.insert(row.end(), {"E", "B:ALLREDUCE", "B:WAIT_FOR_DATA", "E", "B:MEMCPY_IN_FUSION_BUFFER",
                         "E", "B:MPI_ALLREDUCE", "E", "B:MEMCPY_OUT_FUSION_BUFFER", "E", "E"});
  return row;
}

class TimelineTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& p : paths_) std::remove(p.c_str());
  }
  std::string NewPath(const std::string& tag) {
    paths_.push_back(TempPath(tag));
    return paths_.back();
  }
  std::vector<std::string> paths_;
};

TEST_F(TimelineTest, OneTensorFullSequence) {
  std::string path = NewPath("one");
  Timeline tl;
  EXPECT_FALSE(tl.active());
  ASSERT_TRUE(tl.Start(path, /*mark_cycles=*/true, /*rank=*/0).ok());
  EXPECT_TRUE(tl.active());
  tl.MarkCycleStart();
  FullAllreduce(tl, "grad/dense/kernel:0", 3);
  tl.NegotiateStart("bcast", OpType::kBroadcast);
  tl.NegotiateEnd("bcast");
  tl.OpStart("bcast", OpType::kBroadcast);
  tl.ActivityStart("bcast", timeline_activity::kMpiBroadcast);
  tl.ActivityEnd("bcast");
  tl.OpEnd("bcast");
  tl.Stop();
  EXPECT_FALSE(tl.active());

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  EXPECT_EQ(trace.cycles, 1);
  ASSERT_EQ(trace.rows.size(), 2u);
  EXPECT_EQ(trace.rows["grad/dense/kernel:0"], FullAllreduceRow(3));
  EXPECT_EQ(trace.rows["bcast"],
            (std::vector<std::string>{"B:NEGOTIATE_BROADCAST", "E", "B:BROADCAST", "B:MPI_BCAST",
                                      "E", "E"}));
  // Rows are numbered in order of first appearance.
  EXPECT_EQ(trace.row_names[1], "grad/dense/kernel:0");
  EXPECT_EQ(trace.row_names[2], "bcast");
}

TEST_F(TimelineTest, ManyThreadsAtOnce) {
  std::string path = NewPath("threads");
  Timeline tl;
  ASSERT_TRUE(tl.Start(path, /*mark_cycles=*/true, 0).ok());
  constexpr int kThreads = 4;
  constexpr int kTensors = 300;
  constexpr int kCycles = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&tl, t] {
      for (int i = 0; i < kTensors; ++i) {
        FullAllreduce(tl, "t" + std::to_string(t) + "/tensor" + std::to_string(i), 2);
      }
    });
  }
  threads.emplace_back([&tl] {
    for (int i = 0; i < kCycles; ++i) tl.MarkCycleStart();
  });
  threads.emplace_back([&tl] {  // readers of active() alongside the writers
    int seen = 0;
    for (int i = 0; i < 10000; ++i) seen += tl.active() ? 1 : 0;
    EXPECT_EQ(seen, 10000);
  });
  for (auto& th : threads) th.join();
  tl.Stop();

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  EXPECT_EQ(trace.cycles, kCycles);
  ASSERT_EQ(trace.rows.size(), static_cast<size_t>(kThreads * kTensors));
  const std::vector<std::string> expected = FullAllreduceRow(2);
  for (const auto& [tensor, row] : trace.rows) EXPECT_EQ(row, expected) << tensor;
}

TEST_F(TimelineTest, SameTensorFromSeveralThreadsStaysBalanced) {
  // Interleaved calls on one row make no sense to a reader, but the file must stay valid.
  std::string path = NewPath("shared");
  Timeline tl;
  ASSERT_TRUE(tl.Start(path, false, 0).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&tl] {
      for (int i = 0; i < 200; ++i) FullAllreduce(tl, "shared", 1);
    });
  }
  for (auto& th : threads) th.join();
  tl.Stop();
  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  EXPECT_EQ(trace.rows.size(), 1u);
}

TEST_F(TimelineTest, OnlyRankZeroWrites) {
  std::string path = NewPath("rank1");
  Timeline tl;
  ASSERT_TRUE(tl.Start(path, true, /*rank=*/1).ok());
  EXPECT_FALSE(tl.active());
  FullAllreduce(tl, "x", 2);
  tl.MarkCycleStart();
  tl.Stop();
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "a non-coordinator created " << path;
}

TEST_F(TimelineTest, StartErrors) {
  Timeline tl;
  Status s = tl.Start("/nonexistent-dir-hvdc/timeline.json", false, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/nonexistent-dir-hvdc/timeline.json"), std::string::npos)
      << s.message();
  EXPECT_FALSE(tl.active());
  EXPECT_EQ(tl.Start("", false, 0).code(), StatusCode::kInvalidArgument);

  std::string path = NewPath("twice");
  ASSERT_TRUE(tl.Start(path, false, 0).ok());
  s = tl.Start(NewPath("second"), false, 0);
  EXPECT_EQ(s.code(), StatusCode::kPreconditionError);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_TRUE(tl.active());
  tl.Stop();
}

TEST_F(TimelineTest, RestartWritesAFreshFile) {
  Timeline tl;
  std::string first = NewPath("first");
  std::string second = NewPath("second");
  ASSERT_TRUE(tl.Start(first, false, 0).ok());
  FullAllreduce(tl, "a", 1);
  tl.Stop();
  tl.Stop();                        // idempotent
  FullAllreduce(tl, "dropped", 1);  // after Stop: ignored
  ASSERT_TRUE(tl.Start(second, false, 0).ok());
  FullAllreduce(tl, "b", 1);
  tl.Stop();

  Trace t1, t2;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(first, &t1));
  ASSERT_NO_FATAL_FAILURE(LoadTrace(second, &t2));
  EXPECT_EQ(t1.rows.size(), 1u);
  EXPECT_EQ(t1.rows["a"], FullAllreduceRow(1));
  EXPECT_EQ(t2.rows.size(), 1u);
  EXPECT_EQ(t2.rows["b"], FullAllreduceRow(1));
  EXPECT_EQ(t2.row_names[1], "b");
}

TEST_F(TimelineTest, MisorderedCallsStillGiveABalancedFile) {
  std::string path = NewPath("misordered");
  Timeline tl;
  ASSERT_TRUE(tl.Start(path, /*mark_cycles=*/false, 0).ok());
  tl.MarkCycleStart();  // not marked: mark_cycles is off
  tl.ActivityEnd("a");  // nothing open: dropped
  tl.NegotiateEnd("a");
  tl.OpEnd("a");
  tl.NegotiateStart("a", OpType::kAllgather);
  tl.OpStart("a", OpType::kAllgather);  // closes the negotiation
  tl.ActivityStart("a", "X");
  tl.ActivityStart("a", "Y");  // closes X
  tl.OpEnd("a");               // closes Y and the op
  tl.OpStart("b", OpType::kAlltoall);
  tl.ActivityStart("b", "Z");  // left open: Stop closes both
  tl.NegotiateStart("c", OpType::kReducescatter);
  tl.Stop();

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  EXPECT_EQ(trace.cycles, 0);
  EXPECT_EQ(trace.rows["a"], (std::vector<std::string>{"B:NEGOTIATE_ALLGATHER", "E", "B:ALLGATHER",
                                                       "B:X", "E", "B:Y", "E", "E"}));
  EXPECT_EQ(trace.rows["b"], (std::vector<std::string>{"B:ALLTOALL", "B:Z", "E", "E"}));
  EXPECT_EQ(trace.rows["c"], (std::vector<std::string>{"B:NEGOTIATE_REDUCESCATTER", "E"}));
}

TEST_F(TimelineTest, TensorNamesAreEscaped) {
  std::string path = NewPath("names");
  Timeline tl;
  ASSERT_TRUE(tl.Start(path, false, 0).ok());
  const std::vector<std::string> names = {"quote\"d", "back\\slash", "new\nline\ttab\x01",
                                          "caf\xc3\xa9 \xe2\x82\xac", "slash/ok"};
  for (const std::string& n : names) FullAllreduce(tl, n, 1);
  FullAllreduce(tl,
                "bad\xff"
                "byte\xc3",
                1);
  tl.ActivityStart("act", "ACT\"IVITY");
  tl.Stop();

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  for (const std::string& n : names) EXPECT_EQ(trace.rows.count(n), 1u) << n;
  EXPECT_EQ(trace.rows.count("bad\xef\xbf\xbd"
                             "byte\xef\xbf\xbd"),
            1u);
  EXPECT_EQ(trace.rows["act"], (std::vector<std::string>{"B:ACT\"IVITY", "E"}));
}

TEST_F(TimelineTest, FileIsAnOpenArrayWhileRunning) {
  std::string path = NewPath("running");
  Timeline tl;
  ASSERT_TRUE(tl.Start(path, false, 0).ok());
  FullAllreduce(tl, "early", 1);
  // The writer flushes within its interval; wait for it without a fixed sleep.
  std::string text;
  for (int i = 0; i < 500 && text.find("ALLREDUCE") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    text = ReadFile(path);
  }
  ASSERT_NE(text.find("NEGOTIATE_ALLREDUCE"), std::string::npos) << text;
  EXPECT_EQ(text.front(), '[');
  EXPECT_EQ(text.find(']'), std::string::npos) << "closed before Stop()";
  tl.Stop();
  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  EXPECT_EQ(trace.rows["early"], FullAllreduceRow(1));
}

TEST_F(TimelineTest, StopWithoutEventsGivesAnEmptyArray) {
  std::string path = NewPath("empty");
  {
    Timeline tl;
    ASSERT_TRUE(tl.Start(path, true, 0).ok());
  }  // the destructor stops
  Trace trace;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &trace));
  EXPECT_TRUE(trace.rows.empty());
  Timeline never_started;
  never_started.Stop();
  FullAllreduce(never_started, "ignored", 1);
}

TEST_F(TimelineTest, StartAndStopRaceWithEvents) {
  Timeline tl;
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&tl, &done, t] {
      int i = 0;
      while (!done.load()) {
        FullAllreduce(tl, "r" + std::to_string(t) + "_" + std::to_string(i++), 2);
        if (i % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  std::vector<std::string> files;
  for (int k = 0; k < 5; ++k) {
    files.push_back(NewPath("race"));
    ASSERT_TRUE(tl.Start(files.back(), true, 0).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto t0 = std::chrono::steady_clock::now();
    tl.Stop();
    std::printf("stop %lld ms\n", (long long)std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now() - t0)
                                      .count());
  }
  done = true;
  for (auto& th : threads) th.join();
  for (const std::string& f : files) {
    Trace trace;
    ASSERT_NO_FATAL_FAILURE(LoadTrace(f, &trace));
  }
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
