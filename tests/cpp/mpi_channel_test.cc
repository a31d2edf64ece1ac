// The MPI transport and control channel under mpirun (np 2 and 3): topology, every control
// operation with blobs of many sizes (empty included), process sets (overlapping ones, singletons,
// sets this rank is not in), agreement checks, the borrowed and rank-subset worlds, and Finalize
// leaving an MPI it did not initialize alone. main() initializes MPI itself, so every transport
// here uses an MPI it does not own.
//
// Collectives are never skipped after a failed check (EXPECT, not ASSERT, around them), so a
// failure cannot turn into a hang. Rank 0 prints gtest's output, other ranks only their failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/transport.h"
#include "mpi_controller/mpi_context.h"
#include "mpi_controller/mpi_transport.h"

namespace hvdc {
namespace {

int g_rank = 0;
int g_size = 1;
int g_provided = MPI_THREAD_SINGLE;

std::unique_ptr<Transport> NewTransport(const MpiTransportOptions& opts = {},
                                        const Config& config = Config()) {
  std::unique_ptr<Transport> t;
  Status s = MakeMpiTransport(config, opts, &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return t;
}

Status Wait(std::unique_ptr<PendingOp> op) {
  Status status;
  while (!op->Test(&status)) std::this_thread::yield();
  return status;
}

std::vector<int> Range(int begin, int end) {
  std::vector<int> v;
  for (int i = begin; i < end; ++i) v.push_back(i);
  return v;
}

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

uint64_t BitWord(int rank, int iter, size_t w) {
  return ~(uint64_t{1} << ((rank * 7 + iter * 3 + w) % 64));
}

std::string Blob(int rank, int iter) {
  const int len = (rank * 5 + iter * 3) % 7 == 0 ? 0 : (rank * 131 + iter * 17) % 300 + 1;
  std::string s(static_cast<size_t>(len), '\0');
  for (int i = 0; i < len; ++i) s[i] = static_cast<char>((rank * 31 + iter * 7 + i) & 0xff);
  return s;
}

// Every control operation on one channel, whose ranks are `members` (world ranks, in order).
void ExerciseChannel(ControlChannel& channel, const std::vector<int>& members, int iters) {
  const int n = static_cast<int>(members.size());
  const int me = channel.rank();
  EXPECT_EQ(channel.size(), n);
  EXPECT_EQ(members[me], g_rank);
  for (int iter = 0; iter < iters; ++iter) {
    // BitAnd, lengths 0..7 words.
    const size_t len = static_cast<size_t>(iter % 8);
    std::vector<uint64_t> bits(len);
    for (size_t w = 0; w < len; ++w) bits[w] = BitWord(members[me], iter, w);
    Status s = Wait(channel.StartBitAnd(&bits));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(bits.size(), len);
    for (size_t w = 0; w < len && w < bits.size(); ++w) {
      uint64_t expected = ~uint64_t{0};
      for (int r : members) expected &= BitWord(r, iter, w);
      EXPECT_EQ(bits[w], expected) << "iter " << iter << " word " << w;
    }

    // Gather at member 0.
    std::vector<std::string> gathered = {"stale"};
    s = Wait(channel.StartGather(Blob(members[me], iter), &gathered));
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (me == 0) {
      EXPECT_EQ(static_cast<int>(gathered.size()), n);
      for (int r = 0; r < n && r < static_cast<int>(gathered.size()); ++r) {
        EXPECT_EQ(gathered[r], Blob(members[r], iter)) << "from " << r << " iter " << iter;
      }
    } else {
      EXPECT_TRUE(gathered.empty());
    }

    // Broadcast from member 0; the others start with junk of another length.
    std::string blob = me == 0 ? Blob(members[0] + 1, iter) : std::string(me * 3 + 1, 'j');
    s = Wait(channel.StartBroadcast(&blob));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(blob, Blob(members[0] + 1, iter)) << "iter " << iter;
  }
}

TEST(MpiTransport, Topology) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  const Topology& topo = t->topology();
  EXPECT_EQ(topo.rank, g_rank);
  EXPECT_EQ(topo.size, g_size);
  // mpirun on one host: every rank is local.
  EXPECT_EQ(topo.local_rank, g_rank);
  EXPECT_EQ(topo.local_size, g_size);
  EXPECT_EQ(topo.cross_rank, 0);
  EXPECT_EQ(topo.cross_size, 1);
  EXPECT_TRUE(topo.homogeneous);
  EXPECT_STREQ(t->name(), "mpi");
  EXPECT_EQ(t->threads_supported(), g_provided == MPI_THREAD_MULTIPLE);
  t->Finalize();
  t->Finalize();  // idempotent
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0) << "the transport finalized an MPI it did not initialize";
}

TEST(MpiTransport, ThreadsDisabled) {
  Config config;
  config.mpi_threads_disable = true;
  std::unique_ptr<Transport> t = NewTransport({}, config);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->threads_supported());
  t->Finalize();
}

