#include "daemon/ps/aggregator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/ps/half.h"
#include "gtest/gtest.h"

namespace gradlane::ps {
namespace {

using sched::DType;

// ---------------------------------------------------------------------------------------------
// References, independent of half.h.

// The compiler's own binary16 (libgcc soft-float on x86-64 baseline) as the f16 reference.
#if defined(__clang__) && __clang_major__ < 15
// clang 14 has no _Float16 on x86-64: there its __fp16, converted by compiler-rt's soft-float
// builtins (tests/unit/daemon/meson.build links them), is the reference.
uint16_t RefF32ToF16(float f) {
  const __fp16 h = static_cast<__fp16>(f);
  return std::bit_cast<uint16_t>(h);
}
float RefF16ToF32(uint16_t h) {
  __fp16 v;
  std::memcpy(&v, &h, sizeof(v));
  return static_cast<float>(v);
}
#else
uint16_t RefF32ToF16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  return std::bit_cast<uint16_t>(h);
}
float RefF16ToF32(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
#endif

// bf16 is the top half of an f32, so its exact value is Bf16 bits << 16 (no rounding involved);
// round-to-nearest-even is checked by comparing exact distances in double. The pattern above
// the largest finite value (0x7f80 = infinity) stands for 2^128 when measuring distance, which
// is what IEEE overflow rounding does.
uint16_t RefF32ToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0;  // callers handle NaN separately
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag >= 0x7f800000u) return sign | 0x7f80u;  // infinity stays infinity
  const uint16_t lo = static_cast<uint16_t>(mag >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  auto value = [](uint16_t b) -> double {
    if (b == 0x7f80u) return std::ldexp(1.0, 128);
    return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(b) << 16));
  };
  const double x = static_cast<double>(std::bit_cast<float>(mag));
  const double dlo = x - value(lo);
  const double dhi = value(hi) - x;
  uint16_t pick;
  if (dlo < dhi) {
    pick = lo;
  } else if (dhi < dlo) {
    pick = hi;
  } else {
    pick = (lo & 1u) ? hi : lo;
  }
  return sign | pick;
}

float Widen(DType d, const std::byte* p) {
  if (d == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
}

void Narrow(DType d, float f, std::byte* p) {
  if (d == DType::kF32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = d == DType::kF16 ? F32ToF16(f) : F32ToBf16(f);
  std::memcpy(p, &h, 2);
}

// The scalar reference reduction: element by element, rank 0..W-1, in f32.
std::vector<std::byte> ReferenceReduce(DType d, const std::vector<std::vector<std::byte>>& in,
                                       ReduceOp op) {
  const size_t eb = sched::DTypeBytes(d);
  const size_t n = in[0].size() / eb;
  std::vector<std::byte> out(in[0].size());
  for (size_t i = 0; i < n; ++i) {
    float acc = Widen(d, in[0].data() + i * eb);
    for (size_t r = 1; r < in.size(); ++r) acc += Widen(d, in[r].data() + i * eb);
    if (op == ReduceOp::kMean) acc /= static_cast<float>(in.size());
    if (std::isnan(acc)) acc = std::bit_cast<float>(0x7fc00000u);  // the documented canonical NaN
    Narrow(d, acc, out.data() + i * eb);
  }
  return out;
}

// Gradient-like values: mostly N(0, 1) scaled over several decades, in the target dtype.
std::vector<std::byte> RandomBuffer(std::mt19937_64& rng, DType d, size_t elems) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-12, 6);
  std::vector<std::byte> buf(elems * sched::DTypeBytes(d));
  for (size_t i = 0; i < elems; ++i) {
    Narrow(d, std::ldexp(normal(rng), scale(rng)), buf.data() + i * sched::DTypeBytes(d));
  }
  return buf;
}

std::vector<const std::byte*> Pointers(const std::vector<std::vector<std::byte>>& in) {
  std::vector<const std::byte*> p;
  for (const auto& b : in) p.push_back(b.data());
  return p;
}

std::vector<KernelIsa> AvailableIsas() {
  std::vector<KernelIsa> isas = {KernelIsa::kAuto, KernelIsa::kBaseline};
  if (KernelIsaAvailable(KernelIsa::kAvx2)) isas.push_back(KernelIsa::kAvx2);
  return isas;
}

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// ---------------------------------------------------------------------------------------------
// Conversions.

