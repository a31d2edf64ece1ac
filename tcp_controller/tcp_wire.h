// The TCP mesh's wire format, as pure functions (internal to tcp_controller/; the fuzz test drives
// them directly). Integers are little-endian (every supported host is).
//
// Handshake (protocol 2), on each new connection; C = the lower rank (connects), A = the higher:
//   C -> A  hello      48 B: magic "HVDH", version, C's rank, world size, job token (u64),
//                            C's nonce (16 B), reserved (u64)
//   A -> C  challenge  64 B: magic "HVDC", version, A's rank, reserved, A's nonce (16 B),
//                            A's proof (32 B) = HMAC-SHA256(key, "hvdc-accept" | hello | A's nonce
//                            | A's rank)
//   C -> A  proof      40 B: magic "HVDP", reserved, C's proof (32 B) = HMAC-SHA256(key,
//                            "hvdc-connect" | hello | A's nonce | A's rank)
//   A -> C  ack        16 B: magic "HVDA", version, A's rank, reserved
// Both sides prove the key over the other's fresh nonce, so a recorded handshake is useless and a
// process without the key learns nothing it could answer with. The job token is a hash of what
// every rank must agree on (the peer list, or the rendezvous service and size): a process of
// another job is refused before any proof. Without a key (HOROVOD_SECRET_KEY unset) the proofs use
// the empty key: they then only check the token, not who is allowed.
//
// Frames, after the handshake: magic "HVDF", channel (u32), length (u64), then `length` bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "rendezvous/hmac_sha256.h"

namespace hvdc {
namespace tcp {

using rendezvous::Digest;  // the handshake proofs are HMAC-SHA256 digests

constexpr uint32_t kFrameMagic = 0x46445648;      // "HVDF"
constexpr uint32_t kHelloMagic = 0x48445648;      // "HVDH"
constexpr uint32_t kChallengeMagic = 0x43445648;  // "HVDC"
constexpr uint32_t kProofMagic = 0x50445648;      // "HVDP"
constexpr uint32_t kAckMagic = 0x41445648;        // "HVDA"
constexpr uint32_t kProtocolVersion = 2;
constexpr size_t kFrameHeaderBytes = 16;
constexpr size_t kNonceBytes = 16;
constexpr size_t kHelloPrefixBytes = 8;  // magic and version: read first, to refuse strays early
constexpr size_t kHelloBytes = 48;
constexpr size_t kChallengeBytes = 64;
constexpr size_t kProofBytes = 40;
constexpr size_t kAckBytes = 16;
// Largest frame a peer may send (Mesh::kMaxFrameBytes).
constexpr uint64_t kMaxFrameLength = 64ull << 20;

template <typename T>
void PutLe(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T GetLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

using Nonce = std::array<uint8_t, kNonceBytes>;
Nonce RandomNonce();  // from the kernel's random source (getrandom)

// The job token: a hash of what every rank must agree on.
uint64_t JobToken(const std::string& what_all_agree_on);

// What the acceptor knows about itself when it checks a hello.
struct HelloCheck {
  int rank = 0;  // the acceptor's
  int size = 1;
  uint64_t job_token = 0;
};

void EncodeHello(uint8_t* out, int rank, int size, uint64_t job_token, const Nonce& nonce);
// "" when the first kHelloPrefixBytes are a hello of our protocol version, else why not.
std::string CheckHelloPrefix(const uint8_t* prefix);
// "" when the whole hello is acceptable (not counting duplicates: the caller knows who is
// connected), else why it is refused; *rank = the rank it claims.
std::string CheckHello(const uint8_t* hello, const HelloCheck& self, int* rank);

// The proofs; `hello` is the whole kHelloBytes hello.
Digest AcceptorProof(const std::string& key, const uint8_t* hello, const Nonce& acceptor_nonce,
                     int acceptor_rank);
Digest ConnectorProof(const std::string& key, const uint8_t* hello, const Nonce& acceptor_nonce,
                      int acceptor_rank);

void EncodeChallenge(uint8_t* out, int acceptor_rank, const Nonce& nonce, const Digest& proof);
// "" when the challenge comes from `expected_rank` and proves `key` for our hello.
std::string CheckChallenge(const uint8_t* challenge, const std::string& key, const uint8_t* hello,
                           int expected_rank);
void EncodeProof(uint8_t* out, const Digest& proof);
// "" when the proof is right for this hello and our nonce and rank.
std::string CheckProof(const uint8_t* proof, const std::string& key, const uint8_t* hello,
                       const Nonce& acceptor_nonce, int acceptor_rank);
void EncodeAck(uint8_t* out, int acceptor_rank);
std::string CheckAck(const uint8_t* ack, int expected_rank);

struct FrameHeader {
  uint32_t channel = 0;
  uint64_t length = 0;
};
void EncodeFrameHeader(uint8_t* out, uint32_t channel, uint64_t length);
// "" when the header is well formed (our magic, length at most kMaxFrameLength), else why not.
std::string DecodeFrameHeader(const uint8_t* header, FrameHeader* out);

}  // namespace tcp
}  // namespace hvdc
