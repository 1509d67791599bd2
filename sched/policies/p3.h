// sched/policies/p3.h — P3 (SysML'19): small fixed slices, priority order, stop-and-wait.
//
// * Partitions: at most 50,000 parameters (§5.6), i.e. 50,000 × dtype bytes: 200,000 B for
//   f32 tensors, 100,000 B for f16/bf16. PolicyConfig::partition_bytes, if set, overrides
//   this with one byte size for every dtype (element-aligned by the partitioner).
// * Order: slice priority = its layer's forward order (§4), most urgent first; ties by key.
// * Window: P3's consumer thread uses blocking sends, one slice at a time (§4.2): a
//   stop-and-wait window, i.e. a CreditWindow of capacity 0 (one dispatch in flight, of any
//   size). PolicyConfig::credit_bytes, if set, replaces it with a byte window.
//
// Thread rules and allocation: as Policy.
#ifndef GRADLANE_SCHED_POLICIES_P3_H_
#define GRADLANE_SCHED_POLICIES_P3_H_

#include <memory>

#include "sched/partitioner.h"
#include "sched/policies/bytescheduler.h"

namespace gradlane::sched {

class P3Policy final : public PartitionedPriorityPolicy {
 public:
  // config is already validated by MakePolicy.
  static std::unique_ptr<Policy> Create(const PolicyConfig& config);

 private:
  P3Policy(uint64_t partition_f32, uint64_t partition_16, uint64_t credit)
      : PartitionedPriorityPolicy("p3", partition_f32, partition_16, credit) {}
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICIES_P3_H_
