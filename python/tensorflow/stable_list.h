// StableList: an append-only list whose elements never move (references stay valid), holding its
// first element inline. A kernel call usually has one request, one name and no allocator: those
// then cost no allocation at all (a std::deque allocates its map and a 512-byte block even when
// empty).
#ifndef HVDC_PYTHON_TENSORFLOW_STABLE_LIST_H_
#define HVDC_PYTHON_TENSORFLOW_STABLE_LIST_H_

#include <cstddef>
#include <list>
#include <optional>
#include <utility>

namespace hvdc_tf {

template <typename T>
class StableList {
 public:
  T& push_back(T value) {
    ++size_;
    if (!first_) return first_.emplace(std::move(value));
    return rest_.emplace_back(std::move(value));
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T& front() const { return *first_; }
  // Calls f on every element, in order.
  template <typename F>
  void ForEach(F&& f) const {
    if (first_) f(*first_);
    for (const T& v : rest_) f(v);
  }

 private:
  std::optional<T> first_;
  std::list<T> rest_;
  size_t size_ = 0;
};

}  // namespace hvdc_tf

#endif  // HVDC_PYTHON_TENSORFLOW_STABLE_LIST_H_
