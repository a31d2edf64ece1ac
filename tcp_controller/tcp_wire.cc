#include "tcp_controller/tcp_wire.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <cerrno>
#include <random>

namespace hvdc {
namespace tcp {
namespace {

Digest Prove(const char* label, const std::string& key, const uint8_t* hello,
             const Nonce& acceptor_nonce, int acceptor_rank) {
  rendezvous::HmacSha256 h(key);
  h.Update(label, std::strlen(label) + 1);  // with its NUL: the labels never run into the hello
  h.Update(hello, kHelloBytes);
  h.Update(acceptor_nonce.data(), acceptor_nonce.size());
  uint8_t rank[4];
  PutLe<int32_t>(rank, acceptor_rank);
  h.Update(rank, sizeof(rank));
  return h.Finish();
}

}  // namespace

Nonce RandomNonce() {
  Nonce n;
  size_t got = 0;
  while (got < n.size()) {
    const ssize_t r = getrandom(n.data() + got, n.size() - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;
    }
  }
  if (got < n.size()) {  // no getrandom (very old kernel): the library's device
    std::random_device device;
    for (auto& b : n) b = static_cast<uint8_t>(device());
  }
  return n;
}

uint64_t JobToken(const std::string& what_all_agree_on) {
  const Digest d = rendezvous::Sha256Of("hvdc-job:" + what_all_agree_on);
  return GetLe<uint64_t>(d.data());
}

void EncodeHello(uint8_t* out, int rank, int size, uint64_t job_token, const Nonce& nonce) {
  std::memset(out, 0, kHelloBytes);
  PutLe<uint32_t>(out, kHelloMagic);
  PutLe<uint32_t>(out + 4, kProtocolVersion);
  PutLe<int32_t>(out + 8, rank);
  PutLe<int32_t>(out + 12, size);
  PutLe<uint64_t>(out + 16, job_token);
  std::memcpy(out + 24, nonce.data(), kNonceBytes);
}

std::string CheckHelloPrefix(const uint8_t* prefix) {
  if (GetLe<uint32_t>(prefix) != kHelloMagic) return "not a horovod_compat TCP hello";
  const uint32_t version = GetLe<uint32_t>(prefix + 4);
  if (version != kProtocolVersion) {
    return fmt::format("protocol version {} (ours is {}: a different horovod_compat build?)",
                       version, kProtocolVersion);
  }
  return "";
}

std::string CheckHello(const uint8_t* hello, const HelloCheck& self, int* rank) {
  std::string why = CheckHelloPrefix(hello);
  if (!why.empty()) return why;
  *rank = GetLe<int32_t>(hello + 8);
  const int size = GetLe<int32_t>(hello + 12);
  if (GetLe<uint64_t>(hello + 16) != self.job_token) {
    return "a different job token (a process of another job, or a different peer list / "
           "rendezvous service)";
  }
  if (size != self.size) return fmt::format("world size {} (ours is {})", size, self.size);
  if (*rank < 0 || *rank >= self.rank) {
    return fmt::format("rank {} (only ranks below {} connect to it)", *rank, self.rank);
  }
  if (GetLe<uint64_t>(hello + 40) != 0) return "reserved bytes are not zero";
  return "";
}

Digest AcceptorProof(const std::string& key, const uint8_t* hello, const Nonce& acceptor_nonce,
                     int acceptor_rank) {
  return Prove("hvdc-accept", key, hello, acceptor_nonce, acceptor_rank);
}

Digest ConnectorProof(const std::string& key, const uint8_t* hello, const Nonce& acceptor_nonce,
                      int acceptor_rank) {
  return Prove("hvdc-connect", key, hello, acceptor_nonce, acceptor_rank);
}

void EncodeChallenge(uint8_t* out, int acceptor_rank, const Nonce& nonce, const Digest& proof) {
  std::memset(out, 0, kChallengeBytes);
  PutLe<uint32_t>(out, kChallengeMagic);
  PutLe<uint32_t>(out + 4, kProtocolVersion);
  PutLe<int32_t>(out + 8, acceptor_rank);
  std::memcpy(out + 16, nonce.data(), kNonceBytes);
  std::memcpy(out + 32, proof.data(), proof.size());
}

std::string CheckChallenge(const uint8_t* challenge, const std::string& key, const uint8_t* hello,
                           int expected_rank) {
  if (GetLe<uint32_t>(challenge) != kChallengeMagic ||
      GetLe<uint32_t>(challenge + 4) != kProtocolVersion) {
    return "its answer to our hello was not a horovod_compat challenge";
  }
  if (GetLe<int32_t>(challenge + 8) != expected_rank) {
    return fmt::format("it answered as rank {}", GetLe<int32_t>(challenge + 8));
  }
  Nonce nonce;
  std::memcpy(nonce.data(), challenge + 16, kNonceBytes);
  const Digest want = AcceptorProof(key, hello, nonce, expected_rank);
  if (!rendezvous::DigestEqual(want.data(), challenge + 32, want.size())) {
    return "it does not know the job's secret (HOROVOD_SECRET_KEY differs: a process of another "
           "job, or an impostor)";
  }
  return "";
}

void EncodeProof(uint8_t* out, const Digest& proof) {
  std::memset(out, 0, kProofBytes);
  PutLe<uint32_t>(out, kProofMagic);
  std::memcpy(out + 8, proof.data(), proof.size());
}

std::string CheckProof(const uint8_t* proof, const std::string& key, const uint8_t* hello,
                       const Nonce& acceptor_nonce, int acceptor_rank) {
  if (GetLe<uint32_t>(proof) != kProofMagic) return "its proof message is garbage";
  const Digest want = ConnectorProof(key, hello, acceptor_nonce, acceptor_rank);
  if (!rendezvous::DigestEqual(want.data(), proof + 8, want.size())) {
    return "a wrong proof of the job's secret (HOROVOD_SECRET_KEY differs: a process of another "
           "job, or an impostor)";
  }
  return "";
}

void EncodeAck(uint8_t* out, int acceptor_rank) {
  std::memset(out, 0, kAckBytes);
  PutLe<uint32_t>(out, kAckMagic);
  PutLe<uint32_t>(out + 4, kProtocolVersion);
  PutLe<int32_t>(out + 8, acceptor_rank);
}

std::string CheckAck(const uint8_t* ack, int expected_rank) {
  if (GetLe<uint32_t>(ack) != kAckMagic || GetLe<int32_t>(ack + 8) != expected_rank) {
    return "its final answer was not a horovod_compat acknowledgement from that rank";
  }
  return "";
}

void EncodeFrameHeader(uint8_t* out, uint32_t channel, uint64_t length) {
  PutLe<uint32_t>(out, kFrameMagic);
  PutLe<uint32_t>(out + 4, channel);
  PutLe<uint64_t>(out + 8, length);
}

std::string DecodeFrameHeader(const uint8_t* header, FrameHeader* out) {
  const uint32_t magic = GetLe<uint32_t>(header);
  out->channel = GetLe<uint32_t>(header + 4);
  out->length = GetLe<uint64_t>(header + 8);
  if (magic != kFrameMagic) return fmt::format("garbage frame (magic {:#x})", magic);
  if (out->length > kMaxFrameLength) {
    return fmt::format("garbage frame (length {} over the limit of {})", out->length,
                       kMaxFrameLength);
  }
  return "";
}

}  // namespace tcp
}  // namespace hvdc
