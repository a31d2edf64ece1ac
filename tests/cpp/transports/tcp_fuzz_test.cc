// Bounded fuzzing of the TCP transport's wire (fixed seeds): the frame decoder and the handshake
// checks on thousands of random and mutated inputs; a listening rank fed hundreds of garbage,
// truncated, wrong-secret and duplicate-rank connections that still meets its real peer; and
// authenticated peers sending garbage frames, which are refused without corrupting the messages
// that came before. Every socket operation of the fuzzers has a receive timeout.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <random>

#include "core/logging.h"
#include "tcp_controller/tcp_wire.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace hvdc {
namespace {

using tcp::GetLe;
using tcp::Mesh;
using tcp::PutLe;
namespace asio = boost::asio;
using Socket = asio::ip::tcp::socket;
using Endpoint = asio::ip::tcp::endpoint;

std::string RandomBytes(std::mt19937& gen, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

TEST(TcpFuzz, FrameDecoderOnRandomAndMutatedHeaders) {
  std::mt19937 gen(20261125);
  int accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    uint8_t h[tcp::kFrameHeaderBytes];
    const int kind = i % 3;
    if (kind == 0) {  // all random
      for (uint8_t& b : h) b = static_cast<uint8_t>(gen());
    } else {  // a valid header, one field or byte mutated
      tcp::EncodeFrameHeader(h, gen(), gen() % (tcp::kMaxFrameLength + 1));
      if (kind == 2) h[gen() % sizeof(h)] ^= static_cast<uint8_t>(1u << (gen() % 8));
      if (gen() % 4 == 0) PutLe<uint64_t>(h + 8, tcp::kMaxFrameLength + 1 + (gen() % 1000));
    }
    const uint32_t magic = GetLe<uint32_t>(h);
    const uint64_t length = GetLe<uint64_t>(h + 8);
    const bool valid = magic == tcp::kFrameMagic && length <= tcp::kMaxFrameLength;
    tcp::FrameHeader frame;
    const std::string why = tcp::DecodeFrameHeader(h, &frame);
    ASSERT_EQ(why.empty(), valid) << i << ": " << why;
    if (valid) {
      ++accepted;
      EXPECT_EQ(frame.channel, GetLe<uint32_t>(h + 4));
      EXPECT_EQ(frame.length, length);
    } else {
      EXPECT_NE(why.find("garbage frame"), std::string::npos) << why;
    }
  }
  EXPECT_GT(accepted, 100);  // the mutations kept some valid ones
}

TEST(TcpFuzz, HelloCheckOnRandomAndMutatedHellos) {
  std::mt19937 gen(7);
  tcp::HelloCheck self;
  self.rank = 3;
  self.size = 5;
  self.job_token = 0x1122334455667788ull;
  int accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    uint8_t h[tcp::kHelloBytes];
    if (i % 4 == 0) {
      for (uint8_t& b : h) b = static_cast<uint8_t>(gen());
    } else {
      tcp::EncodeHello(h, static_cast<int>(gen() % 7) - 1, self.size, self.job_token,
                       tcp::RandomNonce());
      if (i % 4 >= 2) h[gen() % sizeof(h)] ^= static_cast<uint8_t>(1u << (gen() % 8));
    }
    const int claimed = GetLe<int32_t>(h + 8);
    const bool valid =
        GetLe<uint32_t>(h) == tcp::kHelloMagic && GetLe<uint32_t>(h + 4) == tcp::kProtocolVersion &&
        GetLe<int32_t>(h + 12) == self.size && GetLe<uint64_t>(h + 16) == self.job_token &&
        claimed >= 0 && claimed < self.rank && GetLe<uint64_t>(h + 40) == 0;
    int rank = -1;
    const std::string why = tcp::CheckHello(h, self, &rank);
    ASSERT_EQ(why.empty(), valid) << i << ": " << why;
    if (valid) {
      ++accepted;
      EXPECT_EQ(rank, claimed);
    }
  }
  EXPECT_GT(accepted, 500);
}

