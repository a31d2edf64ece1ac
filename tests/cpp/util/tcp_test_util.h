// Helpers for the TCP transport suites: N ranks as threads of this process over loopback, meeting
// through an in-memory store (ephemeral ports) or a static peer list of free ports.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store.h"
#include "tcp_controller/tcp_mesh.h"
#include "tcp_controller/tcp_wire.h"

namespace hvdc {
namespace tcp_test {

// True in ASan and TSan builds (GCC's and Clang's spellings), where timing-sensitive tests widen
// their timeouts: the instrumented code runs several times slower and ctest runs two tests at once.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif
#else
constexpr bool kSanitizedBuild = false;
#endif

// Runs fn(rank) on `size` threads and joins them.
inline void RunRanks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Free loopback ports (bound, then released: another process could take one in between, which
// would surface as a clear "cannot listen" error, not a hang).
inline std::vector<std::string> FreeLoopbackPeers(int size) {
  boost::asio::io_context io;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> held;
  std::vector<std::string> peers;
  for (int r = 0; r < size; ++r) {
    held.push_back(std::make_unique<boost::asio::ip::tcp::acceptor>(
        io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)));
    peers.push_back("127.0.0.1:" + std::to_string(held.back()->local_endpoint().port()));
  }
  return peers;
}

// Plays the connecting side of the handshake (tcp_wire.h) over `s` as rank `rank` towards rank
// `acceptor`; "" when accepted, else what went wrong.
inline std::string ConnectorHandshake(boost::asio::ip::tcp::socket& s, int rank, int size,
                                      uint64_t token, const std::string& key, int acceptor) {
  boost::system::error_code ec;
  uint8_t hello[tcp::kHelloBytes], challenge[tcp::kChallengeBytes], proof[tcp::kProofBytes],
      ack[tcp::kAckBytes];
  tcp::EncodeHello(hello, rank, size, token, tcp::RandomNonce());
  boost::asio::write(s, boost::asio::buffer(hello), ec);
  if (!ec) boost::asio::read(s, boost::asio::buffer(challenge), ec);
  if (ec) return "hello: " + ec.message();
  std::string why = tcp::CheckChallenge(challenge, key, hello, acceptor);
  if (!why.empty()) return why;
  tcp::Nonce nonce;
  std::memcpy(nonce.data(), challenge + 16, tcp::kNonceBytes);
  tcp::EncodeProof(proof, tcp::ConnectorProof(key, hello, nonce, acceptor));
  boost::asio::write(s, boost::asio::buffer(proof), ec);
  if (!ec) boost::asio::read(s, boost::asio::buffer(ack), ec);
  if (ec) return "proof: " + ec.message();
  return tcp::CheckAck(ack, acceptor);
}

inline tcp::MeshOptions StoreOptions(rendezvous::Store* store, int rank, int size,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  tcp::MeshOptions o;
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.job_token = 0x1234;
  o.secret_key = "test secret";
  o.timeout = timeout;
  return o;
}

// Builds one mesh per rank (concurrently) over an in-memory store; fails the test on error.
inline std::vector<std::shared_ptr<tcp::Mesh>> MakeMeshes(int size) {
  rendezvous::InMemoryStore store;
  std::vector<std::shared_ptr<tcp::Mesh>> meshes(size);
  RunRanks(size, [&](int r) {
    Status s = tcp::Mesh::Create(StoreOptions(&store, r, size), &meshes[r]);
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  return meshes;
}

}  // namespace tcp_test
}  // namespace hvdc
