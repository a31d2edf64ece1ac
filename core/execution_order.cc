#include "core/execution_order.h"

#include <algorithm>

namespace hvdc {

std::vector<uint64_t> EncodeOrderWords(bool change_pending, uint64_t change_hash,
                                       int num_sets_created, const std::vector<HeldRounds>& held) {
  std::vector<uint64_t> w(3 + static_cast<size_t>(std::max(num_sets_created - 1, 0)), ~0ULL);
  w[0] = change_pending ? 1 : 0;
  w[1] = change_pending ? change_hash : 0;
  w[2] = ~w[1];
  for (const HeldRounds& h : held) {
    const size_t word = 2 + static_cast<size_t>(h.seq);
    if (h.seq < 1 || word >= w.size()) continue;
    w[word] = h.rounds >= 64 ? ~0ULL : (1ULL << h.rounds) - 1;
  }
  return w;
}

bool ChangeProposedByAll(const std::vector<uint64_t>& words) {
  return words.size() >= 3 && (words[0] & 1) != 0;
}

bool ChangeAgreed(const std::vector<uint64_t>& words, uint64_t hash) {
  return ChangeProposedByAll(words) && words[1] == hash && words[2] == ~hash;
}

int ReleasableRounds(const std::vector<uint64_t>& words, int seq) {
  const size_t word = 2 + static_cast<size_t>(seq);
  if (seq < 1 || word >= words.size()) return 0;
  return __builtin_popcountll(words[word]);
}

}  // namespace hvdc
