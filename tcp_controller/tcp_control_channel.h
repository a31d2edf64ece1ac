// TcpControlChannel: the ControlChannel over the members of one process set on the TCP mesh, with
// a channel of its own (negotiation never shares a queue with the data plane).
//   BitAnd     every rank sends its words to every other (one round), then ANDs what arrives
//   Gather     every rank sends its blob to rank 0
//   Broadcast  rank 0 sends its blob to every rank
// Start* sends at once (a send never waits for the receiver's program: the mesh reads eagerly) and
// Test() only looks at what has arrived, so the control thread never blocks on a peer. A peer
// whose connection fails makes the pending op fail with the mesh's error naming it. A message is
// at most Mesh::kMaxFrameBytes (64 MiB); control messages are far smaller. An op destroyed before
// it completes leaves its peers' messages unread, so the channel is unusable afterwards (the
// runtime only does that when it is giving up on the job).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/control_channel.h"
#include "tcp_controller/tcp_group.h"

namespace hvdc {
namespace tcp {

class TcpControlChannel : public ControlChannel {
 public:
  explicit TcpControlChannel(Group group) : group_(std::move(group)) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  std::unique_ptr<PendingOp> StartBitAnd(std::vector<uint64_t>* bits) override;
  std::unique_ptr<PendingOp> StartGather(std::string send,
                                         std::vector<std::string>* gathered) override;
  std::unique_ptr<PendingOp> StartBroadcast(std::string* blob) override;

 private:
  Group group_;
};

}  // namespace tcp
}  // namespace hvdc
