// transport/counters.h — the counters every backend keeps, declared once, and the counter type
// the engine's counters use too.
//
// Each list entry is X(name, type, metric, label, help):
//   name    the field of the stats struct (PeerStats, TransportStats) and the key in the admin
//           socket's status reply and in `gradlanectl counters`
//   type    Counter (only goes up) or Gauge
//   metric  the Prometheus family ("" : none of its own; the value is in the status reply and
//           the ctl listing); counters that share a family differ by `label` ("key=value")
//   help    what it counts
// The structs (transport/transport.h), the Prometheus families (daemon/metrics.cc), the status
// reply (daemon/admin_server.cc) and `gradlanectl counters` are generated from these lists.
// No dependencies beyond the standard library, so gradlanectl includes it as well.
//
// Thread rules: a StatCounter is written by one thread (the engine thread: `_st`) and read by
// any (metrics, admin): a relaxed load+store, no locked instruction on the data path.
#ifndef GRADLANE_TRANSPORT_COUNTERS_H_
#define GRADLANE_TRANSPORT_COUNTERS_H_

#include <atomic>
#include <cstdint>

// Per connection, and summed over every connection a transport ever had (TransportStats::total,
// reported with the prefix "transport_").
#define GRADLANE_PEER_COUNTERS(X) \
  X(bytes_sent, Counter, "gradlane_transport_sent_bytes_total", "", \
    "payload bytes handed to the kernel or the NIC, all frames (data, manifests, leave)") \
  X(bytes_received, Counter, "gradlane_transport_received_bytes_total", "", \
    "payload bytes placed in their destinations, all frames") \
  X(frames_sent, Counter, "gradlane_transport_frames_sent_total", "", "data frames sent") \
  X(frames_received, Counter, "gradlane_transport_frames_received_total", "", \
    "data frames received") \
  X(acks_sent, Counter, "gradlane_transport_acks_sent_total", "", "acknowledgements sent") \
  X(acks_received, Counter, "gradlane_transport_acks_received_total", "", \
    "acknowledgements received") \
  X(sends_failed, Counter, "gradlane_transport_sends_failed_total", "", \
    "sends that will never be acknowledged (peer down, or refused by the peer)")

// Per transport (the wire errors by kind are counted apart, indexed by WireError).
#define GRADLANE_TRANSPORT_COUNTERS(X) \
  X(connect_attempts, Counter, "gradlane_peer_connect_attempts_total", "", \
    "connection attempts to peer daemons (first tries and retries)") \
  X(connect_retries, Counter, "gradlane_peer_connect_retries_total", "", \
    "of those, retries after a failed attempt") \
  X(peers_up, Counter, "gradlane_peer_up_total", "", \
    "peer connections that completed their handshake") \
  X(peers_down, Counter, "", "", "peer connections that ended, for any reason") \
  X(peer_resets, Counter, "gradlane_peer_down_total", "reason=reset", \
    "peer connections reset or closed by the peer") \
  X(peer_timeouts, Counter, "gradlane_peer_down_total", "reason=timeout", \
    "peer connections declared down for lack of progress") \
  X(accepts_refused, Counter, "gradlane_errors_total", "kind=accept_refused", \
    "inbound connections refused: no free connection slot") \
  X(unauthenticated_evicted, Counter, "gradlane_peer_unauthenticated_evicted_total", "", \
    "connections that had not proved a job's token, closed to make room") \
  X(connection_buffer_bytes, Gauge, "gradlane_transport_connection_buffer_bytes", "", \
    "send rings and control buffers of live connections")

namespace gradlane::transport {

// A counter written by the engine thread only and read by anyone: a relaxed load+store (no
// locked instruction on the data path), readers see a recent value.
class StatCounter {
 public:
  void Add_st(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }
  void Reset_st() { v_.store(0, std::memory_order_relaxed); }
  // For a gauge kept in a counter: takes back what an earlier Add_st gave.
  void Sub_st(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> v_{0};
};

// One entry of a counter list, as data: what the exporters iterate over. `field` reads the
// value out of a snapshot of type Stats.
enum class CounterType : uint8_t { Counter, Gauge };
template <class Stats>
struct CounterInfo {
  const char* name;
  CounterType type;
  const char* metric;
  const char* label;
  const char* help;
  uint64_t Stats::*field;
};

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_COUNTERS_H_
