// sched/bandwidth_estimator.h — live estimate of one link's bandwidth and round-trip time, fed
// by the transport's send and acknowledgement events.
//
// What it is for: Prophet sizes its gradient blocks by the time a block takes on the wire
// (bytes / bandwidth), the credit window is auto-sized to the bandwidth-delay product, and the
// daemon exports both as metrics. One estimator per (local port, peer) link.
//
// Bandwidth is the rate at which bytes are acknowledged *while the link is busy*: time during
// which nothing is outstanding (training is computing, the scheduler has nothing ready) is not
// counted, so a link that idles half of every iteration still reports its real rate, not half
// of it. Busy time and acknowledged bytes are accumulated until at least
// `min_sample_busy` of busy time has passed (possibly spread over several busy periods), which
// gives one rate sample; samples are smoothed with an EWMA. Each busy period includes the one
// round trip it takes before its first acknowledgement comes back, so the estimate is the
// goodput a busy link delivers; it approaches the raw link rate when busy periods are long
// compared with the RTT (a credit window of at least one BDP keeps them so) and it is lower
// when the sender never fills the pipe (a stop-and-wait sender measures bytes per RTT), which
// is the rate such a sender can actually count on.
//
// RTT is smoothed as in RFC 6298 (srtt, rttvar; alpha 1/8, beta 1/4), and the minimum RTT is
// kept over a sliding window so that a path change is eventually followed.
//
// Guarantees: no I/O and no clock — every event carries the caller's `now`. Time that runs
// backwards is clamped to the latest time seen (and counted), acknowledgements of more bytes
// than are outstanding are clamped (and counted), zero-length intervals never divide. No
// allocation after construction. Not thread-safe: one owner (the engine thread that drives the
// link, or the simulator).
#ifndef GRADLANE_SCHED_BANDWIDTH_ESTIMATOR_H_
#define GRADLANE_SCHED_BANDWIDTH_ESTIMATOR_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "sched/types.h"

namespace gradlane::sched {

struct BandwidthEstimatorOptions {
  // Busy time one bandwidth sample must span. 1 ms holds several segments at datacenter rates
  // (1.25 MB at 10 Gbit/s), so one late acknowledgement does not swing a sample, and still gives
  // dozens of samples within one backward pass. Must be > 0.
  TimeNs min_sample_busy = kMillisecond;
  // Weight of a new bandwidth sample in the EWMA, in (0, 1]. 1/8 (RFC 6298's alpha) averages
  // over ~8 samples (≈8 ms of busy time with the default), enough to smooth per-sample jitter,
  // and follows a step change in rate to within 10% in ~17 samples, i.e. within an iteration.
  double bandwidth_gain = 0.125;
  // Window over which the minimum RTT is kept: a minimum older than this is replaced by the
  // next sample, so a longer path after a route change is adopted (BBR uses the same 10 s).
  // Must be > 0.
  TimeNs min_rtt_window = 10 * kSecond;
  // Floor of BdpBytes(). An underestimated window starves the link, and the estimate of a
  // starved link cannot grow, so the window is never sized below what one P3-size partition
  // (≈50k f32 parameters = 200 kB) needs. Must be > 0.
  uint64_t min_bdp_bytes = 256 * 1024;
};

// Inputs the estimator rejected or clamped; exported as error metrics by the daemon.
struct BandwidthEstimatorAnomalies {
  uint64_t clock_backwards = 0;      // an event's `now` earlier than a previous event's
  uint64_t ack_without_send = 0;     // an ack arriving with nothing outstanding
  uint64_t excess_ack_bytes = 0;     // bytes acked beyond what was outstanding (summed)
  uint64_t invalid_rtt_samples = 0;  // sent_at later than the ack, or before any send
};

class BandwidthEstimator {
 public:
  // The RFC 6298 gains, fixed by the RFC rather than tunable.
  static constexpr double kRttAlpha = 1.0 / 8;
  static constexpr double kRttBeta = 1.0 / 4;

  // An estimator with the default options.
  BandwidthEstimator();

  // Validates `options`: InvalidArgument on a non-positive interval, window or floor, or a
  // gain outside (0, 1].
  static absl::StatusOr<BandwidthEstimator> Create(const BandwidthEstimatorOptions& options);

  // `bytes` were committed to the link at `now`.
  void OnSend(uint64_t bytes, TimeNs now);

  // The peer acknowledged `bytes` at `now`; they were sent at `sent_at` (the time passed to
  // the matching OnSend), which gives one RTT sample. Acks may come in any order and may cover
  // several sends or a part of one.
  void OnAck(uint64_t bytes, TimeNs sent_at, TimeNs now);

  // Smoothed busy-link bandwidth in bytes per second; nullopt until the first sample
  // (`min_sample_busy` of busy time with at least one byte acknowledged) is complete.
  std::optional<double> BytesPerSecond() const;

  // RFC 6298 smoothed RTT and its variation; nullopt before the first valid RTT sample.
  std::optional<TimeNs> SmoothedRtt() const;
  std::optional<TimeNs> RttVariation() const;
  // Smallest RTT seen within the last `min_rtt_window`; nullopt before the first sample.
  std::optional<TimeNs> MinRtt() const;

  // Bandwidth × min RTT in bytes, at least `min_bdp_bytes` (the floor also when either is not
  // yet known). Min RTT rather than srtt: srtt includes the queueing that the window itself
  // causes, so sizing the window from it would grow the queue that inflates it. Callers that
  // want headroom multiply (BBR uses a gain of 2 for its window).
  uint64_t BdpBytes() const;

  // Bytes sent and not yet acknowledged.
  uint64_t outstanding_bytes() const { return outstanding_; }
  // Total busy time and acknowledged bytes, for a utilization metric.
  TimeNs total_busy_time() const { return total_busy_; }
  uint64_t total_acked_bytes() const { return total_acked_; }
  // Number of bandwidth samples folded into the estimate so far.
  uint64_t bandwidth_samples() const { return samples_; }
  const BandwidthEstimatorAnomalies& anomalies() const { return anomalies_; }

 private:
  explicit BandwidthEstimator(const BandwidthEstimatorOptions& options);

  // Clamps `now` to the latest time seen, and adds the time since the previous event to the
  // busy time if anything was outstanding during it.
  TimeNs Advance(TimeNs now);
  void AddRttSample(TimeNs rtt, TimeNs now);

  BandwidthEstimatorOptions options_;

  bool seen_event_ = false;
  TimeNs last_event_ = 0;
  bool seen_send_ = false;
  TimeNs first_send_ = 0;
  uint64_t outstanding_ = 0;

  // The bandwidth sample being accumulated.
  TimeNs sample_busy_ = 0;
  uint64_t sample_bytes_ = 0;
  std::optional<double> bandwidth_;
  uint64_t samples_ = 0;

  double srtt_ns_ = 0;
  double rttvar_ns_ = 0;
  bool has_rtt_ = false;
  TimeNs min_rtt_ = 0;
  TimeNs min_rtt_stamp_ = 0;

  TimeNs total_busy_ = 0;
  uint64_t total_acked_ = 0;
  BandwidthEstimatorAnomalies anomalies_;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_BANDWIDTH_ESTIMATOR_H_
