// What only the TCP transport has, over loopback with ranks as threads: its name and topology,
// a subset's data plane busy on an executor thread while the global set negotiates, the
// transport made from the configuration, the identity variables, the topology derived from hosts,
// and a peer gone in the middle of a collective. The ControlChannel, HostComm and process-set
// contracts are checked by the conformance suites (conformance/tcp_conformance_test.cc).
#include "tcp_controller/tcp_transport.h"

#include <gtest/gtest.h>

#include <thread>

#include "tcp_controller/tcp_group.h"
#include "tcp_controller/tcp_host_comm.h"
#include "tcp_controller/tcp_identity.h"
#include "tests/cpp/conformance/control_channel_checks.h"
#include "tests/cpp/util/tcp_test_util.h"

namespace hvdc {
namespace {

using tcp_test::RunRanks;

std::vector<std::unique_ptr<Transport>> MakeTransports(int n) {
  auto meshes = tcp_test::MakeMeshes(n);
  std::vector<std::unique_ptr<Transport>> out(n);
  for (int r = 0; r < n; ++r) {
    Status s = MakeTcpTransportOverMesh(meshes[r], Config(), &out[r]);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

TEST(TcpTransport, ProcessSetsTalkOnlyAmongMembers) {
  const int n = 4;
  auto transports = MakeTransports(n);
  const std::vector<int> all = {0, 1, 2, 3}, odd = {1, 3};
  RunRanks(n, [&](int r) {
    Transport& t = *transports[r];
    EXPECT_STREQ(t.name(), "gloo");
    EXPECT_TRUE(t.threads_supported());
    EXPECT_EQ(t.topology().rank, r);
    EXPECT_EQ(t.topology().size, n);
    EXPECT_EQ(t.topology().local_rank, r);  // every rank on 127.0.0.1
    EXPECT_EQ(t.topology().local_size, n);
    EXPECT_EQ(t.topology().cross_size, 1);
    ProcessSetChannels global, subset;
    ASSERT_TRUE(t.CreateProcessSet(all, &global).ok());
    ASSERT_TRUE(t.CreateProcessSet(odd, &subset).ok());
    ASSERT_TRUE(global.control && global.data);
    EXPECT_EQ(subset.control != nullptr, r % 2 == 1);
    EXPECT_EQ(subset.data != nullptr, r % 2 == 1);
    // The members of the subset use both sets at once, from two threads (control and executor).
    std::thread executor;
    if (subset.data) {
      executor = std::thread([&] {
        for (int round = 0; round < 20; ++round) {
          std::vector<int32_t> v(3001, r + round);
          ASSERT_TRUE(
              subset.data->Allreduce(v.data(), v.data(), 3001, DataType::kInt32, ReduceOp::kSum)
                  .ok());
          for (int32_t x : v) ASSERT_EQ(x, 1 + 3 + 2 * round);
        }
      });
    }
    conformance::ExerciseChannel(*global.control, all, 5);
    std::vector<float> g(10, static_cast<float>(r));
    ASSERT_TRUE(
        global.data->Allreduce(g.data(), g.data(), 10, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(g[9], 0.0f + 1 + 2 + 3);
    if (executor.joinable()) executor.join();
    if (subset.control) conformance::ExerciseChannel(*subset.control, odd, 3);
    // A third set after the subset: every rank counted the subset, members or not.
    ProcessSetChannels pair;
    ASSERT_TRUE(t.CreateProcessSet({0, 2}, &pair).ok());
    if (pair.data) {
      int64_t v = r * 10;
      ASSERT_TRUE(pair.data->Allreduce(&v, &v, 1, DataType::kInt64, ReduceOp::kMax).ok());
      EXPECT_EQ(v, 20);
    }
    t.Finalize();
  });
}

TEST(TcpTransport, FromConfigWithStaticPeers) {
  const int n = 3;
  const auto peers = tcp_test::FreeLoopbackPeers(n);
  std::string list;
  for (const auto& p : peers) list += (list.empty() ? "" : ",") + p;
  std::vector<std::unique_ptr<Transport>> transports(n);
  RunRanks(n, [&](int r) {
    Config c;
    c.tcp_peers = list;
    c.gloo.rank = r;
    c.gloo_timeout_s = 60;
    Status s = MakeTcpTransport(c, &transports[r]);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ProcessSetChannels ch;
    ASSERT_TRUE(transports[r]->CreateProcessSet({0, 1, 2}, &ch).ok());
    double v = r + 0.5;
    ASSERT_TRUE(ch.data->Allreduce(&v, &v, 1, DataType::kFloat64, ReduceOp::kSum).ok());
    EXPECT_EQ(v, 0.5 + 1.5 + 2.5);
    transports[r]->Finalize();
  });
}

Status Identity(const Config& c) {
  tcp::Identity id;
  return tcp::IdentityFromConfig(c, &id);
}

TEST(TcpTransport, IdentityErrorsNameTheVariable) {
  auto expect = [](const Config& c, const char* needle) {
    Status s = Identity(c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  Config none;
  expect(none, "HVDC_TCP_PEERS");
  Config no_rank;
  no_rank.tcp_peers = "a:1,b:2";
  expect(no_rank, "HOROVOD_RANK is not");
  Config too_big = no_rank;
  too_big.gloo.rank = 2;
  expect(too_big, "HOROVOD_RANK=2");
  Config size_mismatch = no_rank;
  size_mismatch.gloo.rank = 0;
  size_mismatch.gloo.size = 3;
  expect(size_mismatch, "HOROVOD_SIZE=3 but HVDC_TCP_PEERS lists 2");
  Config bad_entry = no_rank;
  bad_entry.gloo.rank = 0;
  bad_entry.tcp_peers = "a:1,b";
  expect(bad_entry, "HVDC_TCP_PEERS entry 1");
  Config zero_port = bad_entry;
  zero_port.tcp_peers = "a:1,b:0";
  expect(zero_port, "fixed port");
  Config no_port;
  no_port.gloo.rendezvous_addr = "10.0.0.1";
  no_port.gloo.rank = 0;
  no_port.gloo.size = 2;
  expect(no_port, "HOROVOD_GLOO_RENDEZVOUS_PORT");
  Config no_size = no_port;
  no_size.gloo.rendezvous_port = 4000;
  no_size.gloo.size = -1;
  expect(no_size, "HOROVOD_SIZE is");
  Config bad_iface = no_size;
  bad_iface.gloo.size = 2;
  bad_iface.gloo_iface = "no-such-interface0";
  expect(bad_iface, "HOROVOD_GLOO_IFACE='no-such-interface0'");
  Config lo = bad_iface;
  lo.gloo_iface = "lo";
  tcp::Identity id;
  ASSERT_TRUE(tcp::IdentityFromConfig(lo, &id).ok());
  EXPECT_EQ(id.bind_host, "127.0.0.1");
  lo.gloo_iface = "no-such-interface0,lo";  // a list: the first interface that exists
  ASSERT_TRUE(tcp::IdentityFromConfig(lo, &id).ok());
  EXPECT_EQ(id.bind_host, "127.0.0.1");
}

TEST(TcpTransport, RendezvousUnreachableFailsInit) {
  const auto free = tcp_test::FreeLoopbackPeers(1);
  Config c;
  c.gloo.rendezvous_addr = "127.0.0.1";
  c.gloo.rendezvous_port = std::stoi(free[0].substr(free[0].find(':') + 1));
  c.gloo.rank = 0;
  c.gloo.size = 2;
  c.gloo_timeout_s = 1;
  std::unique_ptr<Transport> t;
  Status s = MakeTcpTransport(c, &t);
  EXPECT_EQ(s.code(), StatusCode::kUnknownError);
  EXPECT_NE(s.message().find("rendezvous service at " + free[0]), std::string::npos) << s.message();
}

TEST(TcpTransport, TopologyFromHosts) {
  // Hosts a, a, b, b, c: local sizes 2, 2, 1; cross groups by local rank.
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "c"};
  const int local_rank[] = {0, 1, 0, 1, 0}, local_size[] = {2, 2, 2, 2, 1};
  const int cross_rank[] = {0, 0, 1, 1, 2}, cross_size[] = {3, 2, 3, 2, 3};
  for (int r = 0; r < 5; ++r) {
    Topology t;
    ASSERT_TRUE(tcp::BuildTopology(r, 5, hosts, Config(), &t).ok());
    EXPECT_EQ(t.local_rank, local_rank[r]) << r;
    EXPECT_EQ(t.local_size, local_size[r]) << r;
    EXPECT_EQ(t.cross_rank, cross_rank[r]) << r;
    EXPECT_EQ(t.cross_size, cross_size[r]) << r;
    EXPECT_FALSE(t.homogeneous);
  }
  Config c;  // the launcher's variables win
  c.gloo.local_rank = 1;
  c.gloo.local_size = 3;
  Topology t;
  ASSERT_TRUE(tcp::BuildTopology(0, 5, hosts, c, &t).ok());
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 3);
  c.gloo.local_rank = 3;
  Status s = tcp::BuildTopology(0, 5, hosts, c, &t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("HOROVOD_LOCAL_RANK"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace hvdc

namespace hvdc {
namespace {

// Where a rank of a static peer list listens, and what reaches the mesh from the config.
TEST(TcpTransport, IdentityBindAddressSecretAndToken) {
  Config c;
  c.tcp_peers = "127.0.0.1:4001,127.0.0.1:4002";
  c.gloo.rank = 1;
  c.secret_key = "s";
  tcp::Identity id;
  ASSERT_TRUE(tcp::IdentityFromConfig(c, &id).ok());
  EXPECT_EQ(id.bind_host, "127.0.0.1");  // its own entry, an address of this machine
  EXPECT_EQ(id.secret_key, "s");
  const uint64_t token = id.job_token;
  Config other = c;
  other.tcp_peers = "127.0.0.1:4001,127.0.0.1:4003";  // another cluster spec: another token
  ASSERT_TRUE(tcp::IdentityFromConfig(other, &id).ok());
  EXPECT_NE(id.job_token, token);
  other.tcp_peers = c.tcp_peers;
  other.gloo.rank = 0;  // the same spec seen by another rank: the same token
  ASSERT_TRUE(tcp::IdentityFromConfig(other, &id).ok());
  EXPECT_EQ(id.job_token, token);

  Config named = c;
  named.tcp_peers = "localhost:4001,localhost:4002";
  ASSERT_TRUE(tcp::IdentityFromConfig(named, &id).ok());
  EXPECT_TRUE(id.bind_host == "127.0.0.1" || id.bind_host == "::1") << id.bind_host;

  // Not this machine's (TEST-NET-3, RFC 5737), or not resolvable: every interface, with a reason.
  std::string note;
  EXPECT_EQ(tcp::StaticBindAddress("203.0.113.7", &note), "");
  EXPECT_NE(note.find("not an address of this machine"), std::string::npos) << note;
  note.clear();
  EXPECT_EQ(tcp::StaticBindAddress("no-such-host.invalid", &note), "");
  EXPECT_NE(note.find("does not resolve"), std::string::npos) << note;
  EXPECT_TRUE(tcp::IsLocalAddress("127.0.0.1"));
  EXPECT_FALSE(tcp::IsLocalAddress("203.0.113.7"));

  Config all = c;
  all.tcp_bind_address = "0.0.0.0";  // asked for: every interface
  ASSERT_TRUE(tcp::IdentityFromConfig(all, &id).ok());
  EXPECT_EQ(id.bind_host, "0.0.0.0");
  all.tcp_bind_address = "eth0";
  Status s = tcp::IdentityFromConfig(all, &id);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("HVDC_TCP_BIND_ADDRESS='eth0'"), std::string::npos) << s.message();
  Config iface = all;
  iface.gloo_iface = "lo";  // the interface wins
  ASSERT_TRUE(tcp::IdentityFromConfig(iface, &id).ok());
  EXPECT_EQ(id.bind_host, "127.0.0.1");
}

// Rank 2's process ends before a collective: rank 0's ring receives from rank 2 (its left
// neighbour) and fails naming it.
TEST(TcpHostComm, PeerGoneMidOperationNamesIt) {
  auto meshes = tcp_test::MakeMeshes(3);
  std::vector<std::unique_ptr<tcp::TcpHostComm>> comms;
  for (int r = 0; r < 3; ++r) {
    comms.push_back(std::make_unique<tcp::TcpHostComm>(tcp::Group(meshes[r], {0, 1, 2}, 7), 4096));
  }
  meshes[2]->Close();
  std::vector<float> v(100000, 1.0f);
  Status s = comms[0]->Allreduce(v.data(), v.data(), 100000, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kUnknownError);
  EXPECT_NE(s.message().find("rank 2 (127.0.0.1:"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace hvdc
