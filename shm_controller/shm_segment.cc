#include "shm_controller/shm_segment.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hvdc {
namespace shm {
namespace {

Status Refused(const std::string& name, const std::string& why) {
  return Status::PreconditionError(fmt::format("shared-memory segment {}: {}", name, why));
}

std::string Errno(const char* call) { return fmt::format("{}: {}", call, std::strerror(errno)); }

// Closes the descriptor on every path; the mapping outlives it.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::string SegmentName(uint64_t job_id, int index) {
  return fmt::format("/hvdc-{}-{:016x}-{}", static_cast<unsigned>(geteuid()), job_id, index);
}

Status Segment::Create(const std::string& name, const SegmentSpec& spec,
                       std::unique_ptr<Segment>* out) {
  const int64_t slot = SlotBytes(spec.bytes, spec.nranks);
  if (slot == 0) {
    return Refused(name, fmt::format("{} bytes cannot hold a useful slot for {} ranks", spec.bytes,
                                     spec.nranks));
  }
  // A quick refusal when /dev/shm cannot hold it at all (the reservation below is the real test).
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs) == 0 &&
      static_cast<uint64_t>(spec.bytes) > static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize) {
    return Refused(name,
                   fmt::format("/dev/shm has {} bytes free, {} needed",
                               static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize, spec.bytes));
  }
  Fd fd(shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  if (fd.get() < 0) {
    return Refused(name, errno == EEXIST ? "exists already (stale or foreign): not reused"
                                         : Errno("shm_open"));
  }
  // Reserve every page now: on tmpfs a plain ftruncate is sparse and a full /dev/shm would turn
  // the first touch of a page into SIGBUS.
  const int err = posix_fallocate(fd.get(), 0, spec.bytes);
  if (err != 0) {
    Unlink(name);
    return Refused(name, fmt::format("reserving {} bytes: {}", spec.bytes, std::strerror(err)));
  }
  void* p = mmap(nullptr, static_cast<size_t>(spec.bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd.get(), 0);
  if (p == MAP_FAILED) {
    Unlink(name);
    return Refused(name, Errno("mmap"));
  }
  auto* h = static_cast<SegmentHeader*>(p);
  std::memcpy(h->magic, kMagic, sizeof(kMagic));
  h->version = kVersion;
  h->nranks = static_cast<uint32_t>(spec.nranks);
  h->job_id = spec.job_id;
  h->total_bytes = static_cast<uint64_t>(spec.bytes);
  h->desc_bytes = static_cast<uint64_t>(DescBytes(spec.nranks));
  h->slot_bytes = static_cast<uint64_t>(slot);
  h->creator_uid = geteuid();
  __atomic_store_n(&h->aborted, 0, __ATOMIC_RELEASE);
  out->reset(new Segment(name, static_cast<uint8_t*>(p), spec.bytes));
  return Status::OK();
}

Status Segment::Attach(const std::string& name, const SegmentSpec& spec,
                       std::unique_ptr<Segment>* out) {
  Fd fd(shm_open(name.c_str(), O_RDWR, 0));
  if (fd.get() < 0) return Refused(name, Errno("shm_open"));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Refused(name, Errno("fstat"));
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return Refused(name, fmt::format("owned by uid {} with mode {:o}: not this user's",
                                     static_cast<unsigned>(st.st_uid), st.st_mode & 0777));
  }
  if (st.st_size != spec.bytes) {
    return Refused(
        name, fmt::format("{} bytes, expected {}", static_cast<int64_t>(st.st_size), spec.bytes));
  }
  void* p = mmap(nullptr, static_cast<size_t>(spec.bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd.get(), 0);
  if (p == MAP_FAILED) return Refused(name, Errno("mmap"));
  std::unique_ptr<Segment> seg(new Segment(name, static_cast<uint8_t*>(p), spec.bytes));
  const SegmentHeader* h = seg->header();
  if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0 || h->version != kVersion) {
    return Refused(name, "not a segment of this version of the runtime");
  }
  if (h->job_id != spec.job_id || h->nranks != static_cast<uint32_t>(spec.nranks) ||
      h->total_bytes != static_cast<uint64_t>(spec.bytes) || h->creator_uid != geteuid()) {
    return Refused(name, fmt::format("belongs to another job (job id {:016x}, {} ranks)", h->job_id,
                                     h->nranks));
  }
  *out = std::move(seg);
  return Status::OK();
}

void Segment::Unlink(const std::string& name) { shm_unlink(name.c_str()); }

Segment::~Segment() { munmap(base_, static_cast<size_t>(bytes_)); }

}  // namespace shm
}  // namespace hvdc
