#include "daemon/ps/aggregator.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/ps/half.h"

// Passing 64-byte generic vectors between (always-inlined) helpers makes GCC warn that the ABI
// would differ with AVX enabled; nothing crosses a real call boundary, so the note is noise.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace gradlane::ps {
namespace {

// This Abseil build's string_view is its own type, so std::string_view needs converting for
// StrCat.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

using sched::DType;

// 16 lanes = one cache line of f32: enough independent work per step to hide add latency on
// both paths (4 xmm or 2 ymm registers per vector) without spilling the conversion constants.
inline constexpr int kLanes = 16;
using VecF = float __attribute__((vector_size(kLanes * 4)));
using VecU = uint32_t __attribute__((vector_size(kLanes * 4)));
using VecH = uint16_t __attribute__((vector_size(kLanes * 2)));

// The lane-wise forms of half.h. Comparisons yield all-ones/all-zero lanes, so selects are
// bitwise blends and every lane runs the same instructions (no branches to vectorise away).
[[gnu::always_inline]] inline VecU Select(VecU mask, VecU a, VecU b) {
  return (a & mask) | (b & ~mask);
}
[[gnu::always_inline]] inline VecU Mask(auto cmp) { return reinterpret_cast<VecU>(cmp); }

[[gnu::always_inline]] inline VecF F16ToF32(VecH h16) {
  const VecU h = __builtin_convertvector(h16, VecU);
  constexpr uint32_t kExpMask = 0x7c00u << 13;
  VecU o = (h & 0x7fffu) << 13;
  const VecU exp = o & kExpMask;
  o += (127u - 15u) << 23;
  const VecU inf_nan = Mask(exp == kExpMask);
  o += inf_nan & ((128u - 16u) << 23);
  o |= inf_nan & Mask((o & 0x007fffffu) != 0u) & 0x00400000u;
  const VecF magic = std::bit_cast<float>(113u << 23) - VecF{};
  const VecU renorm = reinterpret_cast<VecU>(reinterpret_cast<VecF>(o + (1u << 23)) - magic);
  o = Select(Mask(exp == 0u), renorm, o);
  o |= (h & 0x8000u) << 16;
  return reinterpret_cast<VecF>(o);
}

[[gnu::always_inline]] inline VecH F32ToF16(VecF value) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;
  constexpr uint32_t kDenormMagicBits = 126u << 23;
  VecU f = reinterpret_cast<VecU>(value);
  const VecU sign = f & 0x80000000u;
  f ^= sign;
  const VecU nan_or_inf =
      Select(Mask(f > kF32Inf), 0x7e00u | ((f >> 13) & 0x3ffu), VecU{} + 0x7c00u);
  const VecF denorm_magic = std::bit_cast<float>(kDenormMagicBits) - VecF{};
  const VecU sub = reinterpret_cast<VecU>(reinterpret_cast<VecF>(f) + denorm_magic) -
                   kDenormMagicBits;
  const VecU normal = (f + (((15u - 127u) << 23) + 0xfffu) + ((f >> 13) & 1u)) >> 13;
  VecU o = Select(Mask(f < (113u << 23)), sub, normal);
  o = Select(Mask(f >= kF16Overflow), nan_or_inf, o);
  o |= sign >> 16;
  return __builtin_convertvector(o, VecH);
}

[[gnu::always_inline]] inline VecF Bf16ToF32(VecH h16) {
  VecU o = __builtin_convertvector(h16, VecU) << 16;
  o |= Mask((o & 0x7fffffffu) > 0x7f800000u) & 0x00400000u;
  return reinterpret_cast<VecF>(o);
}

[[gnu::always_inline]] inline VecH F32ToBf16(VecF value) {
  const VecU f = reinterpret_cast<VecU>(value);
  const VecU nan = (f >> 16) | 0x0040u;
  const VecU rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
  return __builtin_convertvector(Select(Mask((f & 0x7fffffffu) > 0x7f800000u), nan, rounded),
                                 VecH);
}

// Which NaN an addition returns when its operands carry different NaNs is up to the hardware
// and to the operand order the compiler picks (x86 returns the first operand's, ARM may return a
// default NaN), so NaN payloads and signs are not reproducible. Every NaN result is therefore
// written as the one canonical quiet NaN (which narrows to 0x7e00 in f16 and 0x7fc0 in bf16).
inline constexpr uint32_t kCanonicalNaN = 0x7fc00000u;
[[gnu::always_inline]] inline VecF CanonicalizeNaN(VecF v) {
  const VecU is_nan = Mask(v != v);
  return reinterpret_cast<VecF>(Select(is_nan, VecU{} + kCanonicalNaN, reinterpret_cast<VecU>(v)));
}

// Loads and stores go through memcpy so buffers need no alignment (receive buffers and arena
// slices are byte-addressed); GCC turns them into unaligned vector moves.
template <DType D>
struct Elem;

