#include <cstdlib>
#include <new>

#include "core/backend.h"

namespace hvdc {

void FusionBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

uint8_t* FusionBuffer::Reserve(int64_t bytes) {
  if (bytes <= capacity_) return data_.get();
  int64_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, static_cast<size_t>(rounded));
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
  capacity_ = rounded;
  return data_.get();
}

}  // namespace hvdc