TEST(HalfTest, F16WideningMatchesCompilerForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float ours = F16ToF32(h);
    const float ref = RefF16ToF32(h);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(ours)) << std::hex << b;
      ASSERT_EQ(std::signbit(ours), std::signbit(ref)) << std::hex << b;
      ASSERT_NE(std::bit_cast<uint32_t>(ours) & 0x00400000u, 0u) << "NaN not quiet " << b;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(ref)) << std::hex << b;
    }
  }
}

TEST(HalfTest, RoundTripIsIdentityForEveryNonNaNPattern) {
  int nans = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const bool f16_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
    const bool bf16_nan = (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0;
    if (f16_nan) {
      ++nans;
      const uint16_t back = F32ToF16(F16ToF32(h));
      EXPECT_TRUE((back & 0x7c00u) == 0x7c00u && (back & 0x03ffu) != 0) << std::hex << b;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u);
    } else {
      ASSERT_EQ(F32ToF16(F16ToF32(h)), h) << std::hex << b;
    }
    if (bf16_nan) {
      const uint16_t back = F32ToBf16(Bf16ToF32(h));
      EXPECT_TRUE((back & 0x7f80u) == 0x7f80u && (back & 0x007fu) != 0) << std::hex << b;
    } else {
      ASSERT_EQ(F32ToBf16(Bf16ToF32(h)), h) << std::hex << b;
      ASSERT_EQ(std::bit_cast<uint32_t>(Bf16ToF32(h)), static_cast<uint32_t>(h) << 16);
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

// Every midpoint between adjacent finite f16/bf16 values (exact ties), and a hair either side
// of it, plus the overflow and subnormal boundaries, against the references.
TEST(HalfTest, NarrowingRoundsToNearestEvenAtEveryTie) {
  for (uint32_t b = 0; b < 0x7c00u; ++b) {  // positive finite f16, b+1 its successor
    const double lo = RefF16ToF32(static_cast<uint16_t>(b));
    const double hi = b + 1 == 0x7c00u ? 65536.0 : RefF16ToF32(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: needs 12 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (b & 1u) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    ASSERT_EQ(F32ToF16(mid), even) << std::hex << b;
    ASSERT_EQ(F32ToF16(-mid), even | 0x8000u) << std::hex << b;
    ASSERT_EQ(F32ToF16(mid), RefF32ToF16(mid));
    ASSERT_EQ(F32ToF16(std::nextafter(mid, 0.0f)), b) << std::hex << b;
    ASSERT_EQ(F32ToF16(std::nextafter(mid, INFINITY)), b + 1) << std::hex << b;
  }
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    const float lo = Bf16ToF32(static_cast<uint16_t>(b));
    const double hi = b + 1 == 0x7f80u ? std::ldexp(1.0, 128) : Bf16ToF32(b + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: needs 9 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (b & 1u) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    ASSERT_EQ(F32ToBf16(mid), even) << std::hex << b;
    ASSERT_EQ(F32ToBf16(std::nextafter(mid, 0.0f)), b) << std::hex << b;
    ASSERT_EQ(F32ToBf16(std::nextafter(mid, INFINITY)), b + 1) << std::hex << b;
  }
  // Named boundaries.
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bffu);
  EXPECT_EQ(F32ToF16(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00u);  // tie between max and "65536": even is infinity
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00u);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000u);  // tie with zero: even
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001u);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -30)), 0x8000u);    // signed zero
  EXPECT_EQ(F32ToF16(std::ldexp(1023.0f, -24)), 0x03ffu);  // largest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400u);     // smallest normal
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x00018000u)), 0x0002u);  // subnormal tie: even
}

TEST(HalfTest, NarrowingMatchesReferencesOnRandomF32Patterns) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 4'000'000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) {
      const uint16_t h = F32ToF16(f);
      ASSERT_TRUE((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) << std::hex << bits;
      const uint16_t bh = F32ToBf16(f);
      ASSERT_TRUE((bh & 0x7f80u) == 0x7f80u && (bh & 0x7fu) != 0) << std::hex << bits;
      ASSERT_EQ(bh & 0x8000u, (bits >> 16) & 0x8000u);
      continue;
    }
    ASSERT_EQ(F32ToF16(f), RefF32ToF16(f)) << std::hex << bits;
    ASSERT_EQ(F32ToBf16(f), RefF32ToBf16(f)) << std::hex << bits;
  }
}

