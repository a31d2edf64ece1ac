// For suites run as several processes (under mpirun or tcp_launch.py): on ranks other than 0,
// GoogleTest's printer is replaced by one that prints only failures, tagged with the rank, so the
// output of np ranks stays readable.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

namespace hvdc_test {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

// Call after InitGoogleTest, before RUN_ALL_TESTS.
inline void PrintOnlyFailuresUnlessRankZero(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace hvdc_test
