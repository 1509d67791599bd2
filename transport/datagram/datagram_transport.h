// transport/datagram/datagram_transport.h — gradlane's reliable datagram protocol: a complete
// Transport (transport/transport.h) over any unreliable datagram link.
//
// DPDK gives packets, not reliability; this class adds it, and nothing in transport/datagram/
// knows about DPDK: it sends and receives through a DatagramLink (datagram_link.h) and takes time
// as an argument, so the unit tests run it over an in-memory lossy pipe on virtual time, and the
// DPDK backend (transport/dpdk/) runs the same code over a NIC port. The shape follows
// eRPC/Machnet, one concern per file:
//   - send_window.h: per connection, the packets in flight, bounded by our window and the
//     receiver's credit; cumulative + selective acks; RTO from RTT samples (RFC 6298, Karn's
//     rule, exponential back-off) and fast retransmission of holes;
//   - reorder_buffer.h: per connection, in-order release, early packets held in `window` slots
//     (the credit offered never exceeds that, so nobody is overrun), the ack fields piggybacked
//     on every header, delayed pure acks;
//   - faulty_link.h: drop / reorder / duplicate on transmit, in front of the link when the
//     options ask for it, to prove the rest;
//   - ipv4_udp.h: addresses, and the IPv4/UDP framing the port puts around each datagram;
//   - datagram_wire.h: the datagram header.
// What every backend shares comes from transport/common/, as in TcpTransport: the connection
// table (slots with generation-checked handles, for dialed and accepted peers), the job and
// region tables, the hello and its refusals, completions and fail-pending-then-peer-down.
// This class ties them together:
//   - the handshake of the TCP backend (hello with job, rank, world and token → hello-ok or
//     reject with the same WireError codes and statuses: transport/common/hello.h) carried in
//     datagrams and repeated until answered, keepalive probes so a vanished peer is
//     noticed after peer_timeout even when idle, a best-effort close with a reason, and
//     rate-limited answers to datagrams for no connection;
//   - segmentation: a segment (FrameHeader + payload) becomes packets of the link's largest
//     datagram (jumbo where the port allows); the first carries the FrameHeader;
//   - in-order delivery: the engine sees ResolveRecv_st/OnRecvDone_st per segment in send order;
//     in-order packets are copied straight to the destination (or, for a by_piece target, handed
//     to OnRecvPiece_st in segment order), only out-of-order ones are held;
//   - the credit each connection is offered: the window, or the port's receive budget split
//     among the inbound connections.
//
// Guarantees: those of transport/transport.h. The send source is referenced, not copied, until
// the segment is acknowledged (retransmissions read it again), so the engine's rule "reuse a
// buffer after ack/fail" is exactly what this backend needs. No allocation on the data path: send
// rings, packet rings and the reorder buffer are sized when a connection slot is first used
// (control path) and kept. The link and the handler are borrowed and must outlive the transport;
// the fault injector, when there is one, is owned. Thread rules: `_st` methods and the
// DatagramSink callback on the owning engine thread; Stats()/PeerStatsOf()/DatagramStatsNow()
// from any thread (relaxed atomics).
#ifndef GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_TRANSPORT_H_
#define GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/common/completions.h"
#include "transport/common/connection_table.h"
#include "transport/common/job_table.h"
#include "transport/common/region_table.h"
#include "transport/datagram/datagram_link.h"
#include "transport/datagram/datagram_wire.h"
#include "transport/datagram/faulty_link.h"
#include "transport/datagram/ipv4_udp.h"
#include "transport/datagram/reorder_buffer.h"
#include "transport/datagram/send_window.h"
#include "transport/transport.h"

