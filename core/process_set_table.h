// ProcessSetTable: the runtime's process sets by id, plus the removed ones still finishing on this
// rank. Any thread may look a set up; only the control thread adds and removes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/process_set.h"

namespace hvdc {

class ProcessSetTable {
 public:
  using SetPtr = std::shared_ptr<ProcessSet>;

  SetPtr Find(int id) const;
  // The registered sets and the removed ones still finishing.
  std::vector<SetPtr> All() const;
  std::vector<int> Ids() const;
  // The id of a registered set with exactly these ranks, or -1.
  int IdOf(const std::vector<int>& ranks) const;
  // The lowest id >= 1 not in use.
  int FreeId() const;
  // Whether a registered set other than the global one has more than one rank.
  bool AnySubsetOfSeveral() const;

  void Insert(SetPtr set);
  // Unregisters the set (never the global one); a member keeps it in the closing list until
  // TakeFinished hands it back. Null when no such set is registered.
  SetPtr Remove(int id);
  // Removes and returns the closing sets for which `finished` is true.
  std::vector<SetPtr> TakeFinished(const std::function<bool(const ProcessSet&)>& finished);
  void Clear();

 private:
  mutable std::mutex mu_;
  std::map<int, SetPtr> sets_;
  std::vector<SetPtr> closing_;
};

}  // namespace hvdc
