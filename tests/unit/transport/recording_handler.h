// A TransportHandler that records every callback, with a pluggable receive resolver; shared by
// the TCP and fake transport tests.
#ifndef GRADLANE_TESTS_UNIT_TRANSPORT_RECORDING_HANDLER_H_
#define GRADLANE_TESTS_UNIT_TRANSPORT_RECORDING_HANDLER_H_

#include <time.h>

#include <functional>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace gradlane::transport::testing {

inline TimeNs MonotonicNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<TimeNs>(ts.tv_sec) * sched::kSecond + ts.tv_nsec;
}

class RecordingHandler : public TransportHandler {
 public:
  struct Received {
    PeerInfo peer;
    FrameHeader header;
    RecvTarget target;
  };

  void OnPeerUp_st(const PeerInfo& peer) override { up.push_back(peer); }
  void OnPeerDown_st(const PeerInfo& peer, const absl::Status& why) override {
    down.emplace_back(peer, why);
    down_at.push_back(MonotonicNow());
  }
  void OnSendDone_st(const SendCompletion& s) override { done.push_back(s); }
  void OnSendAcked_st(const SendCompletion& s, TimeNs) override { acked.push_back(s); }
  void OnSendFailed_st(const SendCompletion& s, const absl::Status& why) override {
    failed.emplace_back(s, why);
    failed_at.push_back(MonotonicNow());
  }
  RecvTarget ResolveRecv_st(const PeerInfo& peer, const FrameHeader& h) override {
    ++resolves;
    return resolve ? resolve(peer, h) : RecvTarget::Reject();
  }
  void OnRecvDone_st(const PeerInfo& peer, const FrameHeader& h, const RecvTarget& t,
                     TimeNs) override {
    received.push_back(Received{peer, h, t});
  }

  std::function<RecvTarget(const PeerInfo&, const FrameHeader&)> resolve;
  std::vector<PeerInfo> up;
  std::vector<std::pair<PeerInfo, absl::Status>> down;
  std::vector<TimeNs> down_at;
  std::vector<SendCompletion> done;
  std::vector<SendCompletion> acked;
  std::vector<std::pair<SendCompletion, absl::Status>> failed;
  std::vector<TimeNs> failed_at;
  std::vector<Received> received;
  int resolves = 0;
};

}  // namespace gradlane::transport::testing

#endif  // GRADLANE_TESTS_UNIT_TRANSPORT_RECORDING_HANDLER_H_
