#include "core/process_set_table.h"

namespace hvdc {

ProcessSetTable::SetPtr ProcessSetTable::Find(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<ProcessSetTable::SetPtr> ProcessSetTable::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SetPtr> all;
  all.reserve(sets_.size() + closing_.size());
  for (auto& [id, st] : sets_) all.push_back(st);
  for (auto& st : closing_) all.push_back(st);
  return all;
}

std::vector<int> ProcessSetTable::Ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> ids;
  for (auto& [id, st] : sets_) ids.push_back(id);
  return ids;
}

int ProcessSetTable::IdOf(const std::vector<int>& ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, st] : sets_) {
    if (st->ranks == ranks) return id;
  }
  return -1;
}

int ProcessSetTable::FreeId() const {
  std::lock_guard<std::mutex> lock(mu_);
  int id = 1;
  while (sets_.count(id)) ++id;
  return id;
}

bool ProcessSetTable::AnySubsetOfSeveral() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, st] : sets_) {
    if (id != 0 && st->ranks.size() > 1) return true;
  }
  return false;
}

void ProcessSetTable::Insert(SetPtr set) {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = set->id;
  sets_[id] = std::move(set);
}

ProcessSetTable::SetPtr ProcessSetTable::Remove(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end() || id == 0) return nullptr;
  SetPtr st = it->second;
  sets_.erase(it);
  if (st->member()) closing_.push_back(st);
  return st;
}

std::vector<ProcessSetTable::SetPtr> ProcessSetTable::TakeFinished(
    const std::function<bool(const ProcessSet&)>& finished) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SetPtr> done;
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (finished(**it)) {
      done.push_back(std::move(*it));
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

void ProcessSetTable::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.clear();
  closing_.clear();
}

}  // namespace hvdc
