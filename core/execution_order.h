// The words a round of the global set carries after the negotiator's own, ANDed over all ranks.
// They let every rank take the same decisions at the end of the same round:
//
//   word 0, bit 0   this rank has a process-set change pending (after the AND: every rank has one)
//   words 1 and 2   the hash of that change and its complement: after the AND, word 1 == hash and
//                   word 2 == ~hash exactly when every rank proposed the same change
//   word 2 + seq    for every set created so far with creation number seq >= 1: how many rounds'
//                   batches of that set this rank holds (sequenced execution), as a thermometer
//                   code (n low bits set; at most 63), all ones when this rank holds none by design
//                   (not a member, not sequenced, removed). The AND is then the minimum over the
//                   members: the rounds every member holds and may run now.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hvdc {

struct HeldRounds {
  int seq = 0;        // the set's creation number (>= 1)
  size_t rounds = 0;  // rounds of batches this rank holds for it
};

// This rank's words. num_sets_created counts every set created so far, the global one included.
std::vector<uint64_t> EncodeOrderWords(bool change_pending, uint64_t change_hash,
                                       int num_sets_created, const std::vector<HeldRounds>& held);

// After the AND: did every rank propose a change in this round?
bool ChangeProposedByAll(const std::vector<uint64_t>& words);
// ... and was it the same change (the one hashing to `hash`)?
bool ChangeAgreed(const std::vector<uint64_t>& words, uint64_t hash);
// How many held rounds of set `seq` every member holds (0 when the words do not cover it).
int ReleasableRounds(const std::vector<uint64_t>& words, int seq);

}  // namespace hvdc
