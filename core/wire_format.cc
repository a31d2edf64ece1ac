#include "core/wire_format.h"

#include <cstring>

namespace hvdc {
namespace {

enum class Kind : uint8_t { kRequestList = 1, kResponseList = 2 };
constexpr uint32_t kMaxCount = 1u << 24;  // no honest message holds more elements than this

class Writer {
 public:
  void U8(uint8_t v) { Raw(&v, 1); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void I32(int32_t v) { Raw(&v, 4); }
  void I64(int64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  template <typename T>
  void Vec(const std::vector<T>& v) {
    U32(static_cast<uint32_t>(v.size()));
    Raw(v.data(), v.size() * sizeof(T));
  }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : data_(in.data()), left_(in.size()) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool I32(int32_t* v) { return Raw(v, 4); }
  bool I64(int64_t* v) { return Raw(v, 8); }
  bool F64(double* v) { return Raw(v, 8); }
  bool Bool(bool* v) {
    uint8_t b;
    if (!U8(&b) || b > 1) return false;
    *v = b != 0;
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > left_) return false;
    s->assign(data_, n);
    Skip(n);
    return true;
  }
  template <typename T>
  bool Vec(std::vector<T>* v) {
    uint32_t n;
    if (!U32(&n) || n > kMaxCount || static_cast<size_t>(n) * sizeof(T) > left_) return false;
    v->resize(n);
    return Raw(v->data(), n * sizeof(T));
  }
  template <typename E>
  bool Enum(E* e, bool (*valid)(int32_t)) {
    int32_t v;
    if (!I32(&v) || !valid(v)) return false;
    *e = static_cast<E>(v);
    return true;
  }
  bool AtEnd() const { return left_ == 0; }

 private:
  bool Raw(void* p, size_t n) {
    if (n > left_) return false;
    if (n) std::memcpy(p, data_, n);
    Skip(n);
    return true;
  }
  void Skip(size_t n) {
    data_ += n;
    left_ -= n;
  }
  const char* data_;
  size_t left_;
};

bool ValidStatusCode(int32_t v) {
  return v >= 0 && v <= static_cast<int32_t>(StatusCode::kPeerLost);
}

void WriteHeader(Writer* w, Kind kind) {
  w->U32(kWireMagic);
  w->U16(kWireVersion);
  w->U8(static_cast<uint8_t>(kind));
}

Status ReadHeader(Reader* r, Kind kind) {
  uint32_t magic;
  uint16_t version;
  uint8_t k;
  if (!r->U32(&magic) || !r->U16(&version) || !r->U8(&k)) {
    return Status::UnknownError("negotiation message truncated in its header");
  }
  if (magic != kWireMagic) return Status::UnknownError("negotiation message has a bad magic");
  if (version != kWireVersion) {
    return Status::UnknownError("negotiation message has wire version " + std::to_string(version) +
                                ", this build speaks " + std::to_string(kWireVersion) +
                                " (mixed horovod_compat versions across ranks?)");
  }
  if (k != static_cast<uint8_t>(kind)) return Status::UnknownError("unexpected message kind");
  return Status::OK();
}

Status Corrupt(const char* what) {
  return Status::UnknownError(std::string("negotiation message is truncated or corrupted (") +
                              what + ")");
}

}  // namespace

std::string SerializeRequestList(const RequestList& list) {
  Writer w;
  WriteHeader(&w, Kind::kRequestList);
  w.I32(list.rank);
  w.U8(list.shutdown);
  w.U32(static_cast<uint32_t>(list.requests.size()));
  for (const Request& q : list.requests) {
    w.I32(static_cast<int32_t>(q.op));
    w.I32(static_cast<int32_t>(q.dtype));
    w.Str(q.name);
    w.Vec(q.shape);
    w.I32(q.device);
    w.I32(q.root_rank);
    w.I32(static_cast<int32_t>(q.reduce_op));
    w.F64(q.prescale);
    w.F64(q.postscale);
    w.Vec(q.splits);
    w.I32(q.group_size);
    w.Str(q.group);
  }
  return w.Take();
}

Status ParseRequestList(const std::string& bytes, RequestList* out) {
  Reader r(bytes);
  HVDC_RETURN_IF_ERROR(ReadHeader(&r, Kind::kRequestList));
  RequestList list;
  uint32_t n;
  if (!r.I32(&list.rank) || !r.Bool(&list.shutdown) || !r.U32(&n)) return Corrupt("list header");
  if (n > kMaxCount) return Corrupt("request count");
  for (uint32_t i = 0; i < n; ++i) {
    Request q;
    if (!r.Enum(&q.op, IsValidOpType) || !r.Enum(&q.dtype, IsValidDataType) || !r.Str(&q.name) ||
        !r.Vec(&q.shape) || !r.I32(&q.device) || !r.I32(&q.root_rank) ||
        !r.Enum(&q.reduce_op, IsValidReduceOp) || !r.F64(&q.prescale) || !r.F64(&q.postscale) ||
        !r.Vec(&q.splits) || !r.I32(&q.group_size) || !r.Str(&q.group)) {
      return Corrupt("request");
    }
    list.requests.push_back(std::move(q));
  }
  if (!r.AtEnd()) return Corrupt("trailing bytes");
  *out = std::move(list);
  return Status::OK();
}

std::string SerializeResponseList(const ResponseList& list) {
  Writer w;
  WriteHeader(&w, Kind::kResponseList);
  w.U8(list.shutdown);
  w.Str(list.shutdown_reason);
  w.I32(static_cast<int32_t>(list.shutdown_code));
  w.U32(static_cast<uint32_t>(list.responses.size()));
  for (const Response& p : list.responses) {
    w.I32(static_cast<int32_t>(p.op));
    w.Str(p.name);
    w.I32(static_cast<int32_t>(p.dtype));
    w.I32(p.device);
    w.I32(static_cast<int32_t>(p.reduce_op));
    w.F64(p.prescale);
    w.F64(p.postscale);
    w.I32(p.root_rank);
    w.Vec(p.shape);
    w.Vec(p.first_dims);
    w.Vec(p.splits);
    w.I32(p.last_joined_rank);
    w.I32(p.group_size);
    w.Str(p.group);
    w.I32(static_cast<int32_t>(p.error_code));
    w.Str(p.error_message);
  }
  return w.Take();
}

Status ParseResponseList(const std::string& bytes, ResponseList* out) {
  Reader r(bytes);
  HVDC_RETURN_IF_ERROR(ReadHeader(&r, Kind::kResponseList));
  ResponseList list;
  uint32_t n;
  if (!r.Bool(&list.shutdown) || !r.Str(&list.shutdown_reason) ||
      !r.Enum(&list.shutdown_code, ValidStatusCode) || !r.U32(&n)) {
    return Corrupt("list header");
  }
  if (n > kMaxCount) return Corrupt("response count");
  for (uint32_t i = 0; i < n; ++i) {
    Response p;
    if (!r.Enum(&p.op, IsValidOpType) || !r.Str(&p.name) || !r.Enum(&p.dtype, IsValidDataType) ||
        !r.I32(&p.device) || !r.Enum(&p.reduce_op, IsValidReduceOp) || !r.F64(&p.prescale) ||
        !r.F64(&p.postscale) || !r.I32(&p.root_rank) || !r.Vec(&p.shape) || !r.Vec(&p.first_dims) ||
        !r.Vec(&p.splits) || !r.I32(&p.last_joined_rank) || !r.I32(&p.group_size) ||
        !r.Str(&p.group) || !r.Enum(&p.error_code, ValidStatusCode) || !r.Str(&p.error_message)) {
      return Corrupt("response");
    }
    list.responses.push_back(std::move(p));
  }
  if (!r.AtEnd()) return Corrupt("trailing bytes");
  *out = std::move(list);
  return Status::OK();
}

}  // namespace hvdc
