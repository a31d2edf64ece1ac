#include "tcp_controller/tcp_group.h"

#include <algorithm>
#include <utility>

namespace hvdc {
namespace tcp {

Group::Group(std::shared_ptr<Mesh> mesh, std::vector<int> members, uint32_t channel)
    : mesh_(std::move(mesh)), members_(std::move(members)), channel_(channel) {
  rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), mesh_->rank()) -
                           members_.begin());
}

}  // namespace tcp
}  // namespace hvdc
