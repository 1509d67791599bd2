// transport/transport.h — the one transport interface the daemon's engine drives.
//
// A transport moves segments between this host's daemon and its peer daemons: connect to a peer
// (with retry and exponential back-off), register memory regions, post a segment send straight
// from a region, receive each segment straight into a region chosen by the engine (the
// "receive target resolver"), report completions, and expose live statistics.
//
// How the interface is expressed: `Transport` is an abstract class and the engine holds one
// through a pointer, so the engine is compiled once for every backend (TCP, DPDK, verbs;
// an in-memory fake in the tests). That costs one indirect call per posted segment and per
// Progress_st round: a few nanoseconds next to the microseconds a segment costs in the kernel
// or on the NIC (docs/benchmarks.md measures it). Completions into the engine go through
// TransportHandler, also an abstract class. What differs between backends beyond the calls
// every backend has is explicit: capabilities() says whether payloads can be handed over in
// pieces and whether there is a descriptor the owner can sleep on.
//
// Threading: every method with the `_st` suffix (including the control ops) must be called from
// one thread, the engine thread that owns the transport; handler callbacks run on that thread,
// inside Progress_st (or synchronously inside Disconnect_st / RemoveJob_st for the peers they
// close). Stats() and PeerStatsOf() may be
// called from any thread (metrics): they read relaxed atomics; so may DescribeBackend().
// registrar() and the MemoryRegistrar it returns may be used from any thread: that is their
// point (below).
//
// Completion guarantees (every backend):
//   - Sends to one peer go on the wire in PostSend_st order; a peer delivers and acknowledges
//     them in that order.
//   - Each posted send ends in exactly one of OnSendAcked_st or OnSendFailed_st; before that it
//     may get OnSendDone_st (the frame left: for TCP the kernel holds a copy by then). Backends
//     that DMA from the source later (verbs, DPDK zero-copy) may only release it at ack/fail,
//     so an engine reuses a source buffer after OnSendAcked_st/OnSendFailed_st — which the
//     credit window waits for anyway.
//   - A peer that resets, closes, or stops making progress while work is pending for longer than
//     TransportOptions::peer_timeout gets all its pending sends failed (in order), then
//     OnPeerDown_st — never a hang.
//   - Bad input from a peer is counted in Stats() and closes that connection; the transport
//     itself carries on.
#ifndef GRADLANE_TRANSPORT_TRANSPORT_H_
#define GRADLANE_TRANSPORT_TRANSPORT_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sched/types.h"
#include "transport/counters.h"
#include "transport/wire.h"

