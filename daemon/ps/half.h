// daemon/ps/half.h — scalar conversions between f32 and the two 16-bit gradient formats
// (IEEE binary16 "f16" and bfloat16 "bf16"), written with bit operations only.
//
// Why our own: the aggregator must produce bit-identical results on every host whatever its
// CPU, so it cannot depend on whether F16C is present or on libgcc's soft-float routines. The
// vectorised kernels in aggregator.cc run exactly these algorithms lane by lane; these scalar
// forms are used for the tails and are what the tests check exhaustively.
//
// Guarantees:
//  - Widening (F16ToF32, Bf16ToF32) is exact for every finite value, infinity and subnormal.
//    NaNs stay NaNs with their payload's top bits kept and the quiet bit set (what F16C does).
//  - Narrowing (F32ToF16, F32ToBf16) rounds to nearest, ties to even, once. Values that round
//    past the largest finite value become infinity of the same sign; results below the
//    smallest subnormal round to (signed) zero or the smallest subnormal as RNE says. NaNs map
//    to a quiet NaN of the same sign keeping the payload's top bits.
//  - The round trip f16 -> f32 -> f16 (and bf16 -> f32 -> bf16) is the identity for every
//    non-NaN pattern.
//  - The f32 -> f16 subnormal path uses one f32 addition; it assumes the default floating-point
//    environment (round-to-nearest, no flush-to-zero/denormals-are-zero), as the whole
//    aggregator does.
// Pure functions, no state: safe from any thread.
#ifndef GRADLANE_DAEMON_PS_HALF_H_
#define GRADLANE_DAEMON_PS_HALF_H_

#include <bit>
#include <cstdint>

namespace gradlane::ps {

inline float F16ToF32(uint16_t h) {
  // Shift exponent+mantissa into f32 position and rebias (15 -> 127). Inf/NaN need the exponent
  // pushed further to all ones; subnormals are renormalised by one exact f32 subtraction
  // (2^-14 * 0.mantissa == (2^-14 * 1.mantissa) - 2^-14), which avoids a count-leading-zeros loop
  // and so vectorises.
  constexpr uint32_t kExpMask = 0x7c00u << 13;
  constexpr float kMagic = std::bit_cast<float>(113u << 23);  // 2^-14
  uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = o & kExpMask;
  o += (127u - 15u) << 23;
  if (exp == kExpMask) {
    o += (128u - 16u) << 23;
    if (o & 0x007fffffu) o |= 0x00400000u;  // NaN: quiet it
  } else if (exp == 0) {
    o += 1u << 23;
    o = std::bit_cast<uint32_t>(std::bit_cast<float>(o) - kMagic);
  }
  o |= static_cast<uint32_t>(h & 0x8000u) << 16;
  return std::bit_cast<float>(o);
}

inline uint16_t F32ToF16(float value) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: at or above, always infinity
  constexpr uint32_t kDenormMagicBits = 126u
                                        << 23;  // 0.5f: its ulp is 2^-24, the f16 subnormal step
  uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint32_t o;
  if (f >= kF16Overflow) {
    // NaN keeps the top of its payload and is quieted; everything else is infinity.
    o = f > kF32Inf ? (0x7e00u | ((f >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (f < (113u << 23)) {
    // Result is an f16 subnormal or zero: adding the magic constant makes the FPU do the RNE
    // shift for us (its ulp is exactly the f16 subnormal step), then we strip the constant.
    const float r = std::bit_cast<float>(f) + std::bit_cast<float>(kDenormMagicBits);
    o = std::bit_cast<uint32_t>(r) - kDenormMagicBits;
  } else {
    // Normal: rebias and round the 13 dropped bits to nearest even. A carry out of the mantissa
    // correctly bumps the exponent, up to and including infinity (65520 -> inf).
    const uint32_t mant_odd = (f >> 13) & 1u;
    f += ((15u - 127u) << 23) + 0xfffu + mant_odd;
    o = f >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

inline float Bf16ToF32(uint16_t h) {
  uint32_t o = static_cast<uint32_t>(h) << 16;
  if ((o & 0x7f800000u) == 0x7f800000u && (o & 0x007fffffu)) o |= 0x00400000u;
  return std::bit_cast<float>(o);
}

inline uint16_t F32ToBf16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x0040u);
  // Overflow needs no special case: rounding the largest bf16 up carries into the infinity
  // pattern, exactly as RNE requires.
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

}  // namespace gradlane::ps

#endif  // GRADLANE_DAEMON_PS_HALF_H_
