#include "core/timeline.h"

#include <fmt/format.h>

#include <cerrno>
#include <iterator>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/logging.h"

namespace hvdc {
namespace {

// The writer batches: it wakes when the queue becomes non-empty, then waits this long (or until
// kWakeBatch events are queued) so that one write carries many events.
constexpr auto kFlushInterval = std::chrono::milliseconds(100);
constexpr size_t kWakeBatch = 4096;

// Length of the valid UTF-8 sequence at s[i], or 0 when s[i] does not start one.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  size_t len;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  uint32_t cp = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// Appends s as a JSON string literal; bytes that are not valid UTF-8 become U+FFFD, so the file
// stays valid JSON whatever a tensor is called.
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (c == '\n') {
      out->append("\\n");
      ++i;
    } else if (c == '\t') {
      out->append("\\t");
      ++i;
    } else if (c < 0x20) {
      fmt::format_to(std::back_inserter(*out), "\\u{:04x}", c);
      ++i;
    } else if (c < 0x80) {
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (size_t len = Utf8SequenceLength(s, i); len > 0) {
      out->append(s.data() + i, len);
      i += len;
    } else {
      out->append("\\ufffd");
      ++i;
    }
  }
  out->push_back('"');
}

}  // namespace

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path, bool mark_cycles, int rank) {
  std::lock_guard<std::mutex> life(lifecycle_mu_);
  if (writer_.joinable()) {
    return Status::PreconditionError(
        fmt::format("the timeline is already being written to '{}'", path_));
  }
  if (rank != 0) return Status::OK();  // only the coordinator writes
  if (path.empty()) return Status::InvalidArgument("the timeline file name is empty");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    std::string reason = std::error_code(errno, std::generic_category()).message();
    return Status::InvalidArgument(
        fmt::format("cannot create the timeline file '{}': {}", path, reason));
  }

  // The writer thread does not exist yet, so its fields can be reset without a lock.
  file_ = file;
  path_ = path;
  first_record_ = true;
  write_failed_ = false;
  next_pid_ = 1;
  rows_.clear();
  pending_ = "[\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    accepting_ = true;
    stopping_ = false;
    start_time_ = std::chrono::steady_clock::now();
  }
  mark_cycles_.store(mark_cycles, std::memory_order_relaxed);
  writer_ = std::thread(&Timeline::WriterLoop, this);
  active_.store(true, std::memory_order_relaxed);
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> life(lifecycle_mu_);
  if (!writer_.joinable()) return;
  active_.store(false, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stopping_ = true;
  }
  cv_.notify_one();
  writer_.join();
}

void Timeline::Push(EventKind kind, const std::string& tensor, int32_t arg, const char* activity) {
  Event e{kind, arg, 0, tensor, activity != nullptr ? std::string(activity) : std::string()};
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) return;
    // Taken under the lock so that the queue (and so each row) is in timestamp order.
    e.ts_us = std::chrono::duration_cast<std::chrono::microseconds>(
                  std::chrono::steady_clock::now() - start_time_)
                  .count();
    queue_.push_back(std::move(e));
    wake = queue_.size() == 1 || queue_.size() == kWakeBatch;
  }
  if (wake) cv_.notify_one();
}

void Timeline::NegotiateStart(const std::string& tensor, OpType op) {
  if (!active()) return;
  Push(EventKind::kNegotiateStart, tensor, static_cast<int32_t>(op), nullptr);
}

void Timeline::NegotiateRankReady(const std::string& tensor, int rank) {
  if (!active()) return;
  Push(EventKind::kRankReady, tensor, rank, nullptr);
}

void Timeline::NegotiateEnd(const std::string& tensor) {
  if (!active()) return;
  Push(EventKind::kNegotiateEnd, tensor, 0, nullptr);
}

void Timeline::OpStart(const std::string& tensor, OpType op) {
  if (!active()) return;
  Push(EventKind::kOpStart, tensor, static_cast<int32_t>(op), nullptr);
}

void Timeline::ActivityStart(const std::string& tensor, const char* activity) {
  if (!active()) return;
  Push(EventKind::kActivityStart, tensor, 0, activity != nullptr ? activity : "UNKNOWN");
}

void Timeline::ActivityEnd(const std::string& tensor) {
  if (!active()) return;
  Push(EventKind::kActivityEnd, tensor, 0, nullptr);
}

void Timeline::OpEnd(const std::string& tensor) {
  if (!active()) return;
  Push(EventKind::kOpEnd, tensor, 0, nullptr);
}

void Timeline::MarkCycleStart() {
  if (!active() || !mark_cycles_.load(std::memory_order_relaxed)) return;
  Push(EventKind::kCycle, std::string(), 0, nullptr);
}