// The vector kernels run their own lane-wise conversions: push all 65536 patterns through a
// one-rank sum (widen, narrow) and a two-rank sum (exercises narrowing of inexact f32 sums)
// on every kernel, against the scalar reference.
TEST(AggregatorTest, VectorConversionsMatchScalarForAllPatterns) {
  for (DType d : {DType::kF16, DType::kBF16}) {
    std::vector<std::byte> all(65536 * 2);
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t h = static_cast<uint16_t>(b);
      std::memcpy(all.data() + 2 * b, &h, 2);
    }
    std::vector<std::byte> rev(all.rbegin(), all.rend());  // byte-reversed: other pairings
    for (KernelIsa isa : AvailableIsas()) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        for (int w : {1, 2}) {
          std::vector<std::vector<std::byte>> in = {all};
          if (w == 2) in.push_back(rev);
          const auto ref = ReferenceReduce(d, in, op);
          std::vector<std::byte> out(all.size());
          auto p = Pointers(in);
          ASSERT_TRUE(ReduceInRankOrder(d, p, all.size(), op, out.data(), isa).ok());
          ASSERT_EQ(out, ref) << sched::DTypeName(d) << " " << KernelIsaName(isa) << " w=" << w;
        }
      }
    }
  }
}

// The mean of two adjacent 16-bit values is exactly their midpoint in f32 (the sum needs at
// most 12 significant bits and stays finite, halving is exact), so this drives a rounding tie
// through every kernel's narrowing for every positive and negative finite pattern: RNE must pick
// the even one.
TEST(AggregatorTest, VectorNarrowingRoundsEveryTieToEven) {
  for (DType d : {DType::kF16, DType::kBF16}) {
    // f16: every pair below infinity. bf16 shares f32's exponent range, so pairs in the top
    // binade (0x7f00..) overflow the f32 sum and are left out.
    const uint32_t limit = d == DType::kF16 ? 0x7c00u : 0x7f00u;
    std::vector<uint16_t> lo, hi, even;
    for (uint32_t sign : {0u, 0x8000u}) {
      for (uint32_t b = 0; b + 1 < limit; ++b) {
        lo.push_back(static_cast<uint16_t>(sign | b));
        hi.push_back(static_cast<uint16_t>(sign | (b + 1)));
        even.push_back(static_cast<uint16_t>(sign | ((b & 1u) ? b + 1 : b)));
      }
    }
    std::vector<std::vector<std::byte>> in(2, std::vector<std::byte>(lo.size() * 2));
    std::memcpy(in[0].data(), lo.data(), lo.size() * 2);
    std::memcpy(in[1].data(), hi.data(), hi.size() * 2);
    auto p = Pointers(in);
    for (KernelIsa isa : AvailableIsas()) {
      std::vector<uint16_t> out(lo.size());
      ASSERT_TRUE(ReduceInRankOrder(d, p, lo.size() * 2, ReduceOp::kMean,
                                    reinterpret_cast<std::byte*>(out.data()), isa)
                      .ok());
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], even[i])
            << sched::DTypeName(d) << " " << KernelIsaName(isa) << std::hex << " lo=" << lo[i];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Reduction.

TEST(AggregatorTest, MatchesScalarReferenceForEveryDtypeLengthWorldAndKernel) {
  std::mt19937_64 rng(42);
  const size_t lengths[] = {1, 2, 7, 15, 16, 17, 31, 33, 100, 1023, 4099, (1u << 20) + 3};
  for (DType d : kDTypes) {
    for (size_t elems : lengths) {
      for (int w : {1, 2, 3, 7, 64}) {
        if (elems > 5000 && w > 3) continue;  // keep the large case quick
        std::vector<std::vector<std::byte>> in;
        for (int r = 0; r < w; ++r) in.push_back(RandomBuffer(rng, d, elems));
        const auto p = Pointers(in);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
          const auto ref = ReferenceReduce(d, in, op);
          for (KernelIsa isa : AvailableIsas()) {
            std::vector<std::byte> out(in[0].size(), std::byte{0xcd});
            ASSERT_TRUE(ReduceInRankOrder(d, p, out.size(), op, out.data(), isa).ok());
            ASSERT_EQ(out, ref) << sched::DTypeName(d) << " elems=" << elems << " w=" << w
                                << " op=" << static_cast<int>(op) << " " << KernelIsaName(isa);
          }
        }
      }
    }
  }
}

