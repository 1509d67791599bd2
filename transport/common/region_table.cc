#include "transport/common/region_table.h"

#include "absl/strings/str_cat.h"

namespace gradlane::transport {

RegionTable::RegionTable(uint32_t max_regions) : max_regions_(max_regions) {
  regions_.reserve(max_regions);
}

absl::StatusOr<RegionId> RegionTable::Register(void* base, uint64_t bytes) {
  if (base == nullptr && bytes > 0) return absl::InvalidArgumentError("region base is null");
  const RegisteredRegion r{static_cast<uint8_t*>(base), bytes, true};
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (!regions_[i].used) {
      regions_[i] = r;
      return static_cast<RegionId>(i);
    }
  }
  if (regions_.size() >= max_regions_) {
    return absl::ResourceExhaustedError(absl::StrCat("all ", max_regions_, " regions in use"));
  }
  regions_.push_back(r);
  return static_cast<RegionId>(regions_.size() - 1);
}

absl::Status RegionTable::Unregister(RegionId region) {
  if (region >= regions_.size() || !regions_[region].used) {
    return absl::NotFoundError(absl::StrCat("region ", region, " not registered"));
  }
  regions_[region] = RegisteredRegion{};
  return absl::OkStatus();
}

}  // namespace gradlane::transport
