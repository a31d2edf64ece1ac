// SHA-256 and HMAC-SHA256 (rendezvous/hmac_sha256.h): the published vectors of FIPS 180-4's
// examples and RFC 4231, every way of feeding the input, and agreement with Python's hmac module
// (the launcher's side of the signed rendezvous requests) on random keys and messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "rendezvous/hmac_sha256.h"

namespace hvdc {
namespace {

using rendezvous::HmacSha256Of;
using rendezvous::Sha256Of;
using rendezvous::ToHex;

std::string Repeat(char c, size_t n) { return std::string(n, c); }

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += kDigits[c >> 4];
    s += kDigits[c & 0xf];
  }
  return s;
}

TEST(TcpHmac, Sha256PublishedExamples) {
  EXPECT_EQ(ToHex(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ToHex(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ToHex(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(ToHex(Sha256Of(Repeat('a', 1000000))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(TcpHmac, Rfc4231Vectors) {
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  struct Case {
    std::string key, data, hmac;
  };
  const Case cases[] = {
      {Repeat('\x0b', 20), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {Repeat('\xaa', 20), Repeat('\xdd', 50),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, Repeat('\xcd', 50),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {Repeat('\xaa', 131), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {Repeat('\xaa', 131),
       "This is a test using a larger than block-size key and a larger than block-size data. The "
       "key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Case& c : cases) EXPECT_EQ(ToHex(HmacSha256Of(c.key, c.data)), c.hmac) << c.data;
  // Test case 5 publishes the first 128 bits only.
  EXPECT_EQ(ToHex(HmacSha256Of(Repeat('\x0c', 20), "Test With Truncation")).substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
}

// Feeding the input in pieces of any size gives the digest of the whole (block boundaries).
TEST(TcpHmac, PiecewiseUpdateEqualsWhole) {
  std::mt19937 gen(7);
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000}) {
    std::string data(len, '\0');
    for (char& c : data) c = static_cast<char>(gen());
    const std::string whole = ToHex(HmacSha256Of("key", data));
    for (size_t piece : {1, 3, 64, 100}) {
      rendezvous::HmacSha256 h("key");
      for (size_t at = 0; at < len; at += piece) h.Update(data.substr(at, piece));
      EXPECT_EQ(ToHex(h.Finish()), whole) << len << " in pieces of " << piece;
    }
  }
}

TEST(TcpHmac, DigestEqual) {
  const auto a = Sha256Of("a"), b = Sha256Of("b");
  EXPECT_TRUE(rendezvous::DigestEqual(a.data(), a.data(), a.size()));
  EXPECT_FALSE(rendezvous::DigestEqual(a.data(), b.data(), a.size()));
  auto c = a;
  c[31] ^= 1;
  EXPECT_FALSE(rendezvous::DigestEqual(a.data(), c.data(), a.size()));
}

// Python's hmac computes the same on random keys (0..200 bytes) and messages (0..300 bytes).
TEST(TcpHmac, AgreesWithPythonHmac) {
  FILE* probe = popen("python3 -c 'import hmac' 2>/dev/null && echo yes", "r");
  char answer[8] = {};
  const bool have_python = probe && fgets(answer, sizeof(answer), probe) != nullptr;
  if (probe) pclose(probe);
  if (!have_python) GTEST_SKIP() << "python3 is not installed";
  std::mt19937 gen(11);
  std::string script =
      "import hmac, hashlib, sys\n"
      "for line in sys.stdin:\n"
      "    k, m = (bytes.fromhex(x) for x in line.split(',')) if ',' in line else (b'', b'')\n"
      "    print(hmac.new(k, m, hashlib.sha256).hexdigest())\n";
  std::string input;
  std::vector<std::string> expected;
  for (int i = 0; i < 50; ++i) {
    std::string key(gen() % 201, '\0'), msg(gen() % 301, '\0');
    for (char& c : key) c = static_cast<char>(gen());
    for (char& c : msg) c = static_cast<char>(gen());
    input += Hex(key) + "," + Hex(msg) + "\n";
    expected.push_back(ToHex(HmacSha256Of(key, msg)));
  }
  char path[] = "/tmp/hvdc_hmac_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  FILE* f = fdopen(fd, "w");
  fputs(input.c_str(), f);
  fclose(f);
  const std::string cmd = "timeout 60 python3 -c \"" + [&] {
    std::string s;
    for (char c : script) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    return s;
  }() + "\" < " + path;
  FILE* py = popen(cmd.c_str(), "r");
  ASSERT_NE(py, nullptr);
  std::vector<std::string> got;
  char line[128];
  while (fgets(line, sizeof(line), py) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    got.push_back(s);
  }
  const int rc = pclose(py);
  std::remove(path);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "case " << i;
}

}  // namespace
}  // namespace hvdc