TEST(AggregatorTest, UnalignedAndInPlaceBuffers) {
  std::mt19937_64 rng(5);
  for (DType d : kDTypes) {
    const size_t elems = 301;
    const size_t bytes = elems * sched::DTypeBytes(d);
    std::vector<std::vector<std::byte>> in;
    for (int r = 0; r < 3; ++r) in.push_back(RandomBuffer(rng, d, elems));
    const auto ref = ReferenceReduce(d, in, ReduceOp::kSum);
    // Copies at odd offsets: receive buffers are byte-addressed.
    std::vector<std::vector<std::byte>> shifted(3, std::vector<std::byte>(bytes + 3));
    std::vector<const std::byte*> p;
    for (int r = 0; r < 3; ++r) {
      std::memcpy(shifted[r].data() + 1 + r, in[r].data(), bytes);
      p.push_back(shifted[r].data() + 1 + r);
    }
    std::vector<std::byte> out(bytes + 1);
    ASSERT_TRUE(ReduceInRankOrder(d, p, bytes, ReduceOp::kSum, out.data() + 1).ok());
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), out.begin() + 1));
    // In place over rank 1's buffer.
    std::byte* rank1 = shifted[1].data() + 2;
    ASSERT_TRUE(ReduceInRankOrder(d, p, bytes, ReduceOp::kSum, rank1).ok());
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), rank1));
  }
}

// f32 addition is not associative: with these values the order visibly changes the answer, so
// the test would catch an implementation that summed in arrival order.
TEST(AggregatorTest, ArrivalOrderNeverChangesTheBits) {
  const std::vector<float> vals = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f};
  // Rank order: ((((1e8 + 1) - 1e8) + 1) + 3) = 0 + 1 + 3 = 4 (1e8 + 1 rounds back to 1e8).
  // Reversed: (((3 + 1) - 1e8) + 1) + 1e8 = 0. Different, so order is observable.
  float rev = 0;
  for (int r = 4; r >= 0; --r) rev += vals[r];
  float fwd = 0;
  for (int r = 0; r < 5; ++r) fwd += vals[r];
  ASSERT_NE(fwd, rev);

  std::mt19937_64 rng(11);
  for (DType d : kDTypes) {
    const size_t elems = 1000;
    const size_t bytes = elems * sched::DTypeBytes(d);
    std::vector<std::vector<std::byte>> in;
    for (int r = 0; r < 5; ++r) in.push_back(RandomBuffer(rng, d, elems));
    if (d == DType::kF32) {
      for (int r = 0; r < 5; ++r) std::memcpy(in[r].data(), &vals[r], 4);  // element 0
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      const auto ref = ReferenceReduce(d, in, op);
      if (d == DType::kF32 && op == ReduceOp::kSum) {
        float first;
        std::memcpy(&first, ref.data(), 4);
        EXPECT_EQ(first, fwd);
      }
      std::vector<uint32_t> order = {0, 1, 2, 3, 4};
      KeyAggregation agg;
      for (int perm = 0; perm < 120; ++perm) {
        ASSERT_TRUE(agg.Begin(sched::MakeKey(7, 1), perm, 5, d, bytes).ok());
        for (uint32_t r : order) {
          EXPECT_FALSE(agg.complete());
          ASSERT_TRUE(agg.Contribute(r, perm, in[r]).ok());
        }
        ASSERT_TRUE(agg.complete());
        std::vector<std::byte> out(bytes);
        ASSERT_TRUE(agg.Reduce(op, absl::MakeSpan(out)).ok());
        ASSERT_EQ(out, ref) << "permutation " << perm;
        std::next_permutation(order.begin(), order.end());
      }
    }
  }
}

