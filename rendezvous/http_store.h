// HttpStore: the launcher's rendezvous service (an HTTP/1.1 key-value store) as a Store.
//   PUT /<scope>/<key>  body = value   -> 200
//   GET /<scope>/<key>                 -> 200 with the value, or 404 when not (yet) there
// One connection per request (Connection: close). Every request is bounded by `request_timeout`;
// a refused or timed-out connection is an UnknownError naming the address.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace hvdc {
namespace rendezvous {

class HttpStore : public Store {
 public:
  // Connects once to learn the local address (LocalAddress()); fails if the service is unreachable
  // within `timeout`.
  static Status Create(const std::string& host, int port, const std::string& scope,
                       std::chrono::milliseconds timeout, std::unique_ptr<HttpStore>* out);

  // With a secret (HOROVOD_SECRET_KEY), every request carries the header
  //   X-Hvdc-Signature: hex(HMAC-SHA256(secret, method "\n" path "\n" body))
  // (the launcher's service answers 403 to a missing or wrong one).
  void set_secret(std::string secret) { secret_ = std::move(secret); }

  Status Set(const std::string& key, const std::string& value) override;
  Status Get(const std::string& key, std::string* value, bool* found) override;
  std::string Describe() const override;
  std::string LocalAddress() const override { return local_address_; }

 private:
  HttpStore(std::string host, int port, std::string scope, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), scope_(std::move(scope)), timeout_(timeout) {}
  // One request; *code is the HTTP status, *body the response body.
  Status Request(const std::string& method, const std::string& key, const std::string& body,
                 int* code, std::string* response);
  Status Forbidden(const std::string& method, const std::string& key) const;

  const std::string host_;
  const int port_;
  const std::string scope_;
  const std::chrono::milliseconds timeout_;
  std::string local_address_;
  std::string secret_;
};

}  // namespace rendezvous
}  // namespace hvdc
