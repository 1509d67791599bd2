#include "daemon/ps/aggregator.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "daemon/ps/half.h"

// Passing 32-byte generic vectors between helpers compiled without AVX makes GCC warn that the
// ABI would differ with AVX enabled; the helpers are always inlined, nothing crosses a real call
// boundary, so the note is noise.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace gradlane::ps {
namespace {

// This Abseil build's string_view is its own type, so std::string_view needs converting for
// StrCat.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

using sched::DType;

// Lane-count-generic vector types. Each kernel uses its target's native register width (4 f32
// lanes = xmm for the SSE2 baseline, 8 = ymm for AVX2): GCC splits over-wide generic arithmetic
// into native pieces, but it scalarises over-wide *comparisons*, which the conversions are full
// of, so a single wide type for both targets runs ~10x slower.
template <int N>
struct V {
  // typedef, not `using`: GCC drops vector_size on a dependent alias-declaration.
  typedef float F __attribute__((vector_size(N * 4)));
  typedef uint32_t U __attribute__((vector_size(N * 4)));
  typedef int32_t I __attribute__((vector_size(N * 4)));  // what comparisons yield
  typedef uint16_t H __attribute__((vector_size(N * 2)));
};

// The lane-wise forms of half.h. Comparisons yield all-ones/all-zero lanes, so selects are
// bitwise blends and every lane runs the same instructions (no branches to vectorise away).
// Magnitude comparisons are done as *signed* int32 (the sign bit is cleared first, so the order
// is the same): SSE2 has only signed integer compares, unsigned ones cost extra flips.
template <int N>
[[gnu::always_inline]] inline typename V<N>::U Select(typename V<N>::I mask, typename V<N>::U a,
                                                      typename V<N>::U b) {
  const auto m = reinterpret_cast<typename V<N>::U>(mask);
  return (a & m) | (b & ~m);
}

template <int N>
[[gnu::always_inline]] inline typename V<N>::F F16ToF32(typename V<N>::H h16) {
  using U = typename V<N>::U;
  using I = typename V<N>::I;
  const U h = __builtin_convertvector(h16, U);
  constexpr uint32_t kExpMask = 0x7c00u << 13;
  U o = (h & 0x7fffu) << 13;
  const U exp = o & kExpMask;
  o += (127u - 15u) << 23;
  const U inf_nan = reinterpret_cast<U>(exp == kExpMask);
  o += inf_nan & ((128u - 16u) << 23);  // NaNs need no quieting here: see CanonicalizeNaN
  using F = typename V<N>::F;
  const F magic = std::bit_cast<float>(113u << 23) - F{};
  const U renorm = reinterpret_cast<U>(reinterpret_cast<F>(o + (1u << 23)) - magic);
  o = Select<N>(reinterpret_cast<I>(exp == 0u), renorm, o);
  o |= (h & 0x8000u) << 16;
  return reinterpret_cast<F>(o);
}

template <int N>
[[gnu::always_inline]] inline typename V<N>::H F32ToF16(typename V<N>::F value) {
  using U = typename V<N>::U;
  using I = typename V<N>::I;
  using F = typename V<N>::F;
  constexpr int32_t kF32Inf = 255 << 23;
  constexpr int32_t kF16Overflow = (127 + 16) << 23;
  constexpr int32_t kF16MinNormal = 113 << 23;
  constexpr uint32_t kDenormMagicBits = 126u << 23;
  U f = reinterpret_cast<U>(value);
  const U sign = f & 0x80000000u;
  f ^= sign;
  const I fi = reinterpret_cast<I>(f);
  const U nan_or_inf = Select<N>(fi > kF32Inf, 0x7e00u | ((f >> 13) & 0x3ffu), U{} + 0x7c00u);
  const F denorm_magic = std::bit_cast<float>(kDenormMagicBits) - F{};
  const U sub = reinterpret_cast<U>(reinterpret_cast<F>(f) + denorm_magic) - kDenormMagicBits;
  const U normal = (f + (((15u - 127u) << 23) + 0xfffu) + ((f >> 13) & 1u)) >> 13;
  U o = Select<N>(fi < kF16MinNormal, sub, normal);
  o = Select<N>(fi >= kF16Overflow, nan_or_inf, o);
  o |= sign >> 16;
  return __builtin_convertvector(o, typename V<N>::H);
}

// bf16 is the top half of an f32, so the kernels' forms are pure bit moves. Unlike half.h they
// skip NaN handling, which the kernels make redundant: a NaN input yields a NaN sum whatever its
// quiet bit, every NaN sum is replaced by the canonical one, and rounding that one
// (0x7fc00000 + 0x7fff) >> 16 gives the canonical bf16 NaN 0x7fc0 with no special case.
template <int N>
[[gnu::always_inline]] inline typename V<N>::F Bf16ToF32(typename V<N>::H h16) {
  using U = typename V<N>::U;
  return reinterpret_cast<typename V<N>::F>(__builtin_convertvector(h16, U) << 16);
}

template <int N>
[[gnu::always_inline]] inline typename V<N>::H F32ToBf16(typename V<N>::F value) {
  using U = typename V<N>::U;
  const U f = reinterpret_cast<U>(value);
  return __builtin_convertvector((f + 0x7fffu + ((f >> 16) & 1u)) >> 16, typename V<N>::H);
}

// Which NaN an addition returns when its operands carry different NaNs is up to the hardware
// and to the operand order the compiler picks (x86 returns the first operand's, ARM may return a
// default NaN), so NaN payloads and signs are not reproducible. Every NaN result is therefore
// written as the one canonical quiet NaN (which narrows to 0x7e00 in f16 and 0x7fc0 in bf16).
// This also lets the vector conversions above skip quieting NaNs on the way in.
inline constexpr uint32_t kCanonicalNaN = 0x7fc00000u;
template <int N>
[[gnu::always_inline]] inline typename V<N>::F CanonicalizeNaN(typename V<N>::F v) {
  using U = typename V<N>::U;
  return reinterpret_cast<typename V<N>::F>(
      Select<N>(v != v, U{} + kCanonicalNaN, reinterpret_cast<U>(v)));
}

// Loads and stores go through memcpy so buffers need no alignment (receive buffers and arena
// slices are byte-addressed); GCC turns them into unaligned vector moves.
template <DType D, int N>
struct Elem;

template <int N>
struct Elem<DType::kF32, N> {
  using F = typename V<N>::F;
  static constexpr size_t kBytes = 4;
  [[gnu::always_inline]] static F LoadVec(const std::byte* p) {
    F v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  [[gnu::always_inline]] static void StoreVec(F v, std::byte* p) { std::memcpy(p, &v, sizeof(v)); }
  static float Load(const std::byte* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static void Store(float v, std::byte* p) { std::memcpy(p, &v, 4); }
};

// f16 and bf16 differ only in their conversion pair.
template <int N, typename V<N>::F (*Widen)(typename V<N>::H),
          typename V<N>::H (*NarrowV)(typename V<N>::F), float (*WidenS)(uint16_t),
          uint16_t (*NarrowS)(float)>
struct Elem16 {
  using F = typename V<N>::F;
  using H = typename V<N>::H;
  static constexpr size_t kBytes = 2;
  [[gnu::always_inline]] static F LoadVec(const std::byte* p) {
    H h;
    std::memcpy(&h, p, sizeof(h));
    return Widen(h);
  }
  [[gnu::always_inline]] static void StoreVec(F v, std::byte* p) {
    const H h = NarrowV(v);
    std::memcpy(p, &h, sizeof(h));
  }
  static float Load(const std::byte* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return WidenS(h);
  }
  static void Store(float v, std::byte* p) {
    const uint16_t h = NarrowS(v);
    std::memcpy(p, &h, 2);
  }
};

template <int N>
struct Elem<DType::kF16, N> : Elem16<N, &F16ToF32<N>, &F32ToF16<N>, &ps::F16ToF32, &ps::F32ToF16> {
};
template <int N>
struct Elem<DType::kBF16, N>
    : Elem16<N, &Bf16ToF32<N>, &F32ToBf16<N>, &ps::Bf16ToF32, &ps::F32ToBf16> {};

// The scalar tail: the identical operation sequence per element as the vector bodies, so
// results do not depend on where the vector/tail boundary falls (nor on the vector width).
template <DType D>
inline void ReduceTail(const std::byte* const* src, uint32_t n, uint64_t i, uint64_t elems,
                       uint32_t divide_by, std::byte* out) {
  using E = Elem<D, 4>;
  const bool mean = divide_by > 0;
  const float divisor = static_cast<float>(divide_by);
  for (; i < elems; ++i) {
    const uint64_t off = i * E::kBytes;
    float acc = E::Load(src[0] + off);
    for (uint32_t r = 1; r < n; ++r) acc += E::Load(src[r] + off);
    if (mean) acc /= divisor;
    if (acc != acc) acc = std::bit_cast<float>(kCanonicalNaN);
    E::Store(acc, out + off);
  }
}

// One pass over the elements: per block of N, read the W inputs side by side (rank order), add,
// optionally divide, write. Reading every input before writing the block is what makes
// out == contributions[k] safe.
template <DType D, int N>
[[gnu::always_inline]] inline void ReduceBody(const std::byte* const* src, uint32_t n,
                                              uint64_t elems, uint32_t divide_by, std::byte* out) {
  using E = Elem<D, N>;
  const bool mean = divide_by > 0;
  const float divisor = static_cast<float>(divide_by);
  uint64_t i = 0;
  for (; i + N <= elems; i += N) {
    const uint64_t off = i * E::kBytes;
    typename V<N>::F acc = E::LoadVec(src[0] + off);
    for (uint32_t r = 1; r < n; ++r) acc += E::LoadVec(src[r] + off);
    if (mean) acc /= divisor;
    E::StoreVec(CanonicalizeNaN<N>(acc), out + off);
  }
  ReduceTail<D>(src, n, i, elems, divide_by, out);
}

// (inputs, how many, elements, divide by (0: do not), out)
using KernelFn = void (*)(const std::byte* const*, uint32_t, uint64_t, uint32_t, std::byte*);

template <DType D>
void ReduceBaseline(const std::byte* const* src, uint32_t n, uint64_t elems, uint32_t divide_by,
                    std::byte* out) {
  ReduceBody<D, 4>(src, n, elems, divide_by, out);
}

#if defined(__x86_64__)
// Same source, compiled for AVX2 with 8-lane (ymm) vectors. FMA is not enabled, and
// -ffp-contract=off is set for this library, so no add is ever fused.
template <DType D>
__attribute__((target("avx2"))) void ReduceAvx2(const std::byte* const* src, uint32_t n,
                                                uint64_t elems, uint32_t divide_by,
                                                std::byte* out) {
  ReduceBody<D, 8>(src, n, elems, divide_by, out);
}

// f16 on the AVX2 path: the software conversions cost ~40 integer ops per 8 lanes and make the
// kernel compute-bound, so here the F16C instructions convert instead. They are IEEE
// conversions (exact widening; narrowing with the RNE rounding immediate), i.e. bit-identical to
// half.h for every non-NaN value, and NaNs are canonicalised before narrowing anyway; the tests
// compare both paths over all 65536 patterns. Reached only after the runtime F16C check. A
// function of its own rather than a specialization of ReduceAvx2: clang takes a specialization
// with another target() for function multiversioning, and refuses it.
__attribute__((target("avx2,f16c"))) void ReduceAvx2F16(const std::byte* const* src, uint32_t n,
                                                        uint64_t elems, uint32_t divide_by,
                                                        std::byte* out) {
  const bool mean = divide_by > 0;
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(divide_by));
  const __m256 canonical = _mm256_castsi256_ps(_mm256_set1_epi32(kCanonicalNaN));
  uint64_t i = 0;
  for (; i + 8 <= elems; i += 8) {
    const uint64_t off = i * 2;
    __m256 acc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[0] + off)));
    for (uint32_t r = 1; r < n; ++r) {
      acc = _mm256_add_ps(
          acc, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[r] + off))));
    }
    if (mean) acc = _mm256_div_ps(acc, divisor);
    acc = _mm256_blendv_ps(acc, canonical, _mm256_cmp_ps(acc, acc, _CMP_UNORD_Q));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + off),
                     _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  ReduceTail<DType::kF16>(src, n, i, elems, divide_by, out);
}
#endif