TEST(AggregatorTest, MeanIsF32SumDividedByWorldSize) {
  const std::vector<std::vector<float>> ranks = {
      {1, -2, 0.1f, 1e30f}, {2, 2, 0.2f, 1e30f}, {3, 5, 0.3f, 1e30f}, {4, 8, 0.4f, 1e30f}};
  std::vector<std::vector<std::byte>> in;
  for (const auto& v : ranks) {
    in.emplace_back(v.size() * 4);
    std::memcpy(in.back().data(), v.data(), v.size() * 4);
  }
  std::vector<float> out(4);
  auto p = Pointers(in);
  ASSERT_TRUE(ReduceInRankOrder(DType::kF32, p, 16, ReduceOp::kMean,
                                reinterpret_cast<std::byte*>(out.data()))
                  .ok());
  EXPECT_EQ(out[0], 2.5f);
  EXPECT_EQ(out[1], 3.25f);
  EXPECT_EQ(out[2], (((0.1f + 0.2f) + 0.3f) + 0.4f) / 4.0f);
  EXPECT_EQ(out[3], 1e30f);  // f32 sum 4e30 does not overflow; mean is exact here
  // f16: mean of 1, 2, 2 = 5/3, rounded once from the f32 quotient.
  std::vector<std::vector<std::byte>> h(3, std::vector<std::byte>(2));
  const uint16_t one = 0x3c00, two = 0x4000;
  std::memcpy(h[0].data(), &one, 2);
  std::memcpy(h[1].data(), &two, 2);
  std::memcpy(h[2].data(), &two, 2);
  uint16_t mean = 0;
  auto hp = Pointers(h);
  ASSERT_TRUE(
      ReduceInRankOrder(DType::kF16, hp, 2, ReduceOp::kMean, reinterpret_cast<std::byte*>(&mean))
          .ok());
  EXPECT_EQ(mean, RefF32ToF16(5.0f / 3.0f));
  EXPECT_NEAR(RefF16ToF32(mean), 5.0 / 3.0, 1e-3);
}

TEST(AggregatorTest, SpecialValuesFollowIeee) {
  // f16 (bits): 60000 + 60000 overflows f16 but not f32 -> +inf after rounding back;
  // smallest subnormals add exactly; NaN propagates; +inf + -inf = NaN; the f16 sum of the
  // largest finite values divided by 2 (mean) comes back finite because the sum stays in f32.
  const uint16_t a[] = {0x7b53, 0x0001, 0x7e00, 0x7c00, 0x7bff};
  const uint16_t b[] = {0x7b53, 0x0001, 0x3c00, 0xfc00, 0x7bff};
  std::vector<std::vector<std::byte>> in(2, std::vector<std::byte>(sizeof(a)));
  std::memcpy(in[0].data(), a, sizeof(a));
  std::memcpy(in[1].data(), b, sizeof(b));
  auto p = Pointers(in);
  for (KernelIsa isa : AvailableIsas()) {
    uint16_t sum[5], mean[5];
    ASSERT_TRUE(ReduceInRankOrder(DType::kF16, p, sizeof(a), ReduceOp::kSum,
                                  reinterpret_cast<std::byte*>(sum), isa)
                    .ok());
    ASSERT_TRUE(ReduceInRankOrder(DType::kF16, p, sizeof(a), ReduceOp::kMean,
                                  reinterpret_cast<std::byte*>(mean), isa)
                    .ok());
    EXPECT_EQ(sum[0], 0x7c00u);
    EXPECT_EQ(sum[1], 0x0002u);
    EXPECT_EQ(sum[2], 0x7e00u);  // NaN: always the canonical quiet NaN
    EXPECT_EQ(sum[3], 0x7e00u);  // x86 makes inf - inf the *negative* default NaN; canonicalised
    EXPECT_EQ(mean[2], 0x7e00u);
    EXPECT_EQ(sum[4], 0x7c00u);
    EXPECT_EQ(mean[0], 0x7b53u);
    EXPECT_EQ(mean[1], 0x0001u);
    EXPECT_EQ(mean[4], 0x7bffu);
  }
}