template <>
struct Elem<DType::kF32> {
  static constexpr size_t kBytes = 4;
  [[gnu::always_inline]] static VecF LoadVec(const std::byte* p) {
    VecF v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  [[gnu::always_inline]] static void StoreVec(VecF v, std::byte* p) {
    std::memcpy(p, &v, sizeof(v));
  }
  static float Load(const std::byte* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static void Store(float v, std::byte* p) { std::memcpy(p, &v, 4); }
};

template <>
struct Elem<DType::kF16> {
  static constexpr size_t kBytes = 2;
  [[gnu::always_inline]] static VecF LoadVec(const std::byte* p) {
    VecH h;
    std::memcpy(&h, p, sizeof(h));
    return F16ToF32(h);
  }
  [[gnu::always_inline]] static void StoreVec(VecF v, std::byte* p) {
    const VecH h = F32ToF16(v);
    std::memcpy(p, &h, sizeof(h));
  }
  static float Load(const std::byte* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return ps::F16ToF32(h);
  }
  static void Store(float v, std::byte* p) {
    const uint16_t h = ps::F32ToF16(v);
    std::memcpy(p, &h, 2);
  }
};

template <>
struct Elem<DType::kBF16> {
  static constexpr size_t kBytes = 2;
  [[gnu::always_inline]] static VecF LoadVec(const std::byte* p) {
    VecH h;
    std::memcpy(&h, p, sizeof(h));
    return Bf16ToF32(h);
  }
  [[gnu::always_inline]] static void StoreVec(VecF v, std::byte* p) {
    const VecH h = F32ToBf16(v);
    std::memcpy(p, &h, sizeof(h));
  }
  static float Load(const std::byte* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return ps::Bf16ToF32(h);
  }
  static void Store(float v, std::byte* p) {
    const uint16_t h = ps::F32ToBf16(v);
    std::memcpy(p, &h, 2);
  }
};

// One pass over the elements: per block of kLanes, read the W inputs side by side (rank order),
// add, optionally divide, write. Reading every input before writing the block is what makes
// out == contributions[k] safe. The scalar tail performs the identical operation sequence per
// element, so results do not depend on where the vector/tail boundary falls.
template <DType D>
[[gnu::always_inline]] inline void ReduceBody(const std::byte* const* src, uint32_t n,
                                              uint64_t elems, bool mean, std::byte* out) {
  using E = Elem<D>;
  const float divisor = static_cast<float>(n);
  uint64_t i = 0;
  for (; i + kLanes <= elems; i += kLanes) {
    const uint64_t off = i * E::kBytes;
    VecF acc = E::LoadVec(src[0] + off);
    for (uint32_t r = 1; r < n; ++r) acc += E::LoadVec(src[r] + off);
    if (mean) acc /= divisor;
    acc = CanonicalizeNaN(acc);
    E::StoreVec(acc, out + off);
  }
  for (; i < elems; ++i) {
    const uint64_t off = i * E::kBytes;
    float acc = E::Load(src[0] + off);
    for (uint32_t r = 1; r < n; ++r) acc += E::Load(src[r] + off);
    if (mean) acc /= divisor;
    if (acc != acc) acc = std::bit_cast<float>(kCanonicalNaN);
    E::Store(acc, out + off);
  }
}

using KernelFn = void (*)(const std::byte* const*, uint32_t, uint64_t, bool, std::byte*);

template <DType D>
void ReduceBaseline(const std::byte* const* src, uint32_t n, uint64_t elems, bool mean,
                    std::byte* out) {
  ReduceBody<D>(src, n, elems, mean, out);
}

#if defined(__x86_64__)
// Same source, compiled for AVX2: the generic vectors lower to ymm instead of xmm pairs. Only
// AVX2 is enabled (not FMA), and -ffp-contract=off is set for this library, so no add is fused.
template <DType D>
__attribute__((target("avx2"))) void ReduceAvx2(const std::byte* const* src, uint32_t n,
                                                uint64_t elems, bool mean, std::byte* out) {
  ReduceBody<D>(src, n, elems, mean, out);
}
#endif

bool CpuHasAvx2() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
#else
  return false;
#endif
}

template <DType D>
KernelFn PickKernel(KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2) return &ReduceAvx2<D>;
#endif
  return &ReduceBaseline<D>;
}

}  // namespace

bool KernelIsaAvailable(KernelIsa isa) {
  return isa != KernelIsa::kAvx2 || CpuHasAvx2();
}

KernelIsa ResolvedKernelIsa() { return CpuHasAvx2() ? KernelIsa::kAvx2 : KernelIsa::kBaseline; }

std::string_view KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAuto:
      return "auto";
    case KernelIsa::kBaseline:
      return "baseline";
    case KernelIsa::kAvx2:
      return "avx2";
  }
  return "unknown";
}