namespace gradlane::transport::datagram {

struct DatagramOptions {
  // Packets in flight per connection, and the credit (reorder buffer) each receiver offers.
  uint32_t window_packets = kMaxWindow;
  // What the port can hold for us between polls, in packets (0: no limit). The credit offered
  // is this split among the connections that send to us (inbound ones, at least 8 packets
  // each), so W - 1 peers sending at once cannot overrun the port: 7 senders with 256-packet
  // windows would put 1792 packets in flight at an af_packet ring of 512 frames.
  uint32_t rx_budget_packets = 0;
  // Largest datagram to build; 0 or above the link's: the link's.
  uint32_t max_datagram_bytes = 0;
  // The floor is eRPC's 5 ms rather than a few RTTs: on a loaded host a descheduled receiver
  // delays acks by milliseconds, and every spurious timeout costs a retransmission.
  TimeNs initial_rto = 10 * sched::kMillisecond;
  TimeNs min_rto = 5 * sched::kMillisecond;
  TimeNs max_rto = 200 * sched::kMillisecond;
  uint32_t ack_every = 16;
  // Packets one retransmission timeout resends (the oldest unacknowledged first); the rest wait
  // for the selective acks that answer them, so a spurious timeout costs little.
  uint32_t rto_burst = 16;
  TimeNs ack_delay = 50 * sched::kMicrosecond;
  FaultOptions faults;
};

// Protocol counters beyond TransportStats (any thread).
struct DatagramStats {
  uint64_t datagrams_sent = 0;
  uint64_t datagrams_received = 0;
  uint64_t data_packets_sent = 0;
  uint64_t retransmits = 0;    // data packets sent again (timeout or fast)
  uint64_t timeouts = 0;       // retransmission timer expiries
  uint64_t duplicates = 0;     // data packets received twice
  uint64_t out_of_order = 0;   // data packets held for reordering
  uint64_t beyond_credit = 0;  // data packets dropped for lying past the credit we offered
  uint64_t pure_acks_sent = 0;
  uint64_t stray = 0;               // datagrams for no known connection
  uint64_t replies_suppressed = 0;  // closes/rejects to strangers not sent (over the rate limit)
  uint64_t injected_drops = 0, injected_reorders = 0, injected_duplicates = 0;
  uint64_t link_full = 0;  // sends the link had no room for (retried later)
};

class DatagramTransport final : public Transport, public DatagramSink {
 public:
  // Validates options and preallocates. `link` and `handler` must outlive the transport.
  static absl::StatusOr<std::unique_ptr<DatagramTransport>> Create(const TransportOptions& options,
                                                                   const DatagramOptions& protocol,
                                                                   DatagramLink* link,
                                                                   TransportHandler* handler);
  ~DatagramTransport() override;
  DatagramTransport(const DatagramTransport&) = delete;
  DatagramTransport& operator=(const DatagramTransport&) = delete;

  // Starts answering hellos. Returns the link's UDP port.
  // Datagrams arrive whole in the link's buffers: a by_piece target gets each one's bytes.
  TransportCapabilities capabilities() const override { return {true, -1}; }
  std::string_view backend_name() const override { return "datagram"; }
  absl::StatusOr<uint16_t> Listen_st() override;
  absl::Status AddJob_st(const JobCredentials& job) override;
  // Closes the job's connections (pending sends fail with Cancelled, known peers reported down,
  // synchronously) and stops accepting its hellos.
  absl::Status RemoveJob_st(uint64_t job_id) override;
  // Dials "a.b.c.d:port"; hellos are repeated with back-off until connect_deadline.
  absl::StatusOr<PeerHandle> Connect_st(const JobCredentials& job, std::string_view address,
                                        TimeNs now) override;
  void Disconnect_st(PeerHandle peer, TimeNs now) override;
  absl::StatusOr<RegionId> RegisterRegion_st(void* base, uint64_t bytes) override;
  absl::Status UnregisterRegion_st(RegionId region) override;
  absl::Status PostSend_st(PeerHandle peer, const SendSpec& spec) override;
  // Receives, runs timers, retransmits, sends new packets and acks. With nothing to do and
  // wait_ms > 0 the link waits for input (up to wait_ms, or the next timer).
  int Progress_st(TimeNs now, int wait_ms) override;

  uint16_t listen_port() const { return link_->local_endpoint().port; }
  TransportStats Stats() const override;
  PeerStats PeerStatsOf(PeerHandle peer) const override;
  DatagramStats DatagramStatsNow() const;

