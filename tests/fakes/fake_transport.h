// tests/fakes/fake_transport.h — an in-memory transport with the TcpTransport interface, for
// scheduler and daemon tests that need peers without sockets.
//
// A FakeNetwork joins any number of FakeTransports by address ("host:port" strings; nothing is
// parsed or bound). Frames travel through per-endpoint inboxes and are handled when the
// receiver runs Progress_st with a `now` at or past their delivery time (send time + the
// network's delay), so a test on virtual time is fully deterministic: the same calls give the
// same callbacks in the same order.
//
// Behaviour mirrors the TCP backend where it matters to an engine: hello with job/token/rank
// checks (and the same refusal statuses), sends in post order, OnSendDone_st when a frame
// leaves, acks after the receiver's OnRecvDone_st, resolver rejection failing the sender's send,
// connect retry with back-off until connect_deadline, the peer_timeout watchdog, and peer-down
// failing pending sends in order. Faults: Kill(address) makes an endpoint vanish — loudly (peers
// see a reset on their next step) or silently (frames are dropped; peers find out through
// peer_timeout).
//
// What every backend shares comes from transport/common/, as in TcpTransport: the connection
// table (handles are slot + generation, so a stale handle never reaches a later connection),
// the job and region tables, the hello and its refusals, completions and fail-pending-then-
// peer-down. What is fake is only the wire: messages in inboxes instead of bytes on a socket.
//
// Test-only (tests/fakes/, never linked into the daemon): it allocates (payload copies, inbox
// entries) and is single-threaded — every method, Stats() included, on the one test/engine
// thread.
#ifndef GRADLANE_TESTS_FAKES_FAKE_TRANSPORT_H_
#define GRADLANE_TESTS_FAKES_FAKE_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/common/completions.h"
#include "transport/common/connection_table.h"
#include "transport/common/job_table.h"
#include "transport/common/region_table.h"
#include "transport/transport.h"

namespace gradlane::transport::fake {

class FakeTransport;

class FakeNetwork {
 public:
  // One-way latency of every frame from now on.
  void set_delay(TimeNs delay) { delay_ = delay; }
  TimeNs delay() const { return delay_; }
  // A by_piece receive target gets the payload in pieces of this many bytes (the last may be
  // shorter), as a packet backend would; 0: in one piece.
  void set_piece_bytes(uint32_t bytes) { piece_bytes_ = bytes; }
  // A hostile peer: every data frame's header passes through `tamper` on its way (null: none).
  void set_tamper(std::function<void(FrameHeader&)> tamper) { tamper_ = std::move(tamper); }

  // The endpoint listening at `address` vanishes. silent=false: like a killed process, its peers
  // see a reset on their next Progress_st. silent=true: like a pulled cable, every frame to or
  // from it is dropped from now on and its peers must notice via peer_timeout.
  void Kill(std::string_view address, bool silent);

 private:
  friend class FakeTransport;
  FakeTransport* Find(std::string_view address) const;

  absl::flat_hash_map<std::string, FakeTransport*> endpoints_;
  TimeNs delay_ = 0;
  uint32_t piece_bytes_ = 0;
  std::function<void(FrameHeader&)> tamper_;
  uint16_t next_port_ = 1;
  int next_identity_ = 0;
};

class FakeTransport final : public Transport {
 public:
  // `network` and `handler` must outlive the transport.
  static absl::StatusOr<std::unique_ptr<FakeTransport>> Create(const TransportOptions& options,
                                                               TransportHandler* handler,
                                                               FakeNetwork* network);
  // Leaving the network is a process exit: connected peers see a reset.
  ~FakeTransport();
  FakeTransport(const FakeTransport&) = delete;
  FakeTransport& operator=(const FakeTransport&) = delete;

  // Registers listen_address:listen_port (port 0: the network picks one). An address already
  // taken is FailedPrecondition ("already in use"), as with TCP.
  // Like a packet backend (see FakeNetwork::set_piece_bytes); virtual time, nothing to sleep on.
  // GPU memory: a dma-buf is mapped and read and written by memcpy, as a NIC does by DMA (the
  // tests' "dma-bufs" are the fake CUDA driver's memfds). As on verbs, the region's addresses
  // are the iova (the client's device addresses, which fault if the CPU touches them), and a
  // segment into one must carry kFlagRendezvous or is refused (device_eager_refused()).
  TransportCapabilities capabilities() const override { return {true, -1, true}; }
  std::string_view backend_name() const override { return "fake"; }
  absl::StatusOr<uint16_t> Listen_st() override;
  const std::string& address() const { return address_; }

