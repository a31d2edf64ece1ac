#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <iterator>
#include <mutex>

namespace hvdc {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<bool> g_hide_time{false};
std::atomic<int> g_rank{-1};
// Serializes the write loop, so a line longer than a pipe's atomic size is still never split by
// another thread's line in this process.
std::mutex g_write_mu;

const char* LevelTag(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kFatal:
      return "FATAL";
  }
  return "UNKNOWN";
}

}  // namespace

void SetLogOptions(LogLevel level, bool hide_time, int rank) {
  g_hide_time.store(hide_time, std::memory_order_relaxed);
  g_rank.store(rank, std::memory_order_relaxed);
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

void LogMessage(LogLevel level, std::string_view message) {
  fmt::memory_buffer line;
  auto out = std::back_inserter(line);
  if (!g_hide_time.load(std::memory_order_relaxed)) {
    auto now = std::chrono::system_clock::now();
    std::time_t secs = std::chrono::system_clock::to_time_t(now);
    auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
    std::tm tm{};
    localtime_r(&secs, &tm);
    fmt::format_to(out, "[{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}] ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   static_cast<int>(millis.count()));
  }
  fmt::format_to(out, "[hvdc] ");
  int rank = g_rank.load(std::memory_order_relaxed);
  if (rank >= 0) fmt::format_to(out, "[rank {}] ", rank);
  fmt::format_to(out, "{}: {}", LevelTag(level), message);
  if (line.size() == 0 || line.data()[line.size() - 1] != '\n') line.push_back('\n');

  std::lock_guard<std::mutex> lock(g_write_mu);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // stderr is gone; nothing sensible to do
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace hvdc