namespace gradlane::transport {

using sched::TimeNs;

// One connection to one peer daemon for one job. Holds a slot index and a generation, so a
// handle kept after its peer went down never aliases a later connection.
using PeerHandle = uint32_t;
inline constexpr PeerHandle kNoPeer = 0xFFFFFFFFu;

// A registered memory region (for TCP: a bounds-checked base pointer; for verbs: an MR).
using RegionId = uint32_t;
inline constexpr RegionId kNoRegion = 0xFFFFFFFFu;

struct TransportOptions {
  // Where to accept peers: numeric IPv4 or IPv6 ("0.0.0.0", "127.0.0.1", "::1"); port 0 picks
  // a free port (Listen_st returns it).
  std::string listen_address = "0.0.0.0";
  uint16_t listen_port = 0;
  // A peer that makes no progress (no byte received from it, none written to it) for this long
  // while sends to it are pending, or that does not finish a handshake in this time, is down.
  TimeNs peer_timeout = 10 * sched::kSecond;
  // Connect retry: first back-off, cap, and how long to keep trying before reporting the peer
  // down. A single attempt (TCP connect + handshake) is abandoned after attempt_timeout.
  TimeNs connect_initial_backoff = 20 * sched::kMillisecond;
  TimeNs connect_max_backoff = 1 * sched::kSecond;
  TimeNs connect_deadline = 60 * sched::kSecond;
  TimeNs connect_attempt_timeout = 2 * sched::kSecond;
  // Largest segment accepted from a peer, and accepted by PostSend_st (payload_bytes is 32-bit
  // on the wire).
  uint64_t max_segment_bytes = 256ull << 20;
  // Limits: connections (inbound + outbound; a job of W ranks needs 2(W-1) on each daemon, so
  // the default serves e.g. 8 jobs of W = 64), sends queued or unacknowledged per peer (rounded
  // up to a power of two; PostSend_st past it is ResourceExhausted: back-pressure), regions.
  // A connection slot's send queue is allocated when the slot is first used, so an unused limit
  // costs next to nothing.
  uint32_t max_connections = 1024;
  uint32_t max_pending_sends_per_peer = 1024;
  uint32_t max_regions = 1024;
  // Accepted connections that have not yet proved a job's token (hello pending) are capped
  // separately: past the cap the oldest is closed to make room, so whoever reaches the port
  // without a token holds at most this many slots, never starves authenticated peers of the
  // rest, and cannot keep a real dialer out without outpacing its hello.
  uint32_t max_unauthenticated = 32;
  // SO_SNDBUF / SO_RCVBUF for peer sockets; 0 keeps the kernel's autotuning.
  int socket_buffer_bytes = 0;
};

// What this daemon proves to, and demands from, the peers of one job.
struct JobCredentials {
  uint64_t job_id = 0;
  uint16_t local_rank = 0;
  uint16_t world_size = 0;
  std::string token;  // shared secret, at most kMaxTokenBytes bytes
};

// One segment to send: the wire description plus where its bytes live locally.
struct SendSpec {
  sched::SegmentKey key = 0;
  int64_t iteration = 0;
  uint64_t offset = 0;  // within the tensor (goes on the wire)
  uint64_t length = 0;
  sched::Priority priority = 0;
  sched::DType dtype = sched::DType::kF32;
  sched::Direction direction = sched::Direction::kPush;
  RegionId region = kNoRegion;  // payload = region base + region_offset, `length` bytes
  uint64_t region_offset = 0;
  uint64_t cookie = 0;           // opaque to the transport; returned in the completion
  uint8_t schedule = 0;          // the sending policy's Decision(), carried in the flags' high byte
  uint16_t gpudirect_flags = 0;  // kFlagDeviceResult / kFlagRendezvous (transport/wire.h)
};

// A memory region a backend may send from or receive into; backends keep a table of these
// indexed by RegionId (`used` false: a free slot).
struct RegisteredRegion {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  bool used = false;
};

// The argument checks every backend makes in PostSend_st before queueing (peer state and queue
// room are the backend's own): the region is registered and holds the range, and the segment
// fits one frame. Returns where the payload starts.
inline absl::StatusOr<const uint8_t*> ResolveSendPayload(
    const std::vector<RegisteredRegion>& regions, const SendSpec& spec,
    uint64_t max_segment_bytes) {
  if (spec.region >= regions.size() || !regions[spec.region].used) {
    return absl::InvalidArgumentError("send from an unregistered region");
  }
  const RegisteredRegion& r = regions[spec.region];
  if (spec.region_offset > r.bytes || spec.length > r.bytes - spec.region_offset) {
    return absl::InvalidArgumentError("send range outside its region");
  }
  if (spec.length > max_segment_bytes) {
    return absl::InvalidArgumentError("segment longer than max_segment_bytes");
  }
  return r.base + spec.region_offset;
}

// The data frame header that carries `spec`; the backend sets `seq`.
inline FrameHeader MakeDataHeader(uint64_t job_id, uint16_t sender_rank, const SendSpec& spec) {
  FrameHeader h = MakeHeader(FrameType::kData, job_id, sender_rank);
  h.key = spec.key;
  h.iteration = spec.iteration;
  h.offset = spec.offset;
  h.length = spec.length;
  h.payload_bytes = static_cast<uint32_t>(spec.length);
  h.priority = spec.priority;
  h.dtype = static_cast<uint8_t>(spec.dtype);
  h.direction = static_cast<uint8_t>(spec.direction);
  h.flags = static_cast<uint16_t>(spec.schedule << kFlagScheduleShift) |
            static_cast<uint16_t>(spec.gpudirect_flags & kFlagsGpuDirect);
  return h;
}

struct SendCompletion {
  PeerHandle peer = kNoPeer;
  uint64_t cookie = 0;
  sched::SegmentKey key = 0;
  int64_t iteration = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Where the payload of an incoming segment goes. The transport bounds-checks it against the
// region and writes exactly header.length bytes at region_offset — or, with `by_piece`, hands
// the bytes to TransportHandler::OnRecvPiece_st instead of writing them.
//
// Why pieces: a backend that receives into its own packet buffers (DPDK) would copy every byte
// to the region only for the engine to read it back when it reduces. Handed the packet's bytes
// while they are in cache, the engine folds them into the result at once and the region write
// and re-read never happen (one pass over memory less per pushed byte). Only backends that
// say so in capabilities() are asked for it; the region range is
// still bounds-checked as if the bytes were to be written there.
struct RecvTarget {
  bool accept = false;
  RegionId region = kNoRegion;
  uint64_t region_offset = 0;
  uint64_t cookie = 0;  // returned in OnRecvDone_st
  bool by_piece = false;

