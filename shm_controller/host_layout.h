// How the members of a process set sit on hosts, as every world rank computes it alike from the
// set's world ranks and every world rank's host identity (gathered once by ShmTransport): the
// hosts in order of their first member, the set ranks on each, and the groups a hierarchical
// collective runs over -- one per host (the local groups) and one per local index (the cross
// groups: the i-th member of every host).
#pragma once

#include <string>
#include <vector>

namespace hvdc {
namespace shm {

struct HostLayout {
  // hosts[h]: the set ranks on host h, ascending; hosts ordered by their lowest set rank.
  std::vector<std::vector<int>> hosts;

  // world_ranks: the set's (sorted) world ranks; host_of_world[w]: world rank w's host identity.
  static HostLayout Of(const std::vector<int>& world_ranks,
                       const std::vector<std::string>& host_of_world);

  int host_count() const { return static_cast<int>(hosts.size()); }
  // Ranks per host when every host has the same number, else 0.
  int local_size() const;
  // The set ranks of cross group i (the i-th member of every host), ascending: the cross
  // communicator's rank order. Needs local_size() > i.
  std::vector<int> CrossGroup(int i) const;
  // The hosts in cross group i's rank order: CrossHosts(i)[q] is the host of its rank q.
  std::vector<int> CrossHosts(int i) const;
  // The host and local index of set rank r, or {-1, -1} when r is not in the set.
  void Locate(int r, int* host, int* local) const;
};

}  // namespace shm
}  // namespace hvdc