  absl::Status AddJob_st(const JobCredentials& job) override;
  absl::Status RemoveJob_st(uint64_t job_id) override;
  absl::StatusOr<PeerHandle> Connect_st(const JobCredentials& job, std::string_view address,
                                        TimeNs now) override;
  void Disconnect_st(PeerHandle peer, TimeNs now) override;
  absl::StatusOr<RegionId> RegisterRegion_st(void* base, uint64_t bytes) override;
  absl::Status UnregisterRegion_st(RegionId region) override;
  absl::StatusOr<RegionId> RegisterDeviceRegion_st(int dmabuf_fd, uint64_t bytes,
                                                   uint64_t iova) override;
  // Device regions registered now, and segments refused for coming into one without
  // kFlagRendezvous.
  size_t device_regions() const { return device_maps_.size(); }
  uint64_t device_eager_refused() const { return device_eager_refused_; }
  absl::Status PostSend_st(PeerHandle peer, const SendSpec& spec) override;
  // Sends what is queued, handles inbox frames due by `now`, runs retries and timeouts.
  // wait_ms is ignored (virtual time never blocks). Returns frames handled.
  int Progress_st(TimeNs now, int wait_ms) override;

  TransportStats Stats() const override { return counters_.Snapshot(); }
  PeerStats PeerStatsOf(PeerHandle peer) const override;

 private:
  friend class FakeNetwork;  // Kill() reaches in to reset this endpoint's peers
  enum class State : uint8_t { kBackoff, kHelloSent, kEstablished, kDown };
  struct Conn {
    // A slot is reused: everything but the queue's storage starts afresh.
    void Reset();
    State state = State::kBackoff;
    bool inbound = false;
    bool known = false;  // the engine holds the handle: it gets OnPeerDown_st
    int job = -1;        // JobTable index
    uint16_t peer_rank = 0;
    std::string remote_address;
    PeerHandle remote_conn = kNoPeer;
    uint32_t next_seq = 0;
    int attempts = 0;
    // Posted sends in post order: the first `sent` have left and await their ack.
    std::deque<PendingSend> pending;
    size_t sent = 0;
    TimeNs give_up_at = 0, retry_at = 0, backoff = 0, last_progress = 0;
    bool restart_timer = false;
    PeerCounters counters;
  };
  struct Message {
    TimeNs deliver_at = 0;
    FrameType type = FrameType::kData;
    PeerHandle to_conn = kNoPeer;    // receiver's connection (kNoPeer for kHello)
    PeerHandle from_conn = kNoPeer;  // sender's connection
    std::string from_address;
    FrameHeader header{};
    HelloBody hello{};
    WireError code = WireError::kNone;
    std::string reason;
    std::vector<uint8_t> payload;
  };
  FakeTransport(const TransportOptions& options, TransportHandler* handler, FakeNetwork* network);
  PeerInfo InfoOf(const Conn& c) const;
  Conn* AllocConn();
  // Delivers to the endpoint at `to` unless it is gone or silenced.
  void Deliver(const std::string& to, Message m);
  void TryHello(Conn& c, TimeNs now);
  void Flush(TimeNs now);
  void Handle(Message& m, TimeNs now);
  void HandleHello(Message& m, TimeNs now);
  void HandleData(Conn& c, Message& m, TimeNs now);
  void HandleAck(Conn& c, const Message& m, TimeNs now);
  void Reply(const Message& to, FrameType type, WireError code, const std::string& reason,
             const Conn* from, TimeNs now);
  // The connection is down: with tell_peer, a goodbye with `code` goes to a peer it reached;
  // then its sends fail in order and the engine hears of it (common/completions.h).
  void Down(Conn& c, const absl::Status& why, bool tell_peer, TimeNs now,
            WireError code = WireError::kShutdown);

  const TransportOptions options_;
  TransportHandler* const handler_;
  FakeNetwork* const network_;
  std::string address_;
  bool silenced_ = false;
  ConnectionTable<Conn> conns_;  // slots freed at the start of the next Progress_st
  JobTable jobs_;
  TimeNs now_ = 0;  // the latest time Progress_st or Connect_st was given
  RegionTable regions_;
  // Device regions: the mapping of the dma-buf behind each iova range, unmapped when
  // unregistered.
  struct DeviceMap {
    uint8_t* host = nullptr;
    uint64_t bytes = 0;
    uint64_t iova = 0;
  };
  absl::flat_hash_map<RegionId, DeviceMap> device_maps_;
  uint64_t device_eager_refused_ = 0;
  // The mapping behind `at` in device region `region` (what the NIC touches); `at` itself for
  // any other region.
  uint8_t* NicAddress(RegionId region, const uint8_t* at) const;
  std::deque<Message> inbox_;
  TransportCounters counters_;
  Completions report_{handler_, &counters_};
};

}  // namespace gradlane::transport::fake

#endif  // GRADLANE_TESTS_FAKES_FAKE_TRANSPORT_H_
