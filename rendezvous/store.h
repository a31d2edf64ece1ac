// Store: the small key-value interface rendezvous is written against (c10d's shape). The launcher's
// HTTP service (http_store.h) is one implementation; InMemoryStore lets tests rendezvous threads
// of one process through the same code path.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "core/status.h"

namespace hvdc {
namespace rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // *found is false (and OK returned) when the key is not there yet.
  virtual Status Get(const std::string& key, std::string* value, bool* found) = 0;
  // Where this store is, for error messages ("http://10.0.0.1:4000/global").
  virtual std::string Describe() const = 0;
  // The local address this process uses to reach the store, or "" when that means nothing (the
  // listener binds to it when no interface is given).
  virtual std::string LocalAddress() const { return ""; }
};

class InMemoryStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    return Status::OK();
  }
  Status Get(const std::string& key, std::string* value, bool* found) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    *found = it != values_.end();
    if (*found) *value = it->second;
    return Status::OK();
  }
  std::string Describe() const override { return "in-memory store"; }
  std::string LocalAddress() const override { return "127.0.0.1"; }

 private:
  std::mutex mu_;  // guards values_
  std::map<std::string, std::string> values_;
};

}  // namespace rendezvous
}  // namespace hvdc
