#include "rendezvous/hmac_sha256.h"

#include <algorithm>
#include <cstring>

namespace hvdc {
namespace rendezvous {
namespace {

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the
// first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// Section 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8
// primes.
constexpr uint32_t kInitial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

Sha256::Sha256() { std::memcpy(state_, kInitial, sizeof(state_)); }

void Sha256::Block(const uint8_t* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {  // big-endian words
    w[t] = (uint32_t{p[4 * t]} << 24) | (uint32_t{p[4 * t + 1]} << 16) |
           (uint32_t{p[4 * t + 2]} << 8) | uint32_t{p[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = Rotr(w[t - 15], 7) ^ Rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = Rotr(w[t - 2], 17) ^ Rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t big_s1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t t1 = h + big_s1 + choose + kRound[t] + w[t];
    const uint32_t big_s0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = big_s0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::Update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += bytes;
  while (bytes > 0) {
    if (buffered_ == 0 && bytes >= 64) {
      Block(p);
      p += 64;
      bytes -= 64;
      continue;
    }
    const size_t n = std::min(bytes, 64 - buffered_);
    std::memcpy(buffer_ + buffered_, p, n);
    buffered_ += n;
    p += n;
    bytes -= n;
    if (buffered_ == 64) {
      Block(buffer_);
      buffered_ = 0;
    }
  }
}

Digest Sha256::Finish() {
  // Section 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the length in bits (big-endian).
  const uint64_t bits = total_bytes_ * 8;
  const uint8_t one = 0x80;
  Update(&one, 1);
  const uint8_t zero = 0;
  while (buffered_ != 56) Update(&zero, 1);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  Update(length, 8);
  Digest out;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(state_[i] >> (24 - 8 * j));
  }
  return out;
}

Digest Sha256Of(const std::string& data) {
  Sha256 h;
  h.Update(data);
  return h.Finish();
}

HmacSha256::HmacSha256(const std::string& key) {
  // RFC 2104: K padded with zeros to the block size (hashed first when longer); inner pad 0x36,
  // outer pad 0x5c.
  uint8_t k[64] = {};
  if (key.size() > 64) {
    const Digest d = Sha256Of(key);
    std::memcpy(k, d.data(), d.size());
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t inner_pad[64];
  for (int i = 0; i < 64; ++i) {
    inner_pad[i] = static_cast<uint8_t>(k[i] ^ 0x36);
    outer_pad_[i] = static_cast<uint8_t>(k[i] ^ 0x5c);
  }
  inner_.Update(inner_pad, 64);
}

Digest HmacSha256::Finish() {
  const Digest inner = inner_.Finish();
  Sha256 outer;
  outer.Update(outer_pad_, 64);
  outer.Update(inner.data(), inner.size());
  return outer.Finish();
}

Digest HmacSha256Of(const std::string& key, const std::string& message) {
  HmacSha256 h(key);
  h.Update(message);
  return h.Finish();
}

std::string ToHex(const Digest& d) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(2 * d.size(), '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kDigits[d[i] >> 4];
    s[2 * i + 1] = kDigits[d[i] & 0xf];
  }
  return s;
}

bool DigestEqual(const uint8_t* a, const uint8_t* b, size_t bytes) {
  uint8_t diff = 0;
  for (size_t i = 0; i < bytes; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace rendezvous
}  // namespace hvdc
