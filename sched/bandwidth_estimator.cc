// sched/bandwidth_estimator.cc — see the header for the model and its guarantees.
#include "sched/bandwidth_estimator.h"

#include <algorithm>
#include <cmath>

namespace gradlane::sched {

BandwidthEstimator::BandwidthEstimator() : BandwidthEstimator(BandwidthEstimatorOptions{}) {}

BandwidthEstimator::BandwidthEstimator(const BandwidthEstimatorOptions& options)
    : options_(options) {}

absl::StatusOr<BandwidthEstimator> BandwidthEstimator::Create(
    const BandwidthEstimatorOptions& options) {
  if (options.min_sample_busy <= 0) {
    return absl::InvalidArgumentError("bandwidth estimator: min_sample_busy must be > 0");
  }
  // Written so that NaN fails too.
  if (!(options.bandwidth_gain > 0.0 && options.bandwidth_gain <= 1.0)) {
    return absl::InvalidArgumentError("bandwidth estimator: bandwidth_gain must be in (0, 1]");
  }
  if (options.min_rtt_window <= 0) {
    return absl::InvalidArgumentError("bandwidth estimator: min_rtt_window must be > 0");
  }
  if (options.min_bdp_bytes == 0) {
    return absl::InvalidArgumentError("bandwidth estimator: min_bdp_bytes must be > 0");
  }
  return BandwidthEstimator(options);
}

TimeNs BandwidthEstimator::Advance(TimeNs now) {
  if (!seen_event_) {
    seen_event_ = true;
    last_event_ = now;
    return now;
  }
  if (now < last_event_) {
    // A non-monotonic source (or two clocks mixed up by the caller): treat the event as
    // happening now-as-we-know-it, so no interval is ever negative.
    ++anomalies_.clock_backwards;
    now = last_event_;
  }
  if (outstanding_ > 0) {
    const TimeNs busy = now - last_event_;
    sample_busy_ += busy;
    total_busy_ += busy;
  }
  last_event_ = now;
  return now;
}

void BandwidthEstimator::OnSend(uint64_t bytes, TimeNs now) {
  now = Advance(now);
  if (!seen_send_) {
    seen_send_ = true;
    first_send_ = now;
  }
  outstanding_ += bytes;
}

void BandwidthEstimator::OnAck(uint64_t bytes, TimeNs sent_at, TimeNs now) {
  const TimeNs raw_now = now;
  now = Advance(now);
  if (outstanding_ == 0) {
    // Nothing was in flight, so there is no busy time to divide by and no send to time the
    // round trip from: a duplicate or misrouted completion. Ignore it entirely.
    ++anomalies_.ack_without_send;
    anomalies_.excess_ack_bytes += bytes;
    return;
  }
  uint64_t acked = bytes;
  if (acked > outstanding_) {
    anomalies_.excess_ack_bytes += acked - outstanding_;
    acked = outstanding_;
  }
  outstanding_ -= acked;
  sample_bytes_ += acked;
  total_acked_ += acked;

  // The RTT uses the caller's own timestamps (not the clamped `now`): a clock that stepped
  // back between send and ack yields a negative RTT, which is rejected rather than recorded
  // as a spuriously small one.
  if (sent_at < first_send_ || sent_at > raw_now) {
    ++anomalies_.invalid_rtt_samples;
  } else {
    AddRttSample(raw_now - sent_at, now);
  }

  if (sample_busy_ >= options_.min_sample_busy && sample_bytes_ > 0) {
    const double rate = static_cast<double>(sample_bytes_) * static_cast<double>(kSecond) /
                        static_cast<double>(sample_busy_);
    if (bandwidth_.has_value()) {
      bandwidth_ = *bandwidth_ + options_.bandwidth_gain * (rate - *bandwidth_);
    } else {
      bandwidth_ = rate;
    }
    ++samples_;
    sample_busy_ = 0;
    sample_bytes_ = 0;
  }
}

void BandwidthEstimator::AddRttSample(TimeNs rtt, TimeNs now) {
  const double r = static_cast<double>(rtt);
  if (!has_rtt_) {
    // RFC 6298 §2.2: first measurement.
    srtt_ns_ = r;
    rttvar_ns_ = r / 2;
    has_rtt_ = true;
    min_rtt_ = rtt;
    min_rtt_stamp_ = now;
    return;
  }
  // RFC 6298 §2.3: rttvar is updated with the old srtt, then srtt.
  rttvar_ns_ = (1 - kRttBeta) * rttvar_ns_ + kRttBeta * std::fabs(srtt_ns_ - r);
  srtt_ns_ = (1 - kRttAlpha) * srtt_ns_ + kRttAlpha * r;
  if (rtt <= min_rtt_ || now - min_rtt_stamp_ > options_.min_rtt_window) {
    min_rtt_ = rtt;
    min_rtt_stamp_ = now;
  }
}

std::optional<double> BandwidthEstimator::BytesPerSecond() const { return bandwidth_; }

std::optional<TimeNs> BandwidthEstimator::SmoothedRtt() const {
  if (!has_rtt_) return std::nullopt;
  return static_cast<TimeNs>(std::llround(srtt_ns_));
}

std::optional<TimeNs> BandwidthEstimator::RttVariation() const {
  if (!has_rtt_) return std::nullopt;
  return static_cast<TimeNs>(std::llround(rttvar_ns_));
}

std::optional<TimeNs> BandwidthEstimator::MinRtt() const {
  if (!has_rtt_) return std::nullopt;
  return min_rtt_;
}

uint64_t BandwidthEstimator::BdpBytes() const {
  if (!bandwidth_.has_value() || !has_rtt_) return options_.min_bdp_bytes;
  const double bdp = *bandwidth_ * static_cast<double>(min_rtt_) / static_cast<double>(kSecond);
  // Guard the conversion: a double beyond uint64 range is undefined behaviour to cast.
  constexpr double kMaxBytes = 9.0e18;
  const double clamped = std::min(bdp, kMaxBytes);
  return std::max(options_.min_bdp_bytes, static_cast<uint64_t>(clamped));
}

}  // namespace gradlane::sched