  static RecvTarget Reject() { return RecvTarget{}; }
  static RecvTarget Into(RegionId region, uint64_t region_offset, uint64_t cookie = 0) {
    return RecvTarget{true, region, region_offset, cookie, false};
  }
  static RecvTarget Pieces(RegionId region, uint64_t region_offset, uint64_t cookie = 0) {
    return RecvTarget{true, region, region_offset, cookie, true};
  }
};

struct PeerInfo {
  PeerHandle handle = kNoPeer;
  uint64_t job_id = 0;
  uint16_t rank = 0;     // the peer's rank in the job (valid once up)
  bool inbound = false;  // it dialed us
};

// Callbacks from the transport into the engine. Engine thread only, from inside Progress_st.
// Callbacks may call PostSend_st and Disconnect_st on the same transport.
class TransportHandler {
 public:
  virtual ~TransportHandler() = default;
  // Handshake done; sends to this peer may flow (sends posted earlier now go out).
  virtual void OnPeerUp_st(const PeerInfo& peer) = 0;
  // The peer is gone (reset, closed, timed out, rejected us, connect deadline passed). Pending
  // sends were failed just before this. The handle is dead afterwards.
  virtual void OnPeerDown_st(const PeerInfo& peer, const absl::Status& why) = 0;
  // The whole frame has been handed to the kernel/NIC.
  virtual void OnSendDone_st(const SendCompletion& send) = 0;
  // The peer placed the segment in its destination and said so; credit may return.
  virtual void OnSendAcked_st(const SendCompletion& send, TimeNs now) = 0;
  // The send will never be acknowledged: peer down, or the peer had nowhere to put it.
  virtual void OnSendFailed_st(const SendCompletion& send, const absl::Status& why) = 0;
  // A segment header arrived: where should its payload go? Reject() discards the payload
  // (counted) and tells the sender its send failed.
  virtual RecvTarget ResolveRecv_st(const PeerInfo& peer, const FrameHeader& header) = 0;
  // A by_piece target's payload, in order: `bytes` are the segment's bytes from
  // `segment_offset` on; the pieces of one segment are contiguous and together exactly
  // header.length bytes, all of them before OnRecvDone_st. `bytes` is valid only during the call.
  // Only backends whose capabilities() hand over pieces call it, and only for targets that
  // asked.
  virtual void OnRecvPiece_st(const PeerInfo& /*peer*/, const FrameHeader& /*header*/,
                              const RecvTarget& /*target*/, uint64_t /*segment_offset*/,
                              std::span<const uint8_t> /*bytes*/) {}
  // The payload is in place (the transport acknowledges it to the sender after this returns).
  virtual void OnRecvDone_st(const PeerInfo& peer, const FrameHeader& header,
                             const RecvTarget& target, TimeNs now) = 0;
};

struct PeerStats {
#define GRADLANE_STATS_FIELD(name, type, metric, label, help) uint64_t name = 0;
  GRADLANE_PEER_COUNTERS(GRADLANE_STATS_FIELD)
};

struct TransportStats {
  // Malformed or refused input, by kind (index = WireError). kNoTarget counts resolver rejects.
  std::array<uint64_t, kWireErrorCount> errors{};
  GRADLANE_TRANSPORT_COUNTERS(GRADLANE_STATS_FIELD)
  PeerStats total;  // sum over all peers ever connected
  uint64_t malformed() const {
    uint64_t n = 0;
    for (size_t i = 1; i <= static_cast<size_t>(WireError::kBadField); ++i) n += errors[i];
    return n;
  }
#undef GRADLANE_STATS_FIELD
};

// The counters behind PeerStats / TransportStats, shared by every backend: written by the
// engine thread only (StatCounter), snapshotted from any thread.
#define GRADLANE_COUNTER_FIELD(name, type, metric, label, help) StatCounter name;
#define GRADLANE_SNAPSHOT_FIELD(name, type, metric, label, help) s.name = name.Get();
struct PeerCounters {
  GRADLANE_PEER_COUNTERS(GRADLANE_COUNTER_FIELD)
  void Reset_st() {
#define GRADLANE_RESET_FIELD(name, type, metric, label, help) name.Reset_st();
    GRADLANE_PEER_COUNTERS(GRADLANE_RESET_FIELD)
#undef GRADLANE_RESET_FIELD
  }
  PeerStats Snapshot() const {
    PeerStats s;
    GRADLANE_PEER_COUNTERS(GRADLANE_SNAPSHOT_FIELD)
    return s;
  }
};

struct TransportCounters {
  std::array<StatCounter, kWireErrorCount> errors;
  GRADLANE_TRANSPORT_COUNTERS(GRADLANE_COUNTER_FIELD)
  PeerCounters total;
  TransportStats Snapshot() const {
    TransportStats s;
    for (size_t i = 0; i < kWireErrorCount; ++i) s.errors[i] = errors[i].Get();
    GRADLANE_TRANSPORT_COUNTERS(GRADLANE_SNAPSHOT_FIELD)
    s.total = total.Snapshot();
    return s;
  }
};
#undef GRADLANE_COUNTER_FIELD
#undef GRADLANE_SNAPSHOT_FIELD

// The lists as data (daemon/metrics.cc, daemon/admin_server.cc).
#define GRADLANE_COUNTER_INFO(Stats, name, type, metric, label, help) \
  {#name, CounterType::type, metric, label, help, &Stats::name},
#define GRADLANE_PEER_INFO(name, type, metric, label, help) \
  GRADLANE_COUNTER_INFO(PeerStats, name, type, metric, label, help)
#define GRADLANE_TRANSPORT_INFO(name, type, metric, label, help) \
  GRADLANE_COUNTER_INFO(TransportStats, name, type, metric, label, help)
inline constexpr CounterInfo<PeerStats> kPeerCounters[] = {
    GRADLANE_PEER_COUNTERS(GRADLANE_PEER_INFO)};
inline constexpr CounterInfo<TransportStats> kTransportCounters[] = {
    GRADLANE_TRANSPORT_COUNTERS(GRADLANE_TRANSPORT_INFO)};
#undef GRADLANE_PEER_INFO
#undef GRADLANE_TRANSPORT_INFO
#undef GRADLANE_COUNTER_INFO

// What a backend shows beyond the counters every backend keeps (Transport::DescribeBackend): its
// name, what identifies its device, and counters of its own. Built when asked, on a reader's
// thread (metrics, admin), so it may allocate; names, metrics and labels are bounded (one device
// per daemon), never per peer or per tensor.
struct BackendCounterValue {
  std::string name;  // the key in the admin status reply and `gradlanectl counters`
  CounterType type = CounterType::Counter;
  std::string metric;  // the Prometheus family; "": the status reply and the ctl listing only
  std::vector<std::pair<std::string, std::string>> labels;
  std::string help;
  uint64_t value = 0;
};
struct BackendDescription {
  std::string backend;  // backend_name(): "tcp", "dpdk", "verbs", "fake"
  // What identifies its device, in order (verbs: device, port, gid_index); empty for TCP.
  std::vector<std::pair<std::string, std::string>> info;
  std::vector<BackendCounterValue> counters;
};

// What a backend offers beyond the calls every backend has.
struct TransportCapabilities {
  // Honours RecvTarget::by_piece: hands a payload to OnRecvPiece_st packet by packet (backends
  // that receive into their own buffers: DPDK, the fake).
  bool hands_over_pieces = false;
  // A descriptor that turns readable when Progress_st has peer work to do, so an idle owner can
  // sleep on it together with its own descriptors (epoll); -1: none, the owner sleeps inside
  // Progress_st(now, wait_ms) instead.
  int wait_fd = -1;
  // RegisterDeviceRegion_st can take GPU memory (a dma-buf) for the NIC to read (verbs).
  bool device_memory = false;
};

// Registration of memory with the device ahead of RegisterRegion_st, from a thread other than
// the engine's. Why: a backend whose RegisterRegion_st does slow device work (verbs: pinning
// every page, tens to hundreds of milliseconds per GiB) would stall every job's data path for
// that long on the engine thread. The session server pins a client's arena (the daemon's alias
// of it) when the session is set up; the engine's RegisterRegion_st of exactly that range then
// finds the registration and does only a lookup.
// Rules: every method from any thread. Each Pin that succeeded is matched by one Unpin of the
// same range, before the memory is unmapped; the range stays registered while it is pinned or
// registered as a region (counted). The registrar outlives every pin (its transport is
// destroyed after them). The last Unpin of a range no region holds deregisters it on the
// calling thread; a region's UnregisterRegion_st never waits for the device when a pin still
// holds the range.
class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  // Registers [base, base + bytes) (unless registered already) and counts one more user.
  // Failure is the device's status, readable to an operator (the pinned-memory limit named
  // when it is the cause); nothing is held then.
  virtual absl::Status Pin(void* base, uint64_t bytes) = 0;
  // One user less; the last deregisters.
  virtual void Unpin(void* base, uint64_t bytes) = 0;
};

// One backend. Control ops return absl::Status; every `_st` method on the engine thread.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual TransportCapabilities capabilities() const = 0;
  // "tcp", "dpdk", "verbs", "fake": what gradlanectl and the metrics show.
  virtual std::string_view backend_name() const = 0;

