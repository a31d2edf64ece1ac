// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the TCP transport's keyed handshake and the
// signed rendezvous requests. Small and dependency-free; not constant-time beyond DigestEqual.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdc {
namespace rendezvous {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t bytes);
  void Update(const std::string& s) { Update(s.data(), s.size()); }
  Digest Finish();  // the object must not be used afterwards

 private:
  void Block(const uint8_t* block);

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest Sha256Of(const std::string& data);

// HMAC-SHA256 with `key` (any length; longer than a block is hashed first, as RFC 2104 says).
class HmacSha256 {
 public:
  explicit HmacSha256(const std::string& key);
  void Update(const void* data, size_t bytes) { inner_.Update(data, bytes); }
  void Update(const std::string& s) { inner_.Update(s); }
  Digest Finish();

 private:
  Sha256 inner_;
  uint8_t outer_pad_[64];
};

Digest HmacSha256Of(const std::string& key, const std::string& message);

// Lower-case hex of a digest.
std::string ToHex(const Digest& d);

// Compares without an early exit (the time does not tell how many leading bytes matched).
bool DigestEqual(const uint8_t* a, const uint8_t* b, size_t bytes);

}  // namespace rendezvous
}  // namespace hvdc
