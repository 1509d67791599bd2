// transport/tcp/tcp_transport.h — the kernel-TCP backend: the default transport.
//
// One epoll set holds the listener and every peer socket; all sockets are non-blocking and the
// engine thread drives everything through Progress_st. Sends are written with sendmsg (writev
// semantics) straight from the registered regions — header and payload as separate iovecs, no
// copy — resuming at the exact byte after a partial write. Receives read the 64-byte header,
// ask the engine's resolver for a destination, then read the payload straight into it.
//
// Connections: Connect_st returns a handle at once and dials in the background, retrying
// refused/failed attempts with exponential back-off until connect_deadline; the dialer sends
// kHello (job, rank, token) and the acceptor answers kHelloOk or kReject(reason). A peer is
// declared down on reset/EOF/error at once, and on lack of progress with work pending after
// peer_timeout; its pending sends then fail in order and OnPeerDown_st follows.
//
// Guarantees: see transport/transport.h. In addition: no allocation on the data path (rings,
// control buffers, the epoll event array and the discard buffer are sized at Create); no
// SIGPIPE (MSG_NOSIGNAL); bad peer input closes that one connection and is counted.
// Thread rules: `_st` methods on the owning engine thread only; Stats()/PeerStatsOf() anywhere.
// What every backend shares — connection slots and handles, regions, jobs, the handshake checks,
// completions and peer-down — is transport/common/'s; this file is the socket side.
#ifndef GRADLANE_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define GRADLANE_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <sys/epoll.h>

#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/common/completions.h"
#include "transport/common/connection_table.h"
#include "transport/common/job_table.h"
#include "transport/common/region_table.h"
#include "transport/tcp/connection.h"
#include "transport/transport.h"

namespace gradlane::transport::tcp {

class TcpTransport final : public Transport {
 public:
  // Validates options and preallocates everything. `handler` must outlive the transport.
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(const TransportOptions& options,
                                                              TransportHandler* handler);
  // Closes every socket. No callbacks: the engine that owns the transport is going away.
  ~TcpTransport();
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  // Binds options.listen_address:listen_port and starts accepting. Returns the bound port.
  // A busy port is FailedPrecondition ("address already in use"). Call at most once.
  absl::StatusOr<uint16_t> Listen_st() override;

  // Accept peers of this job (inbound hellos are checked against it) and dial as it.
  // InvalidArgument for a token over kMaxTokenBytes or a rank outside the world size.
  absl::Status AddJob_st(const JobCredentials& job) override;
  // Closes the job's connections at once (pending sends fail with Cancelled, peers the engine
  // knows are reported down, synchronously) and stops accepting its hellos.
  absl::Status RemoveJob_st(uint64_t job_id) override;

  // Dials `address` ("host:port", numeric) as `job` (which AddJob_st must have registered).
  // Returns at once; OnPeerUp_st or OnPeerDown_st follows from Progress_st. Sends may be posted
  // to the handle right away: they go out when the handshake completes.
  absl::StatusOr<PeerHandle> Connect_st(const JobCredentials& job, std::string_view address,
                                        TimeNs now) override;

  // Says goodbye (best effort), fails the peer's pending sends with Cancelled and reports it
  // down. No-op for a stale handle.
  void Disconnect_st(PeerHandle peer, TimeNs now) override;

  // TCP needs no registration beyond bounds: the region is remembered so sends and receive
  // targets can be checked. The memory must stay valid until unregistered, and a region must
  // not be unregistered while sends from it are pending.
  absl::StatusOr<RegionId> RegisterRegion_st(void* base, uint64_t bytes) override;
  absl::Status UnregisterRegion_st(RegionId region) override;

  // Queues one segment behind the peer's earlier sends. InvalidArgument for a bad region range,
  // NotFound for a dead handle, ResourceExhausted when max_pending_sends_per_peer are
  // outstanding (the engine's credit window should keep it below that). Nothing is written
  // until the next Progress_st, so a burst of posts leaves in one writev.
  absl::Status PostSend_st(PeerHandle peer, const SendSpec& spec) override;

