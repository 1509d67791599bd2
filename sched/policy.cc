// MakePolicy / PolicyNames: the one place that maps a name to a policy and validates the knobs
// shared by all of them, so the daemon's flags and the simulator report the same errors.
#include "sched/policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sched/policies/bytescheduler.h"
#include "sched/policies/fifo.h"
#include "sched/policies/gradlane.h"
#include "sched/policies/gradlane_selector.h"
#include "sched/policies/p3.h"
#include "sched/policies/prophet.h"

namespace gradlane::sched {
namespace {

// Bounds that catch unit mistakes (bits for bytes, a stray exponent) rather than real limits.
constexpr uint64_t kMinPartitionBytes = 4;           // one f32 element
constexpr uint64_t kMaxPartitionBytes = 1ull << 34;  // 16 GiB
constexpr uint64_t kMaxCreditBytes = 1ull << 40;     // 1 TiB
constexpr double kMinBandwidth = 1e3;                // 1 kB/s
constexpr double kMaxBandwidth = 1e13;               // 80 Tbit/s

absl::Status Validate(const PolicyConfig& c) {
  if (c.partition_bytes != 0 &&
      (c.partition_bytes < kMinPartitionBytes || c.partition_bytes > kMaxPartitionBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("partition_bytes=", c.partition_bytes,
                                                   " out of range: 0 (policy default) or ",
                                                   kMinPartitionBytes, "..", kMaxPartitionBytes));
  }
  if (c.credit_bytes > kMaxCreditBytes) {
    return absl::InvalidArgumentError(absl::StrCat("credit_bytes=", c.credit_bytes,
                                                   " out of range: 0 (policy default) or up to ",
                                                   kMaxCreditBytes));
  }
  if (!std::isfinite(c.initial_bandwidth_bytes_per_s) ||
      c.initial_bandwidth_bytes_per_s < kMinBandwidth ||
      c.initial_bandwidth_bytes_per_s > kMaxBandwidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_bandwidth_bytes_per_s=", c.initial_bandwidth_bytes_per_s,
                     " out of range: ", kMinBandwidth, "..", kMaxBandwidth, " bytes/s"));
  }
  if (c.per_message_overhead_ns < 0 || c.per_message_overhead_ns > kSecond) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per_message_overhead_ns=", c.per_message_overhead_ns, " out of range: 0..", kSecond));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t DefaultPartitionBytes(std::string_view policy, DType dtype) {
  if (policy == "p3") return kP3PartitionElements * DTypeBytes(dtype);
  if (policy == "bytescheduler") return kByteSchedulerDefaultPartitionBytes;
  if (policy == "prophet") return kProphetDefaultPartitionBytes;
  if (policy == "gradlane" || policy == "gradlane-rules") return kGradlaneDefaultKeyPartitionBytes;
  return 0;
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(const PolicyConfig& config) {
  if (absl::Status s = Validate(config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", config.name, "': ", s.message()));
  }
  if (config.name == "fifo") return FifoPolicy::Create(config);
  if (config.name == "p3") return P3Policy::Create(config);
  if (config.name == "bytescheduler") return ByteSchedulerPolicy::Create(config);
  if (config.name == "prophet") return std::unique_ptr<Policy>(ProphetPolicy::Create(config));
  if (config.name == "gradlane") {
    auto selector = GradlaneSelector::Create(config);
    if (!selector.ok()) return selector.status();
    return std::unique_ptr<Policy>(*std::move(selector));
  }
  if (config.name == "gradlane-rules") {
    return std::unique_ptr<Policy>(GradlanePolicy::Create(config));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy '", config.name,
                   "' (expected one of: ", absl::StrJoin(PolicyNames(), ", "), ")"));
}

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string>* const kNames = new std::vector<std::string>{
      "fifo", "p3", "bytescheduler", "prophet", "gradlane", "gradlane-rules"};
  return *kNames;
}

}  // namespace gradlane::sched