TEST(MpiControlChannel, EveryOperationOnTheWorld) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  ProcessSetChannels set;
  Status s = t->CreateProcessSet(Range(0, g_size), &set);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_NE(set.control, nullptr);
  ASSERT_NE(set.data, nullptr);
  EXPECT_EQ(set.control->rank(), g_rank);
  ExerciseChannel(*set.control, Range(0, g_size), 40);
  set = ProcessSetChannels();
  t->Finalize();
}

TEST(MpiControlChannel, LargeAndEmptyBlobs) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  ProcessSetChannels set;
  ASSERT_TRUE(t->CreateProcessSet(Range(0, g_size), &set).ok());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, size_t{3} << 20}) {
    // Gather: only the last rank sends `bytes`, the others nothing.
    std::string mine(g_rank == g_size - 1 ? bytes : 0, static_cast<char>('a' + g_rank));
    std::vector<std::string> gathered;
    Status s = Wait(set.control->StartGather(mine, &gathered));
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (g_rank == 0 && static_cast<int>(gathered.size()) == g_size) {
      for (int r = 0; r < g_size; ++r) {
        EXPECT_EQ(gathered[r],
                  std::string(r == g_size - 1 ? bytes : 0, static_cast<char>('a' + r)));
      }
    }
    std::string blob = g_rank == 0 ? std::string(bytes, 'z') : std::string(7, 'j');
    s = Wait(set.control->StartBroadcast(&blob));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(blob, std::string(bytes, 'z'));
  }
  std::vector<uint64_t> long_bits(4096, ~uint64_t{0});
  long_bits[g_rank] = 0;
  EXPECT_TRUE(Wait(set.control->StartBitAnd(&long_bits)).ok());
  for (int w = 0; w < 4096; ++w) EXPECT_EQ(long_bits[w], w < g_size ? 0u : ~uint64_t{0});
  set = ProcessSetChannels();
  t->Finalize();
}