  // One step: flush queued output, handle socket events (waiting up to wait_ms for one when
  // nothing is ready; 0 = poll), run connect retries and timeouts. Returns events handled.
  int Progress_st(TimeNs now, int wait_ms) override;
  // Writes whose budget ran out wait for no event, only for the next Progress_st.
  bool HasDeferredWork_st() const override { return !dirty_.empty(); }

  // The epoll descriptor is the wait_fd: an engine sleeps on it alongside its own fds.
  TransportCapabilities capabilities() const override { return {false, epoll_fd_}; }
  std::string_view backend_name() const override { return "tcp"; }
  uint16_t listen_port() const { return listen_port_; }

  TransportStats Stats() const override;
  PeerStats PeerStatsOf(PeerHandle peer) const override;

 private:
  TcpTransport(const TransportOptions& options, TransportHandler* handler);
  absl::Status Init();

  PeerHandle HandleOf(const Connection& c) const { return conns_.HandleOf(c); }
  PeerInfo InfoOf(const Connection& c) const;
  Connection* AllocSlot(bool inbound);
  // Before an accept: if max_unauthenticated connections still owe their hello, closes the
  // one accepted first.
  void EvictOldestUnauthenticatedIfFull();

  void AcceptAll(TimeNs now);
  void StartAttempt(Connection& c, TimeNs now);
  void AttemptFailed(Connection& c, const absl::Status& why, TimeNs now);
  void OnConnected(Connection& c, TimeNs now);
  void HandleEvent(Connection& c, uint32_t events, TimeNs now);
  void ReadSome(Connection& c, TimeNs now);
  // Returns false when the connection was torn down.
  bool OnHeader(Connection& c, TimeNs now);
  bool OnBody(Connection& c, TimeNs now);
  bool OnPayloadDone(Connection& c, TimeNs now);
  bool OnAck(Connection& c, TimeNs now);
  void Flush(Connection& c, TimeNs now);
  void MarkDirty(Connection& c);
  void UpdateEpollOut(Connection& c, bool want);
  void CheckTimers(TimeNs now);
  // Protocol violation or refusal: count it, queue a reject/goodbye with the reason, stop
  // reading and close once flushed. Reports the peer down if it was up or ours.
  void Refuse(Connection& c, FrameType type, WireError code, const absl::Status& why, TimeNs now);
  // Fails the pending sends and reports the peer down (when it is a peer the engine knows: an
  // outbound handle or an inbound one that came up).
  void FailPendingAndReportDown(Connection& c, const absl::Status& why);
  // Tears the connection down now: closes the socket, FailPendingAndReportDown, retires the slot.
  void Teardown(Connection& c, const absl::Status& why);
  void CloseFd(Connection& c);
  void ReleaseDeadSlots();

  const TransportOptions options_;
  TransportHandler* const handler_;
  int epoll_fd_ = -1;
  static constexpr uint64_t kTrimAfterBytes = uint64_t{8} << 20;
  uint64_t released_since_trim_ = 0;
  TimeNs last_timer_scan_ = std::numeric_limits<TimeNs>::min() / 2;
  int listen_fd_ = -1;
  uint16_t listen_port_ = 0;
  // Connections hold atomics (live stats), so they never move: the table's fixed storage. Timers
  // scan its slots up to the high water mark, at most once per millisecond.
  ConnectionTable<Connection> conns_;
  std::vector<uint32_t> dirty_;  // slot indices
  std::vector<epoll_event> events_;
  JobTable jobs_;
  RegionTable regions_;
  std::vector<uint8_t> discard_;  // sink for payloads the engine rejected
  TransportCounters counters_;
  Completions report_{handler_, &counters_};
};

}  // namespace gradlane::transport::tcp

#endif  // GRADLANE_TRANSPORT_TCP_TCP_TRANSPORT_H_