  // Starts accepting peers at TransportOptions::listen_address:listen_port; returns the bound
  // port. A busy port is FailedPrecondition ("address already in use"). Call at most once.
  virtual absl::StatusOr<uint16_t> Listen_st() = 0;
  // Accept peers of this job (inbound hellos are checked against it) and dial as it.
  // InvalidArgument for a token over kMaxTokenBytes or a rank outside the world size.
  virtual absl::Status AddJob_st(const JobCredentials& job) = 0;
  // Closes the job's connections at once (pending sends fail, peers are reported down,
  // synchronously) and stops accepting its hellos: a later dial as the job is refused with
  // unknown_job. Never from inside a handler callback.
  virtual absl::Status RemoveJob_st(uint64_t job_id) = 0;
  // Dials `address` ("host:port", numeric) as `job` (which AddJob_st must have registered).
  // Returns at once; OnPeerUp_st or OnPeerDown_st follows from Progress_st. Sends may be posted
  // to the handle right away: they go out when the handshake completes.
  virtual absl::StatusOr<PeerHandle> Connect_st(const JobCredentials& job, std::string_view address,
                                                TimeNs now) = 0;
  // Says goodbye (best effort), fails the peer's pending sends with Cancelled and reports it
  // down. No-op for a stale handle.
  virtual void Disconnect_st(PeerHandle peer, TimeNs now) = 0;
  // The memory must stay valid until unregistered, and a region must not be unregistered while
  // sends from it are pending.
  // A range pinned through registrar() is found, not registered again; anything else is
  // registered here, on the engine thread (verbs: the device's time).
  virtual absl::StatusOr<RegionId> RegisterRegion_st(void* base, uint64_t bytes) = 0;
  virtual absl::Status UnregisterRegion_st(RegionId region) = 0;
  // GPUDirect: registers the first `bytes` of the dma-buf `dmabuf_fd` (GPU memory a client
  // exported) with the NIC, addressed as [iova, iova + bytes). The region is a send source and
  // a receive target like any other, but only the NIC may touch it: the CPU never does, so a
  // segment into it must come by rendezvous (the sender sets kFlagRendezvous), and only
  // backends whose payloads never pass through the CPU take it.
  // Unimplemented for those that cannot (TCP, DPDK); the device's refusal otherwise (a NIC or
  // GPU driver without dma-buf support). Released with UnregisterRegion_st; the backend holds
  // its own reference to the dma-buf, so the caller may close `dmabuf_fd` at once.
  virtual absl::StatusOr<RegionId> RegisterDeviceRegion_st(int dmabuf_fd, uint64_t bytes,
                                                           uint64_t iova) {
    (void)dmabuf_fd, (void)bytes, (void)iova;
    return absl::UnimplementedError(
        absl::StrCat("the ", std::string(backend_name()), " backend cannot send from GPU memory"));
  }
  // Queues one segment behind the peer's earlier sends. InvalidArgument for a bad region range,
  // NotFound for a dead handle, ResourceExhausted when max_pending_sends_per_peer are
  // outstanding (back-pressure: the engine retries after acks).
  virtual absl::Status PostSend_st(PeerHandle peer, const SendSpec& spec) = 0;
  // One step: flush queued output, handle input (waiting up to wait_ms when nothing is ready;
  // 0 = poll), run connect retries and timeouts. Returns events handled.
  virtual int Progress_st(TimeNs now, int wait_ms) = 0;
  // An owner sleeping on capabilities().wait_fd must not while this is true: work that waits
  // for no event, only for the next Progress_st (e.g. writes whose budget ran out).
  virtual bool HasDeferredWork_st() const { return false; }

  virtual TransportStats Stats() const = 0;
  virtual PeerStats PeerStatsOf(PeerHandle peer) const = 0;
  // The backend's name, device and own counters, from any thread. A backend may read files here
  // (verbs: the device's port counters in sysfs), so readers call it at scrape time, never the
  // engine thread. The default: the name alone.
  virtual BackendDescription DescribeBackend() const {
    BackendDescription d;
    d.backend = std::string(backend_name());
    return d;
  }

  // Any thread. Null where registering memory costs the engine nothing worth moving (TCP,
  // DPDK, the fake: a region is a bounds-checked pointer there).
  virtual MemoryRegistrar* registrar() { return nullptr; }
};

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_TRANSPORT_H_
