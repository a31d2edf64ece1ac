#include "shm_controller/host_layout.h"

#include <algorithm>
#include <numeric>

namespace hvdc {
namespace shm {

HostLayout HostLayout::Of(const std::vector<int>& world_ranks,
                          const std::vector<std::string>& host_of_world) {
  HostLayout layout;
  std::vector<std::string> names;  // names[h]: host h's identity
  for (int r = 0; r < static_cast<int>(world_ranks.size()); ++r) {
    const std::string& name = host_of_world[static_cast<size_t>(world_ranks[r])];
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      names.push_back(name);
      layout.hosts.emplace_back();
      it = names.end() - 1;
    }
    layout.hosts[static_cast<size_t>(it - names.begin())].push_back(r);
  }
  return layout;
}

int HostLayout::local_size() const {
  if (hosts.empty()) return 0;
  const size_t n = hosts[0].size();
  for (const auto& h : hosts) {
    if (h.size() != n) return 0;
  }
  return static_cast<int>(n);
}

std::vector<int> HostLayout::CrossHosts(int i) const {
  std::vector<int> order(hosts.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return hosts[static_cast<size_t>(a)][static_cast<size_t>(i)] <
           hosts[static_cast<size_t>(b)][static_cast<size_t>(i)];
  });
  return order;
}

std::vector<int> HostLayout::CrossGroup(int i) const {
  std::vector<int> group;
  for (int h : CrossHosts(i))
    group.push_back(hosts[static_cast<size_t>(h)][static_cast<size_t>(i)]);
  return group;
}

void HostLayout::Locate(int r, int* host, int* local) const {
  *host = *local = -1;
  for (size_t h = 0; h < hosts.size(); ++h) {
    auto it = std::find(hosts[h].begin(), hosts[h].end(), r);
    if (it != hosts[h].end()) {
      *host = static_cast<int>(h);
      *local = static_cast<int>(it - hosts[h].begin());
      return;
    }
  }
}

}  // namespace shm
}  // namespace hvdc
