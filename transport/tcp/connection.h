// transport/tcp/connection.h — one TCP peer connection's preallocated state: the ordered send
// ring, the control-frame buffer, and the receive state machine's buffers.
//
// Why a ring: the scheduler commits segments in an order that matters (priority); the ring keeps
// that order from PostSend_st to the socket and on to the peer's acks, which come back in the
// same order because TCP and the receiver are FIFO. Three free-running indices split it:
//   [ack_idx, write_idx)   written to the kernel, awaiting the peer's ack
//   [write_idx, post_idx)  posted, not yet (fully) written; write_off bytes of write_idx are out
// Control frames (hello, acks we owe the peer, goodbye) are queued in `ctrl` and enter the byte
// stream only at frame boundaries, so they never split a data frame.
//
// Guarantees: storage is sized when a connection is set up (Init / InitHandshake, then
// GrowForData when an inbound peer authenticates) and released with the slot (ReleaseStorage);
// nothing here allocates on the data path. A connection that has not authenticated holds only
// a handshake-sized control buffer, so a flood of tokenless connections pins little memory, and
// an idle slot pins none. Engine thread only (owned by TcpTransport). No syscalls here: the
// transport does the I/O, this class only builds iovecs and accounts for what was written. The
// slot and its handle (index + generation) are transport/common/connection_table.h's.
#ifndef GRADLANE_TRANSPORT_TCP_CONNECTION_H_
#define GRADLANE_TRANSPORT_TCP_CONNECTION_H_

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <vector>

#include "transport/common/completions.h"
#include "transport/tcp/socket_util.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace gradlane::transport::tcp {

enum class ConnState : uint8_t {
  kFree,         // slot unused
  kBackoff,      // dialer waiting for retry_at
  kConnecting,   // dialer: non-blocking connect in flight
  kHelloSent,    // dialer: hello queued/sent, waiting for kHelloOk / kReject
  kAwaitHello,   // acceptor: waiting for the dialer's hello
  kEstablished,  // data flows
  kLingering,    // refused: our reject/goodbye is flushing; drain input until EOF or deadline
  kDead,         // torn down; the slot is released at the end of Progress_st
};

enum class RxState : uint8_t { kHeader, kBody, kPayload, kDiscard };

class Connection {
 public:
  // Control bytes owed at once. Acks dominate: we owe at most one per frame the peer has in
  // flight, and the peer's ring caps that, so room for a ring's worth of acks (peers share the
  // configuration) plus a few handshake/goodbye frames means reading never has to pause for
  // lack of ack space. If it ever does (a peer with a bigger ring), reading pauses, the peer is
  // back-pressured through TCP, and the progress timeout bounds the wait.
  static constexpr size_t kCtrlSlackBytes = 4 * (kFrameHeaderBytes + kMaxControlPayloadBytes);
  // writev batch: iovecs per call (two per data frame, one for control bytes).
  static constexpr size_t kMaxIov = 64;

  // Sizes the ring (pending_capacity rounded up to a power of two) and the control buffer.
  void Init(uint32_t pending_capacity);
  // An inbound connection before its hello: no data ring, room for a reply or two.
  void InitHandshake();
  // The authenticated inbound connection gets its full storage; queued control bytes are kept.
  void GrowForData(uint32_t pending_capacity);
  // Gives the storage back (the slot is idle).
  void ReleaseStorage();
  // Bytes of storage held now.
  uint64_t StorageBytes() const { return ring.capacity() * sizeof(PendingSend) + ctrl.capacity(); }
  // Clears the per-connection state for a new use of the slot (keeps the storage).
  void ResetForUse();

  // --- send side -------------------------------------------------------------------------
  bool RingFull() const { return post_idx - ack_idx >= ring.size(); }
  bool HasUnwritten() const { return write_idx != post_idx || ctrl_off != ctrl_len; }
  bool HasPending() const { return ack_idx != post_idx; }
  PendingSend& Slot(uint64_t idx) { return ring[idx & mask]; }
  // Queues a control frame; false when the control buffer is full.
  bool AppendCtrl(const FrameHeader& header, const void* body, size_t body_bytes);
  size_t CtrlFree() const { return ctrl.size() - ctrl_len + ctrl_off; }
  // Fills iov with what goes out next: pending control bytes (only at a frame boundary), then
  // data frames when `with_data`. Returns the iovec count.
  size_t BuildIov(iovec* iov, bool with_data);
  // Accounts for `n` bytes written by the last BuildIov. write_idx advances past whole frames.
  void Consume(size_t n);

  // --- identity and timers ---------------------------------------------------------------
  ConnState state = ConnState::kFree;
  int fd = -1;
  bool inbound = false;
  bool epollout_armed = false;
  bool in_dirty_list = false;
  bool restart_progress_timer = false;
  // The engine holds this handle (it dialed, or OnPeerUp_st was called): it gets OnPeerDown_st.
  bool known = false;
  int job_index = -1;
  uint16_t peer_rank = 0;
  SockAddr addr;                // dialer: where to connect
  TimeNs attempt_deadline = 0;  // current connect/handshake attempt (or linger) gives up at
  TimeNs retry_at = 0;
  TimeNs give_up_at = 0;  // connect_deadline measured from Connect_st
  TimeNs backoff = 0;
  TimeNs last_progress = 0;
  absl::Status last_error;  // last connect failure (for the final message)

  // --- send state ------------------------------------------------------------------------
  std::vector<PendingSend> ring;
  uint64_t mask = 0;
  uint64_t ack_idx = 0, write_idx = 0, post_idx = 0;
  uint64_t write_off = 0;  // bytes of Slot(write_idx) (header + payload) already written
  std::vector<uint8_t> ctrl;
  size_t ctrl_off = 0, ctrl_len = 0;
  bool ctrl_in_iov = false;  // whether the last BuildIov led with control bytes

  // --- receive state ---------------------------------------------------------------------
  RxState rx_state = RxState::kHeader;
  size_t rx_got = 0;  // bytes of the current header/body/payload received
  FrameHeader rx_header{};
  std::array<uint8_t, kMaxControlPayloadBytes> rx_body{};
  uint8_t* rx_dst = nullptr;
  RecvTarget rx_target;

  PeerCounters counters;
};

}  // namespace gradlane::transport::tcp

#endif  // GRADLANE_TRANSPORT_TCP_CONNECTION_H_