void Timeline::WriterLoop() {
  std::vector<Event> batch;
  bool stopping = false;
  while (!stopping) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      cv_.wait_for(lock, kFlushInterval,
                   [this] { return stopping_ || queue_.size() >= kWakeBatch; });
      batch.swap(queue_);
      stopping = stopping_;
    }
    for (const Event& e : batch) WriteEvent(e);
    batch.clear();
    Flush();
  }

  // Stop(): accepting_ went false together with stopping_, so the queue is final. Close every
  // row left open so that each begin has its end, then terminate the array.
  int64_t now_us;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::steady_clock::now() - start_time_)
                 .count();
  }
  for (auto& [name, row] : rows_) {
    while (!row.open.empty()) End(row, now_us);
  }
  pending_ += "\n]\n";
  Flush();
  if (std::fclose(file_) != 0 && !write_failed_) {
    LogError("timeline: closing '{}' failed; the file may be incomplete", path_);
  }
  file_ = nullptr;
  rows_.clear();
}

Timeline::Row& Timeline::RowFor(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  Row& row = rows_[tensor];
  row.pid = next_pid_++;
  // Name the row (process and its one thread) and keep rows in order of first appearance.
  for (const char* meta : {"process_name", "thread_name"}) {
    Separator();
    fmt::format_to(std::back_inserter(pending_), R"({{"name":"{}","ph":"M","pid":{},"tid":0,)",
                   meta, row.pid);
    pending_ += R"("args":{"name":)";
    AppendJsonString(&pending_, tensor);
    pending_ += "}}";
  }
  Separator();
  fmt::format_to(std::back_inserter(pending_),
                 R"({{"name":"process_sort_index","ph":"M","pid":{},"tid":0,)"
                 R"("args":{{"sort_index":{}}}}})",
                 row.pid, row.pid);
  return row;
}

void Timeline::Separator() {
  if (!first_record_) pending_ += ",\n";
  first_record_ = false;
}

void Timeline::Begin(Row& row, Level level, const std::string& name, int64_t ts) {
  Separator();
  pending_ += R"({"name":)";
  AppendJsonString(&pending_, name);
  fmt::format_to(std::back_inserter(pending_), R"(,"ph":"B","ts":{},"pid":{},"tid":0}})", ts,
                 row.pid);
  row.open.push_back(level);
}

void Timeline::End(Row& row, int64_t ts) {
  Separator();
  fmt::format_to(std::back_inserter(pending_), R"({{"ph":"E","ts":{},"pid":{},"tid":0}})", ts,
                 row.pid);
  row.open.pop_back();
}

void Timeline::WriteEvent(const Event& e) {
  if (e.kind == EventKind::kCycle) {
    Separator();
    fmt::format_to(std::back_inserter(pending_),
                   R"({{"name":"CYCLE_START","ph":"i","s":"g","ts":{},"pid":0,"tid":0}})", e.ts_us);
    return;
  }
  Row& row = RowFor(e.tensor);
  auto top_is = [&row](Level l) { return !row.open.empty() && row.open.back() == l; };
  auto close_until = [&](Level level) {  // closes up to and including `level`, if it is open
    bool found = false;
    for (Level l : row.open) found = found || l == level;
    if (!found) return;
    while (true) {
      Level l = row.open.back();
      End(row, e.ts_us);
      if (l == level) return;
    }
  };
  auto op_name = [&e]() { return std::string(OpTypeName(static_cast<OpType>(e.arg))); };
  switch (e.kind) {
    case EventKind::kNegotiateStart:
      if (top_is(Level::kNegotiate)) break;  // called once per submitting rank
      while (!row.open.empty()) End(row, e.ts_us);
      Begin(row, Level::kNegotiate, "NEGOTIATE_" + op_name(), e.ts_us);
      break;
    case EventKind::kRankReady:
      Separator();
      fmt::format_to(std::back_inserter(pending_),
                     R"({{"name":"{}","ph":"i","s":"t","ts":{},"pid":{},"tid":0,)"
                     R"("args":{{"rank":{}}}}})",
                     e.arg, e.ts_us, row.pid, e.arg);
      break;
    case EventKind::kNegotiateEnd:
      if (top_is(Level::kNegotiate)) End(row, e.ts_us);
      break;
    case EventKind::kOpStart:
      while (!row.open.empty()) End(row, e.ts_us);
      Begin(row, Level::kOp, op_name(), e.ts_us);
      break;
    case EventKind::kActivityStart:
      if (top_is(Level::kActivity)) End(row, e.ts_us);
      Begin(row, Level::kActivity, e.activity, e.ts_us);
      break;
    case EventKind::kActivityEnd:
      if (top_is(Level::kActivity)) End(row, e.ts_us);
      break;
    case EventKind::kOpEnd:
      close_until(Level::kOp);
      break;
    case EventKind::kCycle:
      break;
  }
}

void Timeline::Flush() {
  if (pending_.empty()) return;
  if (!write_failed_) {
    size_t n = std::fwrite(pending_.data(), 1, pending_.size(), file_);
    if (n != pending_.size() || std::fflush(file_) != 0) {
      write_failed_ = true;
      LogError("timeline: writing '{}' failed ({}); no further events are recorded", path_,
               std::error_code(errno, std::generic_category()).message());
    }
  }
  pending_.clear();
}

}  // namespace hvdc