// Hardware propagates one operand's NaN payload, so without canonicalisation rank order vs
// operand order would leak into the bits. Different payloads and signs per rank, every length
// position (vector body and tail), every kernel: always 0x7fc00000.
TEST(AggregatorTest, NaNResultsAreCanonicalWhateverThePayloads) {
  const uint32_t payloads[] = {0x7fc00001u, 0xffc12345u, 0x7f800001u /* signalling */};
  for (KernelIsa isa : AvailableIsas()) {
    for (int rot = 0; rot < 3; ++rot) {
      std::vector<std::vector<std::byte>> in(3, std::vector<std::byte>(19 * 4));
      for (int r = 0; r < 3; ++r) {
        for (int i = 0; i < 19; ++i) {
          const float v = std::bit_cast<float>(payloads[(r + rot) % 3]);
          std::memcpy(in[r].data() + 4 * i, &v, 4);
        }
      }
      std::vector<uint32_t> out(19);
      auto p = Pointers(in);
      ASSERT_TRUE(ReduceInRankOrder(DType::kF32, p, 19 * 4, ReduceOp::kSum,
                                    reinterpret_cast<std::byte*>(out.data()), isa)
                      .ok());
      for (uint32_t bits : out) EXPECT_EQ(bits, 0x7fc00000u) << KernelIsaName(isa);
    }
  }
}

