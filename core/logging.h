// Logging through fmt. One line per call, written to stderr with a single write:
//   [2026-11-22 10:00:00.123] [hvdc] [rank 1] WARNING: message
// (no time when hidden, no rank before SetLogOptions gives one). A message below the level is
// never formatted: the level is an atomic checked first. The HVDC_LOG_* macros also skip
// evaluating their arguments; the Log* functions evaluate them but do not format.
// Fatal is only the highest level: it does not abort.
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "core/config.h"

namespace hvdc {

// Process-wide (the runtime calls it at init). rank < 0 leaves "[rank N]" out. Thread-safe.
void SetLogOptions(LogLevel level, bool hide_time, int rank);
LogLevel GetLogLevel();
bool LogEnabled(LogLevel level);  // one relaxed atomic load
// Writes one already-formatted message at `level` (no level check).
void LogMessage(LogLevel level, std::string_view message);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!LogEnabled(level)) return;
  LogMessage(level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void LogTrace(fmt::format_string<Args...> format, Args&&... args) {
  Log(LogLevel::kTrace, format, std::forward<Args>(args)...);
}
template <typename... Args>
void LogDebug(fmt::format_string<Args...> format, Args&&... args) {
  Log(LogLevel::kDebug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void LogInfo(fmt::format_string<Args...> format, Args&&... args) {
  Log(LogLevel::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void LogWarning(fmt::format_string<Args...> format, Args&&... args) {
  Log(LogLevel::kWarning, format, std::forward<Args>(args)...);
}
template <typename... Args>
void LogError(fmt::format_string<Args...> format, Args&&... args) {
  Log(LogLevel::kError, format, std::forward<Args>(args)...);
}
template <typename... Args>
void LogFatal(fmt::format_string<Args...> format, Args&&... args) {
  Log(LogLevel::kFatal, format, std::forward<Args>(args)...);
}

}  // namespace hvdc

#define HVDC_LOG_AT(level, ...)                            \
  do {                                                     \
    if (::hvdc::LogEnabled(level)) {                       \
      ::hvdc::LogMessage(level, fmt::format(__VA_ARGS__)); \
    }                                                      \
  } while (0)

#define HVDC_LOG_TRACE(...) HVDC_LOG_AT(::hvdc::LogLevel::kTrace, __VA_ARGS__)
#define HVDC_LOG_DEBUG(...) HVDC_LOG_AT(::hvdc::LogLevel::kDebug, __VA_ARGS__)
#define HVDC_LOG_INFO(...) HVDC_LOG_AT(::hvdc::LogLevel::kInfo, __VA_ARGS__)
#define HVDC_LOG_WARNING(...) HVDC_LOG_AT(::hvdc::LogLevel::kWarning, __VA_ARGS__)
#define HVDC_LOG_ERROR(...) HVDC_LOG_AT(::hvdc::LogLevel::kError, __VA_ARGS__)
#define HVDC_LOG_FATAL(...) HVDC_LOG_AT(::hvdc::LogLevel::kFatal, __VA_ARGS__)