TEST(MpiTransport, ProcessSets) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  std::vector<std::vector<int>> sets = {
      Range(0, g_size),  // everyone
      {0},               // singletons
      {g_size - 1},
      Range(0, 2),  // overlapping pairs (np 3: {0,1} and {1,2})
      Range(g_size - 2, g_size),
      Range(1, g_size),  // rank 0 is not in it
  };
  std::vector<ProcessSetChannels> channels(sets.size());
  for (size_t k = 0; k < sets.size(); ++k) {
    Status s = t->CreateProcessSet(sets[k], &channels[k]);
    EXPECT_TRUE(s.ok()) << s.ToString();
    const bool member = Contains(sets[k], g_rank);
    EXPECT_EQ(channels[k].control != nullptr, member) << "set " << k;
    EXPECT_EQ(channels[k].data != nullptr, member) << "set " << k;
  }
  // Each set on its own, in the same order everywhere.
  for (size_t k = 0; k < sets.size(); ++k) {
    if (!channels[k].control) continue;
    const int index =
        static_cast<int>(std::find(sets[k].begin(), sets[k].end(), g_rank) - sets[k].begin());
    EXPECT_EQ(channels[k].control->rank(), index);
    EXPECT_EQ(channels[k].data->rank(), index);
    EXPECT_EQ(channels[k].data->size(), static_cast<int>(sets[k].size()));
    ExerciseChannel(*channels[k].control, sets[k], 10);
    // The data plane is a separate communicator of the same members.
    int64_t v[2] = {g_rank, 1};
    Status s = channels[k].data->Allreduce(v, v, 2, DataType::kInt64, ReduceOp::kSum);
    EXPECT_TRUE(s.ok()) << s.ToString();
    int64_t rank_sum = 0;
    for (int r : sets[k]) rank_sum += r;
    EXPECT_EQ(v[0], rank_sum);
    EXPECT_EQ(v[1], static_cast<int64_t>(sets[k].size()));
  }
  // All of this rank's sets with an operation outstanding at once, progressed together.
  for (int iter = 0; iter < 10; ++iter) {
    std::vector<std::vector<uint64_t>> bits(sets.size());
    std::vector<std::unique_ptr<PendingOp>> ops(sets.size());
    for (size_t k = 0; k < sets.size(); ++k) {
      if (!channels[k].control) continue;
      bits[k] = {~(uint64_t{1} << g_rank), static_cast<uint64_t>(iter)};
      ops[k] = channels[k].control->StartBitAnd(&bits[k]);
    }
    for (bool pending = true; pending;) {
      pending = false;
      for (size_t k = 0; k < sets.size(); ++k) {
        Status s;
        if (!ops[k]) continue;
        if (ops[k]->Test(&s)) {
          EXPECT_TRUE(s.ok()) << s.ToString();
          ops[k].reset();
        } else {
          pending = true;
        }
      }
      std::this_thread::yield();
    }
    for (size_t k = 0; k < sets.size(); ++k) {
      if (!channels[k].control) continue;
      uint64_t expected = ~uint64_t{0};
      for (int r : sets[k]) expected &= ~(uint64_t{1} << r);
      EXPECT_EQ(bits[k][0], expected) << "set " << k;
      EXPECT_EQ(bits[k][1], static_cast<uint64_t>(iter));
    }
  }
  channels.clear();
  t->Finalize();
}

TEST(MpiTransport, ProcessSetErrorsAreTheSameEverywhere) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  ProcessSetChannels set;
  // Ranks disagree on the list.
  Status s = t->CreateProcessSet(g_rank == 1 ? Range(0, 1) : Range(0, g_size), &set);
  EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
  EXPECT_EQ(set.control, nullptr);
  // Bad lists.
  for (const std::vector<int>& bad : {std::vector<int>{}, std::vector<int>{1, 0},
                                      std::vector<int>{0, 0}, std::vector<int>{g_size}}) {
    s = t->CreateProcessSet(bad, &set);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_EQ(set.control, nullptr);
    EXPECT_EQ(set.data, nullptr);
  }
  // Still in step.
  s = t->CreateProcessSet(Range(0, g_size), &set);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (set.data) {
    EXPECT_TRUE(set.data->Barrier().ok());
  }
  set = ProcessSetChannels();
  t->Finalize();
}

TEST(MpiTransport, CheckAgreement) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  const uint64_t values[] = {0, 1, 0x8000000000000000ull, ~uint64_t{0}, 0x123456789abcdefull};
  for (uint64_t v : values) {
    bool equal = false;
    EXPECT_TRUE(t->CheckAgreement(v, &equal).ok());
    EXPECT_TRUE(equal) << v;
    // One rank differs (the last, or rank 0), by one bit or by everything.
    equal = true;
    EXPECT_TRUE(t->CheckAgreement(g_rank == g_size - 1 ? v ^ 1 : v, &equal).ok());
    EXPECT_FALSE(equal) << v;
    equal = true;
    EXPECT_TRUE(t->CheckAgreement(g_rank == 0 ? ~v : v, &equal).ok());
    EXPECT_FALSE(equal) << v;
  }
  t->Finalize();
}

