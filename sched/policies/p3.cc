#include "sched/policies/p3.h"

namespace gradlane::sched {

std::unique_ptr<Policy> P3Policy::Create(const PolicyConfig& config) {
  const uint64_t f32 = config.partition_bytes != 0 ? config.partition_bytes
                                                   : kP3PartitionElements * DTypeBytes(DType::kF32);
  const uint64_t f16 = config.partition_bytes != 0 ? config.partition_bytes
                                                   : kP3PartitionElements * DTypeBytes(DType::kF16);
  // credit 0 = stop-and-wait (CreditWindow's empty-window rule admits exactly one dispatch).
  return std::unique_ptr<Policy>(new P3Policy(f32, f16, config.credit_bytes));
}

}  // namespace gradlane::sched
