// The transport list of builtins/builtins.cc: which entry init() takes for each launch environment
// (the first that recognises it, in order of precedence), what each entry reports, and the error of
// init(comm=...) when the environment selects TCP. Nothing here starts a transport.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/build_config.h"
#include "core/builtin.h"

namespace hvdc {
namespace {

// The kind of the first entry that recognises (config, opts), as hvdc_init chooses.
TransportKind Chosen(const Builtins& b, const Config& config, const InitOptions& opts = {}) {
  for (const TransportEntry& t : b.transports) {
    if (t.recognises(config, opts)) return t.kind;
  }
  ADD_FAILURE() << "no entry recognises the environment";
  return TransportKind::kLocal;
}

InitOptions WithRanks() {
  InitOptions opts;
  opts.ranks = {0, 1};
  return opts;
}

TEST(BuiltinsTest, EnvironmentsChooseTransportsInOrderOfPrecedence) {
  Builtins b;
  RegisterBuiltins(&b);
  Config plain;
  EXPECT_EQ(Chosen(b, plain), TransportKind::kLocal);  // no launcher: one rank

  Config mpirun;
  mpirun.under_launcher = true;
  EXPECT_EQ(Chosen(b, mpirun), TransportKind::kMpi);

  Config gloo_in_mpirun = mpirun;
  gloo_in_mpirun.controller = "gloo";  // HOROVOD_CONTROLLER wins over the launcher
  EXPECT_EQ(Chosen(b, gloo_in_mpirun), TransportKind::kTcp);

  Config peers;
  peers.tcp_peers = "127.0.0.1:1,127.0.0.1:2";  // what TF_CONFIG becomes
  EXPECT_EQ(Chosen(b, peers), TransportKind::kTcp);
  Config peers_in_mpirun = peers;
  peers_in_mpirun.under_launcher = true;  // the launcher wins over identity variables
  EXPECT_EQ(Chosen(b, peers_in_mpirun), TransportKind::kMpi);

  Config rendezvous;
  rendezvous.gloo.rendezvous_addr = "127.0.0.1";
  EXPECT_EQ(Chosen(b, rendezvous), TransportKind::kTcp);
  Config cpu_ops;
  cpu_ops.cpu_operations = "gloo";
  EXPECT_EQ(Chosen(b, cpu_ops), TransportKind::kTcp);

  EXPECT_EQ(Chosen(b, plain, WithRanks()), TransportKind::kMpi);  // init(comm=[...])
  InitOptions borrowed;
  int fake_comm = 0;
  borrowed.mpi_comm = &fake_comm;
  EXPECT_EQ(Chosen(b, plain, borrowed), TransportKind::kMpi);
  EXPECT_EQ(Chosen(b, peers, WithRanks()), TransportKind::kTcp);  // fails when made (below)
}

TEST(BuiltinsTest, TcpWithMpiArgumentsFailsBeforeStarting) {
  Builtins b;
  RegisterBuiltins(&b);
  Config peers;
  peers.tcp_peers = "127.0.0.1:1,127.0.0.1:2";
  int tcp_entries = 0;
  for (const TransportEntry& t : b.transports) {
    if (t.kind != TransportKind::kTcp) continue;
    ++tcp_entries;
    std::unique_ptr<Transport> transport;
    const Status s = t.make(peers, WithRanks(), &transport);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "init(comm=...) needs MPI, but the TCP (gloo) transport was selected "
              "(HOROVOD_CONTROLLER/HOROVOD_CPU_OPERATIONS=gloo, HVDC_TCP_PEERS or "
              "HOROVOD_GLOO_RENDEZVOUS_ADDR)");
    EXPECT_EQ(transport, nullptr);
  }
  EXPECT_EQ(tcp_entries, 1);
}

TEST(BuiltinsTest, BuiltKindsFollowTheBuild) {
  Builtins b;
  RegisterBuiltins(&b);
  EXPECT_TRUE(b.Built(TransportKind::kTcp));
  EXPECT_TRUE(b.Built(TransportKind::kLocal));
  EXPECT_EQ(b.Built(TransportKind::kMpi), HVDC_HAVE_MPI != 0);
  EXPECT_EQ(b.cuda_built, HVDC_HAVE_NCCL != 0);
  ASSERT_FALSE(b.transports.empty());
  // The last entry takes any environment, so init() always finds one.
  EXPECT_TRUE(b.transports.back().recognises(Config(), InitOptions()));
}

}  // namespace
}  // namespace hvdc