absl::Status ReduceInRankOrder(DType dtype, absl::Span<const std::byte* const> contributions,
                               uint64_t bytes, ReduceOp op, std::byte* out, KernelIsa isa) {
  const uint32_t elem = sched::DTypeBytes(dtype);
  if (contributions.empty() || contributions.size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("need 1..", kMaxWorldSize,
                                                   " contributions, got ",
                                                   contributions.size()));
  }
  if (bytes % elem != 0) {
    return absl::InvalidArgumentError(absl::StrCat(bytes, " bytes is not a whole number of ",
                                                   Sv(sched::DTypeName(dtype)), " elements"));
  }
  if (bytes > 0) {
    if (out == nullptr) return absl::InvalidArgumentError("null output buffer");
    for (const std::byte* c : contributions) {
      if (c == nullptr) return absl::InvalidArgumentError("null contribution buffer");
    }
  }
  if (isa == KernelIsa::kAuto) isa = ResolvedKernelIsa();
  if (!KernelIsaAvailable(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel ", Sv(KernelIsaName(isa)), " is not supported by this CPU"));
  }
  KernelFn fn = nullptr;
  switch (dtype) {
    case DType::kF32:
      fn = PickKernel<DType::kF32>(isa);
      break;
    case DType::kF16:
      fn = PickKernel<DType::kF16>(isa);
      break;
    case DType::kBF16:
      fn = PickKernel<DType::kBF16>(isa);
      break;
  }
  if (fn == nullptr) return absl::InvalidArgumentError("unknown dtype");
  fn(contributions.data(), static_cast<uint32_t>(contributions.size()), bytes / elem,
     op == ReduceOp::kMean, out);
  return absl::OkStatus();
}

absl::Status KeyAggregation::Begin(sched::SegmentKey key, int64_t iteration,
                                   uint32_t world_size, DType dtype, uint64_t bytes) {
  if (world_size == 0 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", world_size, " outside 1..", kMaxWorldSize,
        " (contributions are tracked in a 64-bit mask)"));
  }
  const uint32_t elem = sched::DTypeBytes(dtype);
  if (bytes == 0 || bytes % elem != 0) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key, ": ", bytes,
                                                   " bytes is not a positive whole number of ",
                                                   Sv(sched::DTypeName(dtype)), " elements"));
  }
  std::memset(contributions_, 0, sizeof(contributions_));
  mask_ = 0;
  full_mask_ = world_size == 64 ? ~uint64_t{0} : (uint64_t{1} << world_size) - 1;
  bytes_ = bytes;
  iteration_ = iteration;
  key_ = key;
  world_size_ = world_size;
  dtype_ = dtype;
  active_ = true;
  return absl::OkStatus();
}

absl::Status KeyAggregation::Contribute(uint32_t rank, int64_t iteration,
                                        absl::Span<const std::byte> data) {
  if (!active_) {
    ++rejected_;
    return absl::FailedPreconditionError(
        absl::StrCat("key ", key_, ": contribution from rank ", rank,
                     " but no round is open (not begun or already reduced)"));
  }
  if (iteration != iteration_) {
    ++rejected_;
    return absl::FailedPreconditionError(absl::StrCat("key ", key_, ": contribution for iteration ",
                                                      iteration, " while collecting iteration ",
                                                      iteration_));
  }
  if (rank >= world_size_) {
    ++rejected_;
    return absl::OutOfRangeError(
        absl::StrCat("key ", key_, ": rank ", rank, " >= world size ", world_size_));
  }
  if (data.size() != bytes_ || data.data() == nullptr) {
    ++rejected_;
    ++wrong_length_;
    return absl::InvalidArgumentError(absl::StrCat("key ", key_, ": rank ", rank, " sent ",
                                                   data.size(), " bytes, expected ", bytes_));
  }
  const uint64_t bit = uint64_t{1} << rank;
  if (mask_ & bit) {
    ++rejected_;
    ++duplicates_;
    return absl::AlreadyExistsError(absl::StrCat("key ", key_, " iteration ", iteration_,
                                                 ": duplicate contribution from rank ", rank));
  }
  contributions_[rank] = data.data();
  mask_ |= bit;
  return absl::OkStatus();
}

uint32_t KeyAggregation::missing() const {
  return active_ ? static_cast<uint32_t>(std::popcount(full_mask_ & ~mask_)) : 0;
}

absl::Status KeyAggregation::Reduce(ReduceOp op, absl::Span<std::byte> out, KernelIsa isa) {
  if (!active_) {
    return absl::FailedPreconditionError(
        absl::StrCat("key ", key_, ": no open round to reduce"));
  }
  if (mask_ != full_mask_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key ", key_, " iteration ", iteration_, ": ", missing(), " contributions missing"));
  }
  if (out.size() != bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key_, ": output is ", out.size(),
                                                   " bytes, expected ", bytes_));
  }
  absl::Status s = ReduceInRankOrder(
      dtype_, absl::MakeConstSpan(contributions_, world_size_), bytes_, op, out.data(), isa);
  if (!s.ok()) return s;
  active_ = false;
  std::memset(contributions_, 0, sizeof(contributions_));
  return absl::OkStatus();
}

}  // namespace gradlane::ps
