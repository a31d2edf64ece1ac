// Segment: one POSIX shared-memory segment of a process set, mapped into this process.
//
// Per job and per user: the name carries the uid and a random job id, the creator opens it with
// O_CREAT | O_EXCL and mode 0600 (an existing segment of that name -- stale or someone else's --
// is refused, never reused), reserves every page up front (a /dev/shm too small fails here, not
// with SIGBUS later) and writes a header that every attacher checks (magic, version, owner, size,
// job id, rank count). The name is unlinked by the creator as soon as every peer has attached
// (shm_transport.cc), so no exit leaves anything in /dev/shm after that point.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/status.h"
#include "shm_controller/shm_layout.h"

namespace hvdc {
namespace shm {

struct SegmentSpec {
  uint64_t job_id = 0;
  int nranks = 0;
  int64_t bytes = 0;  // total size, header included
};

// "/hvdc-<uid>-<job id hex>-<index>": index tells apart the process sets of one job.
std::string SegmentName(uint64_t job_id, int index);

class Segment {
 public:
  // Errors are PreconditionError with the reason (the caller falls back and logs it).
  static Status Create(const std::string& name, const SegmentSpec& spec,
                       std::unique_ptr<Segment>* out);
  static Status Attach(const std::string& name, const SegmentSpec& spec,
                       std::unique_ptr<Segment>* out);
  // Removes the name (mappings stay valid). Absent already is fine.
  static void Unlink(const std::string& name);

  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const std::string& name() const { return name_; }  // unlinked soon after creation
  uint8_t* base() const { return base_; }
  int64_t bytes() const { return bytes_; }
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }

 private:
  Segment(std::string name, uint8_t* base, int64_t bytes)
      : name_(std::move(name)), base_(base), bytes_(bytes) {}
  std::string name_;
  uint8_t* base_;
  int64_t bytes_;
};

}  // namespace shm
}  // namespace hvdc