// Every single-bit change of a challenge's nonce or proof, or of a proof, is refused; the
// untouched ones and only those pass; another key never passes.
TEST(TcpFuzz, EveryBitOfTheProofsMatters) {
  const std::string key = "job key";
  uint8_t hello[tcp::kHelloBytes];
  tcp::EncodeHello(hello, 0, 2, 99, tcp::RandomNonce());
  const tcp::Nonce nonce = tcp::RandomNonce();
  uint8_t challenge[tcp::kChallengeBytes], proof[tcp::kProofBytes];
  tcp::EncodeChallenge(challenge, 1, nonce, tcp::AcceptorProof(key, hello, nonce, 1));
  tcp::EncodeProof(proof, tcp::ConnectorProof(key, hello, nonce, 1));
  ASSERT_EQ(tcp::CheckChallenge(challenge, key, hello, 1), "");
  ASSERT_EQ(tcp::CheckProof(proof, key, hello, nonce, 1), "");
  EXPECT_NE(tcp::CheckChallenge(challenge, "other key", hello, 1), "");
  EXPECT_NE(tcp::CheckProof(proof, "other key", hello, nonce, 1), "");
  EXPECT_NE(tcp::CheckProof(proof, key, hello, nonce, 2), "");  // proved to another rank
  EXPECT_NE(tcp::CheckChallenge(challenge, "", hello, 1), "");
  for (size_t bit = 16 * 8; bit < tcp::kChallengeBytes * 8; ++bit) {
    uint8_t c[tcp::kChallengeBytes];
    std::memcpy(c, challenge, sizeof(c));
    c[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(tcp::CheckChallenge(c, key, hello, 1), "") << "challenge bit " << bit;
  }
  for (size_t bit = 8 * 8; bit < tcp::kProofBytes * 8; ++bit) {
    uint8_t p[tcp::kProofBytes];
    std::memcpy(p, proof, sizeof(p));
    p[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(tcp::CheckProof(p, key, hello, nonce, 1), "") << "proof bit " << bit;
  }
  for (size_t bit = 0; bit < tcp::kHelloBytes * 8; ++bit) {  // the proofs cover the whole hello
    uint8_t h[tcp::kHelloBytes];
    std::memcpy(h, hello, sizeof(h));
    h[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(tcp::CheckProof(proof, key, h, nonce, 1), "") << "hello bit " << bit;
  }
}

// A blocking loopback connection whose reads give up after 10 s (a refused stray must be closed
// by the mesh long before).
bool ConnectBounded(Socket& s, int port) {
  boost::system::error_code ec;
  s.connect(Endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)), ec);
  if (ec) return false;
  timeval tv = {10, 0};
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return true;
}

// Reads until the peer closes (true) or 10 s pass (false).
bool ClosedByPeer(Socket& s) {
  char sink[256];
  boost::system::error_code ec;
  while (!ec) s.read_some(asio::buffer(sink), ec);
  return ec == asio::error::eof || ec == asio::error::connection_reset;
}

int PortOf(const std::string& peer) { return std::stoi(peer.substr(peer.find(':') + 1)); }

// Rank 2 of 3 listens; a fuzzer throws hundreds of bad connections at it (each must be closed by
// rank 2), including a perfect handshake as rank 0 with the wrong secret and a second rank 0
// after the first; then the real ranks come and the job works.
TEST(TcpFuzz, ListeningRankRefusesStraysAndMeetsTheRealPeers) {
  const LogLevel level = GetLogLevel();
  SetLogOptions(LogLevel::kError, true, -1);  // thousands of refusals would flood the output
  const auto peers = tcp_test::FreeLoopbackPeers(3);
  const uint64_t token = tcp::JobToken("fuzz job");
  const std::string key = "fuzz secret";
  auto options = [&](int r) {
    tcp::MeshOptions o;
    o.rank = r;
    o.size = 3;
    o.peers = peers;
    o.job_token = token;
    o.secret_key = key;
    o.timeout = std::chrono::seconds(120);
    return o;
  };
  std::vector<std::shared_ptr<Mesh>> meshes(3);
  std::vector<Status> status(3);
  std::thread rank2([&] { status[2] = Mesh::Create(options(2), &meshes[2]); });

  std::mt19937 gen(99);
  const int port = PortOf(peers[2]);
  int refused = 0, cases = 0;
  std::vector<std::unique_ptr<Socket>> silent;  // connected, never say a word
  asio::io_context io;
  for (int i = 0; i < 2000; ++i) {
    auto s = std::make_unique<Socket>(io);
    while (!ConnectBounded(*s, port)) {  // until rank 2 listens
      s = std::make_unique<Socket>(io);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ++cases;
    boost::system::error_code ec;
    uint8_t hello[tcp::kHelloBytes];
    tcp::EncodeHello(hello, static_cast<int>(gen() % 2), 3, token, tcp::RandomNonce());
    std::string data;
    switch (i % 8) {
      case 0:  // random bytes
        data = RandomBytes(gen, 1 + gen() % 200);
        break;
      case 1:  // a valid hello, one random byte changed (must break the magic/version/...)
        hello[gen() % 24] ^= static_cast<uint8_t>(1 + gen() % 255);
        data.assign(reinterpret_cast<char*>(hello), sizeof(hello));
        break;
      case 2:  // a truncated hello
        data.assign(reinterpret_cast<char*>(hello), 1 + gen() % (tcp::kHelloBytes - 1));
        break;
      case 3:  // a valid hello, then a garbage proof
        data.assign(reinterpret_cast<char*>(hello), sizeof(hello));
        data += RandomBytes(gen, tcp::kProofBytes);
        break;
      case 4: {  // a whole handshake with a proof made with the wrong secret
        asio::write(*s, asio::buffer(hello), ec);
        uint8_t challenge[tcp::kChallengeBytes], proof[tcp::kProofBytes];
        asio::read(*s, asio::buffer(challenge), ec);
        EXPECT_FALSE(ec) << ec.message();
        // The real rank 2 proved the secret we do not have.
        EXPECT_NE(tcp::CheckChallenge(challenge, "wrong secret", hello, 2), "");
        EXPECT_EQ(tcp::CheckChallenge(challenge, key, hello, 2), "");
        tcp::Nonce nonce;
        std::memcpy(nonce.data(), challenge + 16, tcp::kNonceBytes);
        tcp::EncodeProof(proof, tcp::ConnectorProof("wrong secret", hello, nonce, 2));
        asio::write(*s, asio::buffer(proof), ec);
        break;
      }
      case 5:  // another job's token
        tcp::EncodeHello(hello, 0, 3, token + 1, tcp::RandomNonce());
        data.assign(reinterpret_cast<char*>(hello), sizeof(hello));
        break;
      case 6:  // a rank that never connects to rank 2 (itself or above), or a negative one
        tcp::EncodeHello(hello, (gen() % 2) ? 2 + static_cast<int>(gen() % 5) : -1, 3, token,
                         tcp::RandomNonce());
        data.assign(reinterpret_cast<char*>(hello), sizeof(hello));
        break;
      case 7:  // connects and sends nothing (held open until the end) or closes at once
        if (gen() % 2) {
          silent.push_back(std::move(s));
          continue;
        }
        break;
    }
    if (!data.empty()) asio::write(*s, asio::buffer(data), ec);
    s->shutdown(Socket::shutdown_send, ec);
    if (ClosedByPeer(*s)) ++refused;
  }
  EXPECT_EQ(refused, cases - static_cast<int>(silent.size()));

  // One impostor gets in properly as rank 0 (it knows the secret: e.g. a rank restarted by
  // hand); a second rank 0 is then refused as a duplicate, and the real rank 0 too.
  Socket first(io), second(io);
  ASSERT_TRUE(ConnectBounded(first, port));
  ASSERT_EQ(tcp_test::ConnectorHandshake(first, 0, 3, token, key, 2), "");
  ASSERT_TRUE(ConnectBounded(second, port));
  EXPECT_NE(tcp_test::ConnectorHandshake(second, 0, 3, token, key, 2), "");
  // Now rank 1 (real) completes rank 2's set-up.
  std::thread rank1([&] {
    auto o = options(1);
    o.timeout = std::chrono::seconds(2);  // it cannot meet rank 0 (played by `first`)
    status[1] = Mesh::Create(o, &meshes[1]);
  });
  rank2.join();
  rank1.join();
  SetLogOptions(level, true, -1);
  ASSERT_TRUE(status[2].ok()) << status[2].ToString();
  EXPECT_FALSE(status[1].ok());  // nobody listens as rank 0
  // Rank 2's connection to "rank 0" carries frames; the stray sockets did nothing to it.
  const std::string hello_frame = "after the fuzz";
  ASSERT_TRUE(meshes[2]->Send(0, 5, hello_frame.data(), hello_frame.size()).ok());
  uint8_t header[tcp::kFrameHeaderBytes];
  boost::system::error_code ec;
  asio::read(first, asio::buffer(header), ec);
  ASSERT_FALSE(ec) << ec.message();
  tcp::FrameHeader frame;
  ASSERT_EQ(tcp::DecodeFrameHeader(header, &frame), "");
  EXPECT_EQ(frame.channel, 5u);
  std::string body(frame.length, '\0');
  asio::read(first, asio::buffer(&body[0], body.size()), ec);
  EXPECT_EQ(body, hello_frame);
  for (auto& s : silent) s->close(ec);
  first.close(ec);
  meshes[2].reset();
}

// An authenticated peer sends k good frames then garbage (random bytes, an oversized or
// truncated frame): the receiver gets the k messages intact, then an error naming the peer.
TEST(TcpFuzz, GarbageAfterGoodFramesIsRefusedWithoutCorruption) {
  const LogLevel level = GetLogLevel();
  SetLogOptions(LogLevel::kError, true, -1);
  std::mt19937 gen(4242);
  const int kCases = 1000;
  for (int i = 0; i < kCases; ++i) {
    const auto peers = tcp_test::FreeLoopbackPeers(2);
    const uint64_t token = tcp::JobToken("frames " + std::to_string(i));
    std::vector<std::string> good(gen() % 4);
    for (auto& g : good) g = RandomBytes(gen, gen() % 300);
    std::string garbage;
    uint8_t h[tcp::kFrameHeaderBytes];  // the main thread's
    switch (i % 3) {
      case 0:
        garbage = RandomBytes(gen, tcp::kFrameHeaderBytes + gen() % 100);
        if (GetLe<uint32_t>(reinterpret_cast<const uint8_t*>(garbage.data())) == tcp::kFrameMagic) {
          garbage[0] ^= 1;
        }
        break;
      case 1:
        tcp::EncodeFrameHeader(h, 1, tcp::kMaxFrameLength + 1 + gen() % 1000000);
        garbage.assign(reinterpret_cast<char*>(h), sizeof(h));
        break;
      case 2: {
        const uint64_t n = 10 + gen() % 1000;
        tcp::EncodeFrameHeader(h, 1, n);
        garbage.assign(reinterpret_cast<char*>(h), sizeof(h));
        garbage += RandomBytes(gen, gen() % n);
        break;
      }
    }
    std::thread fake([&] {
      asio::io_context io;
      Socket s(io);
      while (!ConnectBounded(s, PortOf(peers[1]))) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_EQ(tcp_test::ConnectorHandshake(s, 0, 2, token, "k", 1), "");
      std::string stream;
      for (const auto& g : good) {
        uint8_t header[tcp::kFrameHeaderBytes];
        tcp::EncodeFrameHeader(header, 1, g.size());
        stream.append(reinterpret_cast<char*>(header), sizeof(header));
        stream += g;
      }
      stream += garbage;
      boost::system::error_code ec;
      asio::write(s, asio::buffer(stream), ec);
      s.shutdown(Socket::shutdown_send, ec);
      ClosedByPeer(s);
    });
    tcp::MeshOptions o;
    o.rank = 1;
    o.size = 2;
    o.peers = peers;
    o.job_token = token;
    o.secret_key = "k";
    o.timeout = std::chrono::seconds(60);
    std::shared_ptr<Mesh> mesh;
    Status s = Mesh::Create(o, &mesh);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (const auto& g : good) {
      std::string got;
      s = mesh->Recv(0, 1, &got);
      ASSERT_TRUE(s.ok()) << "case " << i << ": " << s.ToString();
      EXPECT_EQ(got, g) << "case " << i;
    }
    std::string got;
    s = mesh->Recv(0, 1, &got);
    // The connection is dropped, so the peer is lost to the job (as a reset would be).
    EXPECT_EQ(s.code(), StatusCode::kPeerLost) << "case " << i << ": " << s.ToString();
    EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
    fake.join();
    mesh.reset();
  }
  SetLogOptions(level, true, -1);
}

}  // namespace
}  // namespace hvdc