TEST(MpiTransport, BorrowedCommunicator) {
  // The user's communicator orders ranks in reverse; the transport's world follows it.
  MPI_Comm reversed = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - 1 - g_rank, &reversed);
  MpiTransportOptions opts;
  opts.borrowed_comm = &reversed;
  std::unique_ptr<Transport> t = NewTransport(opts);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->topology().rank, g_size - 1 - g_rank);
  EXPECT_EQ(t->topology().size, g_size);
  ProcessSetChannels set;
  EXPECT_TRUE(t->CreateProcessSet({0}, &set).ok());  // world rank g_size - 1
  EXPECT_EQ(set.control != nullptr, g_rank == g_size - 1);
  set = ProcessSetChannels();
  t->Finalize();
  // The borrowed communicator is still the user's, and still works.
  int one = 1, sum = 0;
  EXPECT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, reversed), MPI_SUCCESS);
  EXPECT_EQ(sum, g_size);
  MPI_Comm_free(&reversed);

  MPI_Comm null_comm = MPI_COMM_NULL;
  opts.borrowed_comm = &null_comm;
  std::unique_ptr<Transport> bad;
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad, nullptr);
}

TEST(MpiTransport, RankSubset) {
  // World ranks {last, 0}: in that order, so the last world rank becomes rank 0.
  MpiTransportOptions opts;
  opts.ranks = {g_size - 1, 0};
  std::unique_ptr<Transport> t;
  Status s = MakeMpiTransport(Config(), opts, &t);
  const bool member = g_rank == 0 || g_rank == g_size - 1;
  if (!member) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("not in the requested ranks"), std::string::npos) << s.message();
    EXPECT_EQ(t, nullptr);
  } else {
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(t->topology().size, 2);
    EXPECT_EQ(t->topology().rank, g_rank == 0 ? 1 : 0);
    EXPECT_EQ(t->topology().local_size, 2);
    ProcessSetChannels set;
    EXPECT_TRUE(t->CreateProcessSet({0, 1}, &set).ok());
    if (set.control) ExerciseChannel(*set.control, {g_size - 1, 0}, 5);
    bool equal = false;
    EXPECT_TRUE(t->CheckAgreement(42, &equal).ok());
    EXPECT_TRUE(equal);
    set = ProcessSetChannels();
    t->Finalize();
  }
  // Bad lists fail everywhere, before any communication.
  opts.ranks = {0, 0};
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &t).code(), StatusCode::kInvalidArgument);
  opts.ranks = {g_size};
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &t).code(), StatusCode::kInvalidArgument);
  opts.ranks = {0};
  MPI_Comm comm = MPI_COMM_WORLD;
  opts.borrowed_comm = &comm;
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &t).code(), StatusCode::kInvalidArgument);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiTransport, SeveralTransportsAtOnce) {
  std::unique_ptr<Transport> a = NewTransport();
  std::unique_ptr<Transport> b = NewTransport();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ProcessSetChannels sa, sb;
  EXPECT_TRUE(a->CreateProcessSet(Range(0, g_size), &sa).ok());
  a->Finalize();  // b keeps working
  EXPECT_TRUE(b->CreateProcessSet(Range(0, g_size), &sb).ok());
  if (sb.control) ExerciseChannel(*sb.control, Range(0, g_size), 3);
  // Channels outliving their transport still work and free their communicators.
  if (sa.control) ExerciseChannel(*sa.control, Range(0, g_size), 3);
  sa = ProcessSetChannels();
  sb = ProcessSetChannels();
  b->Finalize();
}

// On ranks other than 0, print failures only, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", g_rank,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
};

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &hvdc::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &hvdc::g_size);
  MPI_Query_thread(&hvdc::g_provided);
  ::testing::InitGoogleTest(&argc, argv);
  if (hvdc::g_rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new hvdc::FailurePrinter);
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int ranks_failed = 0;
  MPI_Allreduce(&failed, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (hvdc::g_rank == 0 && ranks_failed > 0) {
    std::fprintf(stderr, "%d rank(s) failed\n", ranks_failed);
  }
  MPI_Finalize();
  return ranks_failed > 0 ? 1 : 0;
}