  // DatagramSink: one received datagram (engine thread, from inside Progress_st).
  void OnDatagram_st(const Ipv4Endpoint& from, std::span<const uint8_t> bytes, TimeNs now) override;

 private:
  struct Conn;

  DatagramTransport(const TransportOptions& options, const DatagramOptions& protocol,
                    DatagramLink* link, TransportHandler* handler);

  PeerInfo InfoOf(const Conn& c) const;
  Conn* AllocConn();

  void OnHello(const Ipv4Endpoint& from, const DgramHeader& dh, std::span<const uint8_t> body,
               TimeNs now);
  void OnHelloOk(Conn& c, const DgramHeader& dh, std::span<const uint8_t> body, TimeNs now);
  void OnCloseOrReject(Conn& c, const DgramHeader& dh, std::span<const uint8_t> body);
  // Returns false when the connection went away (a callback closed it, or it was refused).
  bool OnAckFields(Conn& c, const DgramHeader& dh, TimeNs now);
  bool OnData(Conn& c, const DgramHeader& dh, std::span<const uint8_t> body, TimeNs now);
  bool Deliver(Conn& c, uint16_t flags, uint64_t msg, uint32_t msg_offset,
               std::span<const uint8_t> bytes, TimeNs now);

  void Service(Conn& c, TimeNs now);
  void SendHello(Conn& c);
  bool Retransmit(Conn& c, TimeNs now);
  bool SendNew(Conn& c, TimeNs now);
  bool SendDataPacket(Conn& c, uint64_t seq);
  void SendAck(Conn& c, bool probe);
  // A control datagram (hello/ok/reject/close): DgramHeader + FrameHeader + optional body.
  bool SendControl(const Ipv4Endpoint& to, uint32_t dst_conn, Conn* c, DgramType type,
                   const FrameHeader& fh, const void* body, size_t body_bytes);
  void SendError(const Ipv4Endpoint& to, uint32_t dst_conn, Conn* c, DgramType type,
                 uint64_t job_id, uint16_t rank, WireError code, std::string_view reason);
  bool Transmit(const Ipv4Endpoint& to, std::span<const uint8_t> head,
                std::span<const uint8_t> body);

  // Protocol violation or timeout: count, tell the peer why (best effort), tear down.
  void Refuse(Conn& c, WireError code, const absl::Status& why);
  void Teardown(Conn& c, const absl::Status& why);
  void UpdateCredit();
  // Rate limit for closes and rejects sent to addresses without a connection.
  bool MayAnswerStranger(TimeNs now);
  static constexpr double kStrangerRepliesPerSecond = 1000;
  static constexpr double kStrangerReplyBurst = 64;
  // Fails the pending sends, oldest first, and reports the peer down if the engine knows it.
  void FailPendingAndReportDown(Conn& c, const absl::Status& why);

  const TransportOptions options_;
  DatagramOptions proto_;
  // What sends go through: the link, or the fault injector in front of it.
  DatagramLink* link_;
  std::unique_ptr<FaultyLink> faulty_;
  TransportHandler* const handler_;
  uint32_t max_dgram_ = 0;
  uint32_t window_ = 0;
  // The credit offered on every connection: window_, or rx_budget_packets split among the
  // established inbound connections (UpdateCredit, when that number changes).
  uint32_t credit_ = 0;
  uint32_t inbound_up_ = 0;
  double stranger_tokens_ = kStrangerReplyBurst;
  TimeNs stranger_tokens_at_ = 0;
  bool listening_ = false;
  // Slots with generation-checked handles; a torn-down connection is retired and freed at the
  // end of Progress_st, when no handle of the round is in flight.
  ConnectionTable<Conn> conns_;
  JobTable jobs_;
  RegionTable regions_;
  struct Counters;
  std::unique_ptr<Counters> counters_;
  // Peer up/down and send/receive completions, counted in counters_ as they are reported.
  Completions report_;
};

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_TRANSPORT_H_
