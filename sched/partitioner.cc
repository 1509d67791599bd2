#include "sched/partitioner.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace gradlane::sched {

absl::Status PartitionPlan::ValidateRange(uint64_t offset, uint64_t length, DType dtype) const {
  if (offset > tensor_bytes_ || length > tensor_bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", length,
                                              ") exceeds tensor of ", tensor_bytes_, " bytes"));
  }
  const uint64_t elem = DTypeBytes(dtype);
  if (offset % elem != 0 || length % elem != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("range [", offset, ", +", length, ") is not aligned to ",
                     std::string(DTypeName(dtype)), " elements (", elem, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace gradlane::sched
