// Group: the members of one process set as the mesh sees them -- set ranks mapped to world ranks,
// and the channel their traffic uses. Shared by the control channel and the data plane.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tcp_controller/tcp_mesh.h"

namespace hvdc {
namespace tcp {

class Group {
 public:
  // members: sorted world ranks, including mesh->rank().
  Group(std::shared_ptr<Mesh> mesh, std::vector<int> members, uint32_t channel);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  int world_rank(int r) const { return members_[r]; }
  uint32_t channel() const { return channel_; }

  // r is a rank within the group; messages of any size (split as the mesh requires).
  Status Send(int r, const void* data, size_t bytes) {
    return mesh_->SendLarge(members_[r], channel_, data, bytes);
  }
  Status Recv(int r, void* dst, size_t bytes) {
    return mesh_->RecvLarge(members_[r], channel_, dst, bytes);
  }
  // One message of at most Mesh::kMaxFrameBytes, whatever its size.
  Status SendMessage(int r, const std::string& m) {
    return mesh_->Send(members_[r], channel_, m.data(), m.size());
  }
  Status RecvMessage(int r, std::string* m) { return mesh_->Recv(members_[r], channel_, m); }
  // Gives a message received with RecvMessage back to the mesh for reuse (Mesh::Recycle).
  void Recycle(std::string&& m) { mesh_->Recycle(std::move(m)); }
  bool TryRecvMessage(int r, std::string* m, Status* s) {
    return mesh_->TryRecv(members_[r], channel_, m, s);
  }

 private:
  std::shared_ptr<Mesh> mesh_;
  const std::vector<int> members_;
  const uint32_t channel_;
  int rank_ = 0;
};

}  // namespace tcp
}  // namespace hvdc