bool CpuHasAvx2() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    // Every AVX2 CPU has F16C, but check both: the f16 kernel on this path uses F16C. (F16C
    // from CPUID leaf 1 directly: clang before 16 has no __builtin_cpu_supports("f16c").)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") != 0 && f16c;
  }();
  return has;
#else
  return false;
#endif
}

template <DType D>
KernelFn PickKernel(KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2) {
    if constexpr (D == DType::kF16) {
      return &ReduceAvx2F16;
    } else {
      return &ReduceAvx2<D>;
    }
  }
#endif
  return &ReduceBaseline<D>;
}

}  // namespace

bool KernelIsaAvailable(KernelIsa isa) { return isa != KernelIsa::kAvx2 || CpuHasAvx2(); }

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
  return ReduceInOrder(dtype, contributions, bytes,
                       op == ReduceOp::kMean ? static_cast<uint32_t>(contributions.size()) : 0, out,
                       isa);
}

absl::Status ReduceInOrder(DType dtype, absl::Span<const std::byte* const> contributions,
                           uint64_t bytes, uint32_t divide_by, std::byte* out, KernelIsa isa) {
  const uint32_t elem = sched::DTypeBytes(dtype);
  if (contributions.empty() || contributions.size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 1..", kMaxWorldSize, " contributions, got ", contributions.size()));
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
  fn(contributions.data(), static_cast<uint32_t>(contributions.size()), bytes / elem, divide_by,
     out);
  return absl::OkStatus();
}

absl::Status KeyAggregation::Begin(sched::SegmentKey key, int64_t iteration, uint32_t world_size,
                                   DType dtype, uint64_t bytes) {
  if (world_size == 0 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", world_size, " outside 1..", kMaxWorldSize,
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
    return absl::FailedPreconditionError(absl::StrCat("key ", key_, ": no open round to reduce"));
  }
  if (mask_ != full_mask_) {
    return absl::FailedPreconditionError(absl::StrCat("key ", key_, " iteration ", iteration_, ": ",
                                                      missing(), " contributions missing"));
  }
  if (out.size() != bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", key_, ": output is ", out.size(), " bytes, expected ", bytes_));
  }
  absl::Status s = ReduceInRankOrder(dtype_, absl::MakeConstSpan(contributions_, world_size_),
                                     bytes_, op, out.data(), isa);
  if (!s.ok()) return s;
  active_ = false;
  std::memset(contributions_, 0, sizeof(contributions_));
  return absl::OkStatus();
}

}  // namespace gradlane::ps
