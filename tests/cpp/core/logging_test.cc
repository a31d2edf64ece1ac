// Logging: level filtering, line format, lazy evaluation. Captures stderr into a file.
#include "core/logging.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hvdc {
namespace {

// Redirects fd 2 to a temporary file for its lifetime; Text() returns what was written.
class StderrCapture {
 public:
  StderrCapture() {
    path_ = ::testing::TempDir() + "hvdc_logging_test_" + std::to_string(::getpid()) + ".txt";
    int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    EXPECT_GE(fd, 0);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() {
    Restore();
    std::remove(path_.c_str());
  }
  std::string Text() {
    Restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

class LoggingTest : public ::testing::Test {
 protected:
  void TearDown() override { SetLogOptions(LogLevel::kWarning, false, -1); }
};

TEST_F(LoggingTest, FiltersByLevelAndFormatsLines) {
  SetLogOptions(LogLevel::kInfo, /*hide_time=*/true, /*rank=*/3);
  EXPECT_FALSE(LogEnabled(LogLevel::kDebug));
  EXPECT_TRUE(LogEnabled(LogLevel::kInfo));
  EXPECT_EQ(GetLogLevel(), LogLevel::kInfo);
  StderrCapture capture;
  LogTrace("trace {}", 1);
  LogDebug("debug {}", 2);
  LogInfo("info {}", 3);
  LogWarning("warning {}", "x");
  LogError("error {:.1f}", 1.25);
  LogFatal("fatal");
  HVDC_LOG_DEBUG("macro debug {}", 4);
  HVDC_LOG_WARNING("macro warning {}", 5);
  EXPECT_EQ(capture.Text(),
            "[hvdc] [rank 3] INFO: info 3\n"
            "[hvdc] [rank 3] WARNING: warning x\n"
            "[hvdc] [rank 3] ERROR: error 1.2\n"
            "[hvdc] [rank 3] FATAL: fatal\n"
            "[hvdc] [rank 3] WARNING: macro warning 5\n");
}

// Every digit as '#' (collapse: every run of digits as one '#'), to compare text with variable
// numbers against a fixed pattern.
std::string DigitsAsHash(const std::string& text, bool collapse) {
  std::string out;
  for (char c : text) {
    const bool digit = c >= '0' && c <= '9';
    if (!digit) {
      out += c;
    } else if (!collapse || out.empty() || out.back() != '#') {
      out += '#';
    }
  }
  return out;
}

TEST_F(LoggingTest, TimestampAndNoRank) {
  SetLogOptions(LogLevel::kTrace, /*hide_time=*/false, /*rank=*/-1);
  StderrCapture capture;
  LogTrace("hello");
  std::string text = capture.Text();
  EXPECT_EQ(DigitsAsHash(text, /*collapse=*/false),
            "[####-##-## ##:##:##.###] [hvdc] TRACE: hello\n")
      << text;
}

TEST_F(LoggingTest, MacrosDoNotEvaluateArgumentsWhenDisabled) {
  SetLogOptions(LogLevel::kError, true, 0);
  int calls = 0;
  auto expensive = [&calls]() {
    ++calls;
    return 42;
  };
  StderrCapture capture;
  HVDC_LOG_INFO("value {}", expensive());
  EXPECT_EQ(calls, 0);
  HVDC_LOG_ERROR("value {}", expensive());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(capture.Text(), "[hvdc] [rank 0] ERROR: value 42\n");
}

TEST_F(LoggingTest, ConcurrentLinesStayWhole) {
  SetLogOptions(LogLevel::kInfo, true, 1);
  StderrCapture capture;
  const std::string payload(3000, 'p');  // longer than some pipes' atomic write size
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &payload] {
      for (int i = 0; i < 50; ++i) LogInfo("t{} i{} {}", t, i, payload);
    });
  }
  for (auto& th : threads) th.join();
  std::istringstream lines(capture.Text());
  std::string l;
  int count = 0;
  while (std::getline(lines, l)) {
    ASSERT_GT(l.size(), payload.size());
    size_t head_len = l.size() - payload.size();
    EXPECT_EQ(l.rfind("[hvdc] [rank 1] INFO: t", 0), 0u) << l.substr(0, 80);
    EXPECT_EQ(DigitsAsHash(l.substr(0, head_len), /*collapse=*/true),
              "[hvdc] [rank #] INFO: t# i# ")
        << l.substr(0, 80);
    EXPECT_EQ(l.substr(head_len), payload);
    ++count;
  }
  EXPECT_EQ(count, 200);
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