TEST(AggregatorTest, BothKernelsAgreeBitForBit) {
  if (!KernelIsaAvailable(KernelIsa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(3);
  for (DType d : kDTypes) {
    std::vector<std::vector<std::byte>> in;
    for (int r = 0; r < 9; ++r) in.push_back(RandomBuffer(rng, d, 100'003));
    auto p = Pointers(in);
    std::vector<std::byte> x(in[0].size()), y(in[0].size());
    ASSERT_TRUE(
        ReduceInRankOrder(d, p, x.size(), ReduceOp::kMean, x.data(), KernelIsa::kBaseline).ok());
    ASSERT_TRUE(
        ReduceInRankOrder(d, p, y.size(), ReduceOp::kMean, y.data(), KernelIsa::kAvx2).ok());
    EXPECT_EQ(x, y) << sched::DTypeName(d);
  }
}

TEST(AggregatorTest, ReduceInRankOrderRejectsBadArguments) {
  std::vector<std::byte> buf(8);
  const std::byte* one[] = {buf.data()};
  EXPECT_FALSE(ReduceInRankOrder(DType::kF32, {}, 8, ReduceOp::kSum, buf.data()).ok());
  EXPECT_FALSE(ReduceInRankOrder(DType::kF32, one, 6, ReduceOp::kSum, buf.data()).ok());
  EXPECT_FALSE(ReduceInRankOrder(DType::kF16, one, 3, ReduceOp::kSum, buf.data()).ok());
  EXPECT_FALSE(ReduceInRankOrder(DType::kF32, one, 8, ReduceOp::kSum, nullptr).ok());
  const std::byte* null_in[] = {nullptr};
  EXPECT_FALSE(ReduceInRankOrder(DType::kF32, null_in, 8, ReduceOp::kSum, buf.data()).ok());
  std::vector<const std::byte*> too_many(65, buf.data());
  EXPECT_FALSE(ReduceInRankOrder(DType::kF32, too_many, 8, ReduceOp::kSum, buf.data()).ok());
  std::vector<const std::byte*> max(64, buf.data());
  EXPECT_TRUE(ReduceInRankOrder(DType::kF32, max, 8, ReduceOp::kSum, buf.data()).ok());
}

// ---------------------------------------------------------------------------------------------
// Per-key state.

TEST(KeyAggregationTest, DuplicateAndWrongLengthAreRejectedCountedAndNotSummed) {
  const size_t bytes = 40;
  std::vector<std::vector<std::byte>> in(3, std::vector<std::byte>(bytes));
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 10; ++i) {
      const float v = static_cast<float>(r + 1);
      std::memcpy(in[r].data() + 4 * i, &v, 4);
    }
  }
  std::vector<std::byte> other(bytes);
  const float hundred = 100.0f;
  for (int i = 0; i < 10; ++i) std::memcpy(other.data() + 4 * i, &hundred, 4);

  KeyAggregation agg;
  ASSERT_TRUE(agg.Begin(sched::MakeKey(1, 0), 5, 3, DType::kF32, bytes).ok());
  ASSERT_TRUE(agg.Contribute(1, 5, in[1]).ok());
  absl::Status dup = agg.Contribute(1, 5, other);
  EXPECT_TRUE(absl::IsAlreadyExists(dup)) << dup;
  EXPECT_EQ(agg.duplicate_count(), 1u);
  absl::Status shortlen = agg.Contribute(0, 5, absl::MakeConstSpan(in[0]).subspan(0, 36));
  EXPECT_TRUE(absl::IsInvalidArgument(shortlen)) << shortlen;
  std::vector<std::byte> longer(44);
  EXPECT_TRUE(absl::IsInvalidArgument(agg.Contribute(0, 5, longer)));
  EXPECT_EQ(agg.wrong_length_count(), 2u);
  EXPECT_TRUE(absl::IsOutOfRange(agg.Contribute(3, 5, in[0])));
  EXPECT_TRUE(absl::IsFailedPrecondition(agg.Contribute(0, 4, in[0])));  // stale iteration
  EXPECT_EQ(agg.contributed_mask(), 0b010u);
  EXPECT_EQ(agg.missing(), 2u);
  std::vector<std::byte> out(bytes);
  EXPECT_TRUE(absl::IsFailedPrecondition(agg.Reduce(ReduceOp::kSum, absl::MakeSpan(out))));
  ASSERT_TRUE(agg.Contribute(2, 5, in[2]).ok());
  ASSERT_TRUE(agg.Contribute(0, 5, in[0]).ok());
  ASSERT_TRUE(agg.complete());
  EXPECT_TRUE(absl::IsInvalidArgument(agg.Reduce(ReduceOp::kSum, absl::MakeSpan(out).subspan(4))));
  ASSERT_TRUE(agg.Reduce(ReduceOp::kSum, absl::MakeSpan(out)).ok());
  for (int i = 0; i < 10; ++i) {
    float v;
    std::memcpy(&v, out.data() + 4 * i, 4);
    EXPECT_EQ(v, 6.0f);  // 1 + 2 + 3: the duplicate's 100 was not added
  }
  EXPECT_EQ(agg.rejected_count(), 5u);
  // The round is over: no late contribution and no second reduce (its buffers may be gone).
  EXPECT_FALSE(agg.complete());
  EXPECT_TRUE(absl::IsFailedPrecondition(agg.Contribute(0, 5, in[0])));
  EXPECT_TRUE(absl::IsFailedPrecondition(agg.Reduce(ReduceOp::kSum, absl::MakeSpan(out))));
  EXPECT_EQ(agg.rejected_count(), 6u);
  // Counters survive the next round.
  ASSERT_TRUE(agg.Begin(sched::MakeKey(1, 0), 6, 3, DType::kF32, bytes).ok());
  EXPECT_EQ(agg.contributed_mask(), 0u);
  EXPECT_EQ(agg.duplicate_count(), 1u);
}

TEST(KeyAggregationTest, BeginValidatesWorldSizeAndLength) {
  KeyAggregation agg;
  EXPECT_TRUE(absl::IsFailedPrecondition(agg.Contribute(0, 0, {})));  // never begun
  EXPECT_FALSE(agg.Begin(1, 0, 0, DType::kF32, 4).ok());
  EXPECT_FALSE(agg.Begin(1, 0, 65, DType::kF32, 4).ok());
  EXPECT_FALSE(agg.Begin(1, 0, 2, DType::kF32, 0).ok());
  EXPECT_FALSE(agg.Begin(1, 0, 2, DType::kF32, 6).ok());
  EXPECT_FALSE(agg.Begin(1, 0, 2, DType::kBF16, 3).ok());
  EXPECT_TRUE(agg.Begin(1, 0, 2, DType::kBF16, 2).ok());
}

TEST(KeyAggregationTest, SixtyFourRanksUseTheWholeMask) {
  std::mt19937_64 rng(64);
  std::vector<std::vector<std::byte>> in;
  for (int r = 0; r < 64; ++r) in.push_back(RandomBuffer(rng, DType::kBF16, 50));
  const auto ref = ReferenceReduce(DType::kBF16, in, ReduceOp::kMean);
  std::vector<uint32_t> order(64);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  KeyAggregation agg;
  ASSERT_TRUE(agg.Begin(9, 1, 64, DType::kBF16, 100).ok());
  for (uint32_t r : order) ASSERT_TRUE(agg.Contribute(r, 1, in[r]).ok());
  EXPECT_EQ(agg.contributed_mask(), ~uint64_t{0});
  EXPECT_EQ(agg.missing(), 0u);
  std::vector<std::byte> out(100);
  ASSERT_TRUE(agg.Reduce(ReduceOp::kMean, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, ref);
}

}  // namespace
}  // namespace gradlane::ps
