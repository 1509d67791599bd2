// transport/common/region_table.h — the memory regions a transport backend sends from and
// receives into, by RegionId, with the bounds checks every backend makes.
//
// A region is a base pointer and a length the engine registered (RegisterRegion_st); sends name
// a range in one, and so do receive targets. The checks live here once so that every backend
// refuses the same bad ranges with the same statuses: PostSend_st's (ResolveSend) and those of a
// receive target (ResolveRecv), where a range outside its region must discard the payload, never
// write past the region.
//
// Guarantees: ids of unregistered regions are reused, lowest first, so ids stay below
// max_regions; a RegionId is only ever checked, never trusted. Storage is reserved in Init
// (control path); ResolveSend and ResolveRecv never allocate on success (the data path), only
// an error status may. The memory itself is the engine's: the table neither owns nor touches it.
// Thread rules: the engine thread that owns the backend.
#ifndef GRADLANE_TRANSPORT_COMMON_REGION_TABLE_H_
#define GRADLANE_TRANSPORT_COMMON_REGION_TABLE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace gradlane::transport {

class RegionTable {
 public:
  // Reserves room for max_regions entries (control path).
  explicit RegionTable(uint32_t max_regions);

  // InvalidArgument for a null base with a length; ResourceExhausted when max_regions are
  // registered. A zero-length region (any base) is fine: it holds only empty ranges.
  absl::StatusOr<RegionId> Register(void* base, uint64_t bytes);
  // NotFound for an id that is not registered.
  absl::Status Unregister(RegionId region);

  // PostSend_st's argument checks (ResolveSendPayload): where the payload starts.
  absl::StatusOr<const uint8_t*> ResolveSend(const SendSpec& spec,
                                             uint64_t max_segment_bytes) const {
    return ResolveSendPayload(regions_, spec, max_segment_bytes);
  }

  // Where the `length` payload bytes of an incoming segment go: nullopt when the target does
  // not accept, names no registered region, or the range does not fit in it.
  std::optional<uint8_t*> ResolveRecv(const RecvTarget& target, uint64_t length) const {
    if (!target.accept || target.region >= regions_.size() || !regions_[target.region].used) {
      return std::nullopt;
    }
    const RegisteredRegion& r = regions_[target.region];
    if (target.region_offset > r.bytes || length > r.bytes - target.region_offset)
      return std::nullopt;
    return r.base + target.region_offset;
  }

  uint32_t max_regions() const { return max_regions_; }

 private:
  uint32_t max_regions_;
  std::vector<RegisteredRegion> regions_;  // index = RegionId; `used` false: free
};

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_COMMON_REGION_TABLE_H_
