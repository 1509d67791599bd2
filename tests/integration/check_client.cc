// tests/integration/check_client.cc — gradlane-check: a training-like client that proves the
// daemons' reduction is bit-exact.
//
// What it does, per rank (one process per rank, each talking to its own host's daemon):
//  * registers tensors of every requested dtype (f32, f16, bf16) with awkward element counts —
//    1 element, counts that are not a multiple of any vector width, one element past a P3
//    partition (50,000 elements) and past a 4 MiB ByteScheduler/Prophet partition, optionally a
//    big one (--big_mb);
//  * for each iteration fills its gradient with values that are a pure function of
//    (seed, rank, iteration, tensor, element), so it can compute every other rank's
//    contribution locally; the values include subnormals, signed zeros, infinities, NaNs and
//    magnitudes far apart (so the order of the additions shows in the result);
//  * posts every tensor in reverse registration order (as backward produces gradients), some
//    whole, some as 2–4 byte ranges cut at random element boundaries and next to partition
//    boundaries, ranges in random order, some with GL_WHOLE_TENSOR from an offset;
//  * checks each completed range bit for bit against the reference the daemon must produce:
//      f32:      acc = x_0; acc += x_1; ... acc += x_{W-1}   (f32, rank order)
//      f16/bf16: the same in f32 on the exactly widened values, then one round to nearest-even
//      mean:     the f32 sum divided by W in f32, then rounded as above
//      --mode=allreduce: the ring's order (daemon/ring_role.h): an element in chunk c of its
//                partition (--ring_partition_bytes, the daemons' partition size) is summed
//                x_c, x_{c+1}, ..., x_{c+W-1}, every partial sum rounded to the dtype, the mean
//                dividing the last one
//      --values=integer: small whole numbers, whose sums are exact in any order (for fused
//                all-reduce, whose bucket layout the daemons decide)
//      a NaN result is the canonical quiet NaN (f32 0x7fc00000, f16 0x7e00, bf16 0x7fc0)
//    The 16-bit conversions are written here independently of the daemon's (daemon/ps/half.h).
//
// Exit status: 0 only if every completion was GL_OK and every byte matched (or, with
// --expect_failure, if a failure was reported before the run ended and every byte that was
// reported OK matched); 1 on any mismatch, error or timeout; 2 on bad flags. Every wait is
// bounded by --timeout_ms. A one-line summary goes to stdout.
//
// Failure-injection hooks for the integration tests:
//  --stall_at=K      at iteration K post only the first half of the ranges, print
//                    "gradlane-check: rank R stalled at iteration K" and sleep (to be killed)
//  --expect_failure  success means: an error completion, a refused registration or a
//                    disconnect arrived (within the timeout), and no OK range was wrong
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libclient/cuda_driver.h"
#include "libclient/gradlane.h"
#include "tests/integration/client_flags.h"

namespace {

using gradlane::testing::Flags;
using gradlane::testing::JobFlags;

// ------------------------------------------------------------------ reference conversions ---

float BitsToF32(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t F32Bits(float f) { return std::bit_cast<uint32_t>(f); }

// IEEE binary16 -> binary32, exact (subnormals renormalised by a shift loop).
float HalfToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsToF32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
  if (exp == 0) {
    if (man == 0) return BitsToF32(sign);
    // value = man * 2^-24; normalise.
    int e = -14;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --e;
    }
    man &= 0x3ffu;
    return BitsToF32(sign | (static_cast<uint32_t>(e + 127) << 23) | (man << 13));
  }
  return BitsToF32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

// HalfToF32 of every binary16 pattern, for the fill's inner loop (Widen): a table read instead of
// a call with branches.
const std::array<float, 65536> kHalfToF32 = [] {
  std::array<float, 65536> table{};
  for (uint32_t h = 0; h < table.size(); ++h) table[h] = HalfToF32(static_cast<uint16_t>(h));
  return table;
}();

// Shifts `v` right by `s` (s >= 1) rounding to nearest, ties to even.
uint64_t ShiftRoundEven(uint64_t v, unsigned s) {
  if (s >= 64) return 0;  // callers never shift a non-zero value this far and expect 1
  const uint64_t q = v >> s;
  const uint64_t rem = v & ((uint64_t{1} << s) - 1);
  const uint64_t half = uint64_t{1} << (s - 1);
  if (rem > half || (rem == half && (q & 1))) return q + 1;
  return q;
}

// binary32 -> binary16, round to nearest even, once. NaN -> canonical (callers canonicalise).
uint16_t F32ToHalf(float f) {
  const uint32_t b = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t exp = (b >> 23) & 0xffu;
  const uint32_t man = b & 0x7fffffu;
  if (exp == 0xff) return man ? 0x7e00 : static_cast<uint16_t>(sign | 0x7c00u);
  if (exp == 0) return sign;  // f32 subnormals are < 2^-126, far below half of 2^-24
  const int e = static_cast<int>(exp) - 127;  // unbiased
  const uint64_t sig = man | 0x800000u;       // 24 bits, value = sig * 2^(e-23)
  if (e >= 16) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e >= -14) {
    // Normal range: keep 11 bits of significand.
    uint64_t r = ShiftRoundEven(sig, 13);  // 11 or 12 bits
    int he = e + 15;
    if (r == 0x800) {  // rounded up to the next binade
      r = 0x400;
      ++he;
    }
    if (he >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | (static_cast<uint32_t>(he) << 10) | (r & 0x3ffu));
  }
  // Subnormal range: value / 2^-24 = sig * 2^(e - 23 + 24) = sig >> (-1 - e).
  const int shift = -1 - e;     // e <= -15 -> shift >= 14
  if (shift > 25) return sign;  // < 2^-25 * ... : below half the smallest subnormal
  const uint64_t r = ShiftRoundEven(sig, static_cast<unsigned>(shift));
  // r may be 0x400: that is exactly the smallest normal, which the encoding gives for free.
  return static_cast<uint16_t>(sign | r);
}

float Bf16ToF32(uint16_t h) { return BitsToF32(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToBf16(float f) {
  const uint32_t b = F32Bits(f);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) return 0x7fc0;
  const uint64_t r = ShiftRoundEven(b & 0x7fffffffu, 16);  // may carry into inf: correct
  return static_cast<uint16_t>(((b >> 16) & 0x8000u) | r);
}

// Checks the conversions on the cases that are easy to get wrong; aborts the run if wrong.
bool SelfTestConversions(bool thorough) {
  struct Case {
    float in;
    uint16_t half;
    uint16_t bf;
  };
  const Case cases[] = {
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {1.0f, 0x3c00, 0x3f80},
      {65504.0f, 0x7bff, 0x4780},
      {65520.0f, 0x7c00, 0x4780},  // ties to even rounds up to inf in f16
      {65519.996f, 0x7bff, 0x4780},
      {5.960464477539063e-08f, 0x0001, 0x3380},    // 2^-24, smallest f16 subnormal
      {2.98023223876953125e-08f, 0x0000, 0x3300},  // 2^-25: tie -> even (0)
      {4.4703483581542969e-08f, 0x0001, 0x3340},   // 1.5 * 2^-25 -> 1 subnormal
      {8.940696716308594e-08f, 0x0002, 0x33c0},    // 1.5 * 2^-24: tie -> even (2)
      {6.097555160522461e-05f, 0x03ff, 0x3880},    // largest f16 subnormal
      {1.0009765625f, 0x3c01, 0x3f80},
      {1.00048828125f, 0x3c00, 0x3f80},  // tie -> even
      {1.00146484375f, 0x3c02, 0x3f80},  // tie -> even (up)
  };
  for (const Case& c : cases) {
    if (F32ToHalf(c.in) != c.half || F32ToBf16(c.in) != c.bf) {
      std::fprintf(stderr,
                   "self-test: conversion of %a: half %04x (want %04x) bf16 %04x (want %04x)\n",
                   static_cast<double>(c.in), F32ToHalf(c.in), c.half, F32ToBf16(c.in), c.bf);
      return false;
    }
  }
  // Round trip of every non-NaN half.
  for (uint32_t h = 0; thorough && h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
    if (F32ToHalf(HalfToF32(static_cast<uint16_t>(h))) != h) {
      std::fprintf(stderr, "self-test: half %04x does not round-trip\n", h);
      return false;
    }
  }
#if defined(__FLT16_MAX__)
  // And against the compiler's own binary16 conversion (libgcc / F16C), on 2^24 f32 patterns
  // spread over every exponent.
  for (uint32_t i = 0; thorough && i < (1u << 24); ++i) {
    const uint32_t b = i * 0x9E3779B1u;
    const float f = BitsToF32(b);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    const uint16_t want = std::bit_cast<uint16_t>(h);
    if (F32ToHalf(f) != want) {
      std::fprintf(stderr, "self-test: f32 %08x -> half %04x, compiler says %04x\n", b,
                   F32ToHalf(f), want);
      return false;
    }
  }
#endif
  return true;
}

// ------------------------------------------------------------------ deterministic data -----

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t Hash(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0, uint64_t e = 0) {
  return Mix(Mix(Mix(Mix(Mix(a) ^ b) ^ c) ^ d) ^ e);
}

constexpr uint64_t kNoRank = 0xffffffffull;

// A number in [0, n) from the high 32 bits of r (multiply-shift: no division).
inline uint32_t Below(uint64_t r, uint32_t n) {
  return static_cast<uint32_t>(((r >> 32) * n) >> 32);
}

// Whether element i is a "special column" (1 in 512, the same for every rank).
inline bool SpecialColumn(uint64_t col_base, uint64_t i) {
  return ((col_base + i * 0x9E3779B97F4A7C15ull) >> 55) == 0;
}

// Element `i` of rank `r`'s contribution, as raw bits of the dtype, from the random word `r`.
// `special` marks a "special column" (the same elements for every rank, see SpecialColumn): there
// every rank draws from {±0, ±inf, NaN, extreme values}, so signed-zero and inf/NaN sums occur.
inline uint32_t ElementBits(gl_dtype dt, uint64_t r, bool special) {
  const uint32_t sign = static_cast<uint32_t>(r >> 63);
  const uint32_t pick = static_cast<uint32_t>((r >> 40) & 7u);
  switch (dt) {
    case GL_DTYPE_F32: {
      if (special) {
        const uint32_t s[8] = {0x00000000u, 0x80000000u,
                               0x80000000u, 0x7f800000u,
                               0xff800000u, 0x7fa00001u | (static_cast<uint32_t>(r) & 0xffffu),
                               0x00000001u, 0x7f7fffffu};
        return s[pick];
      }
      if ((r & 0xff) == 1) return (sign << 31) | (static_cast<uint32_t>(r >> 8) & 0x7fffffu);
      const uint32_t exp = 127u + static_cast<uint32_t>(Below(r, 49)) - 24u;
      return (sign << 31) | (exp << 23) | (static_cast<uint32_t>(r) & 0x7fffffu);
    }
    case GL_DTYPE_F16: {
      if (special) {
        const uint32_t s[8] = {0x0000, 0x8000, 0x8000,
                               0x7c00, 0xfc00, 0x7d00u | (static_cast<uint32_t>(r) & 0xffu),
                               0x0001, 0x7bff};
        return s[pick];
      }
      if ((r & 0x3f) == 1) return (sign << 15) | (static_cast<uint32_t>(r >> 8) & 0x3ffu);
      const uint32_t exp = 1u + static_cast<uint32_t>(Below(r, 30));  // 1..30: all normals
      return (sign << 15) | (exp << 10) | (static_cast<uint32_t>(r) & 0x3ffu);
    }
    case GL_DTYPE_BF16: {
      if (special) {
        const uint32_t s[8] = {0x0000, 0x8000, 0x8000,
                               0x7f80, 0xff80, 0x7f81u | (static_cast<uint32_t>(r) & 0x3fu),
                               0x0001, 0x7f7f};
        return s[pick];
      }
      const uint32_t exp = 127u + static_cast<uint32_t>(Below(r, 61)) - 30u;
      return (sign << 15) | (exp << 7) | (static_cast<uint32_t>(r) & 0x7fu);
    }
  }
  return 0;
}

inline float Widen(gl_dtype dt, uint32_t bits) {
  switch (dt) {
    case GL_DTYPE_F32:
      return BitsToF32(bits);
    case GL_DTYPE_F16:
      return kHalfToF32[bits & 0xffffu];
    case GL_DTYPE_BF16:
      return Bf16ToF32(static_cast<uint16_t>(bits));
  }
  return 0;
}

inline uint32_t Narrow(gl_dtype dt, float f) {
  if (std::isnan(f)) {
    return dt == GL_DTYPE_F32 ? 0x7fc00000u : dt == GL_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  }
  switch (dt) {
    case GL_DTYPE_F32:
      return F32Bits(f);
    case GL_DTYPE_F16:
      return F32ToHalf(f);
    case GL_DTYPE_BF16:
      return F32ToBf16(f);
  }
  return 0;
}

// --values=integer: small whole numbers instead of ElementBits' values, so that every order of
// the additions gives the same exact sum (an all-reduce job whose fusion the checker cannot
// know); specials stay off.
bool g_integer_values = false;
inline uint32_t ContributionBits(gl_dtype dt, uint64_t r, bool special) {
  if (g_integer_values) return Narrow(dt, static_cast<float>(static_cast<int>(r % 17) - 8));
  return ElementBits(dt, r, special);
}

uint64_t ElemBytes(gl_dtype dt) { return dt == GL_DTYPE_F32 ? 4 : 2; }
const char* DtypeName(gl_dtype dt) {
  return dt == GL_DTYPE_F32 ? "f32" : dt == GL_DTYPE_F16 ? "f16" : "bf16";
}

inline void StoreBits(std::byte* p, gl_dtype dt, uint64_t i, uint32_t bits) {
  if (dt == GL_DTYPE_F32) {
    std::memcpy(p + 4 * i, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(p + 2 * i, &h, 2);
  }
}
uint32_t LoadBits(const std::byte* p, gl_dtype dt, uint64_t i) {
  if (dt == GL_DTYPE_F32) {
    uint32_t b;
    std::memcpy(&b, p + 4 * i, 4);
    return b;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return h;
}

// ------------------------------------------------------------------ the run ----------------

struct CheckTensor {
  std::string name;
  gl_dtype dtype = GL_DTYPE_F32;
  uint64_t elems = 0;
  uint64_t bytes = 0;
  uint32_t id = 0;
  std::byte* buf = nullptr;         // in the shared arena (--device=cuda: host_copy)
  std::vector<std::byte> expected;  // this iteration's reference result
  // --device=cuda: the tensor lives in GPU memory; buf is this host copy of it, written to the
  // device before posting and read back from it when a range completes.
  gradlane::client::cu::DevicePtr device = 0;
  std::vector<std::byte> host_copy;
};

struct PendingPost {
  size_t tensor = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // resolved (never GL_WHOLE_TENSOR)
  bool whole_marker = false;
  bool done = false;
};

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct Options {
  JobFlags job;
  int64_t iterations = 50;
  uint64_t seed = 1;
  std::vector<gl_dtype> dtypes;
  std::vector<uint64_t> sizes;  // element counts; empty = defaults per dtype
  uint64_t big_mb = 0;
  bool mean = false;
  uint64_t ring_partition_bytes = 0;  // all-reduce: the partition size the daemons cut at
  int64_t stall_at = -1;
  bool expect_failure = false;
  bool quiet = false;
  int64_t linger_ms = 0;
  std::string progress_file;  // rewritten as completions arrive, for the harness to watch
  bool device = false;        // --device=cuda: tensors in GPU memory
};

// The slowest rate at which a loaded 2-core test machine still moves a big outstanding post:
// the no-progress bound grows by the time such a post needs at this rate, so one 300 MiB
// completion is not mistaken for a hang.
constexpr int64_t kSlowestBytesPerSecond = int64_t{4} << 20;

void Usage() {
  std::fprintf(stderr,
               "usage: gradlane-check --socket=PATH --job=ID --rank=R --world=W\n"
               "         [--peers=h:p,h:p,...] [--policy=NAME] [--token=T] [--iterations=50]\n"
               "         [--seed=S] [--sizes=N,N,...(elements)] [--dtypes=f32,f16,bf16]\n"
               "         [--big_mb=M] [--reduce=sum|mean] [--timeout_ms=30000]\n"
               "         [--mode=ps|allreduce --ring_partition_bytes=B] [--values=random|integer]\n"
               "         [--stall_at=K] [--expect_failure] [--quiet] [--progress_file=PATH]\n"
               "         [--device=host|cuda]   (cuda: tensors in GPU memory, GPU 0)\n"
               "       gradlane-check --probe_device   (exit 0: GPU 0 usable; 77: why not)\n");
}

class Checker {
 public:
  explicit Checker(Options o) : o_(std::move(o)) {}
  ~Checker() { FreeDevice(); }

  int Run();

 private:
  void BuildTensorList();
  uint64_t Fill(size_t t, int64_t iter);  // writes own contribution + reference; returns elems
  void PlanPosts(size_t t, int64_t iter, std::vector<PendingPost>* out) const;
  // Returns 0 ok, 1 failure (message printed); sets observed_failure_ on an error completion.
  int Verify(const gl_completion& c, std::vector<PendingPost>& posts);
  int Fail(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  int Observed(const std::string& what);
  // Rewrites --progress_file (at most every 200 ms, and always when `force`).
  void ReportProgress(bool force);

  // --device=cuda: the driver, GPU 0's primary context made current, device memory per tensor.
  int SetUpDevice();
  void FreeDevice();

  Options o_;
  const gradlane::client::CudaDriver* cuda_ = nullptr;
  gradlane::client::cu::Device cuda_device_{};
  bool cuda_context_retained_ = false;
  std::FILE* progress_ = nullptr;
  int64_t progress_written_ns_ = 0;
  gl_client* client_ = nullptr;
  std::vector<CheckTensor> tensors_;
  int64_t iter_ = 0;
  uint64_t posts_ = 0, completions_ = 0, checked_bytes_ = 0;
  bool observed_failure_ = false;
  int64_t fill_ns_ = 0;  // time spent generating data and references (not the daemons')
};

int Checker::Fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "gradlane-check: rank %u: ", o_.job.rank);
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::printf("gradlane-check: FAIL job=%s rank=%u policy=%s iteration=%" PRId64 " posts=%" PRIu64
              " completions=%" PRIu64 "\n",
              o_.job.job.c_str(), o_.job.rank, o_.job.policy.c_str(), iter_, posts_, completions_);
  std::fflush(stdout);
  return 1;
}

int Checker::Observed(const std::string& what) {
  observed_failure_ = true;
  if (!o_.expect_failure) return Fail("%s", what.c_str());
  std::printf("gradlane-check: EXPECTED-FAILURE job=%s rank=%u iteration=%" PRId64
              " completions=%" PRIu64 ": %s\n",
              o_.job.job.c_str(), o_.job.rank, iter_, completions_, what.c_str());
  std::fflush(stdout);
  return 0;
}

void Checker::BuildTensorList() {
  int idx = 0;
  for (gl_dtype dt : o_.dtypes) {
    std::vector<uint64_t> sizes = o_.sizes;
    const uint64_t eb = ElemBytes(dt);
    if (sizes.empty()) {
      // 1 element; odd counts that are no multiple of 4/8/16/32 lanes; one element past a P3
      // partition (50,000 elements); one element past a 4 MiB partition (bytescheduler,
      // prophet default); a mid-size odd count.
      sizes = {1, 3, 1023, 50001, 123457, (uint64_t{4} << 20) / eb + 1};
    }
    if (o_.big_mb > 0) sizes.push_back((o_.big_mb << 20) / eb + 1);
    for (uint64_t n : sizes) {
      CheckTensor t;
      t.dtype = dt;
      t.elems = n;
      t.bytes = n * eb;
      t.name = "t" + std::to_string(idx++) + "_" + DtypeName(dt) + "_" + std::to_string(n);
      tensors_.push_back(std::move(t));
    }
  }
}

// The per-element work, instantiated per dtype so the dtype switches fold away.
// `ring_part_elems` 0: rank order; else the ring's order within partitions of that many elements.
template <gl_dtype DT>
void FillT(std::byte* own, std::byte* expected, uint64_t elems, const uint64_t* base, uint32_t W,
           uint32_t rank, uint64_t col_base, bool mean, uint64_t ring_part_elems) {
  const float wf = static_cast<float>(W);
  for (uint64_t i = 0; i < elems; ++i) {
    const bool special = SpecialColumn(col_base, i);
    uint32_t first = 0;
    if (ring_part_elems > 0) {
      // Chunk c of a partition of n elements is [c·n/W, (c+1)·n/W): the first c whose end lies
      // past element e is ceil((e+1)·W/n) - 1.
      const uint64_t k = i / ring_part_elems;
      const uint64_t n = std::min(ring_part_elems, elems - k * ring_part_elems);
      const uint64_t e = i - k * ring_part_elems;
      first = static_cast<uint32_t>(((e + 1) * W + n - 1) / n - 1);
    }
    float acc = 0;
    // The rank of the j-th addend is (first + j) mod W, stepped rather than divided: a division
    // per addend was a third of an f32 fill (ps_exact_big fills ~1 GB a rank per iteration).
    uint32_t r = first;
    for (uint32_t j = 0; j < W; ++j, r = r + 1 == W ? 0 : r + 1) {
      const uint32_t bits = ContributionBits(DT, Mix(base[r] + i), special);
      if (r == rank) StoreBits(own, DT, i, bits);
      const float v = Widen(DT, bits);
      acc = j == 0 ? v : acc + v;
      // A ring's partial sum travels in the dtype: rounded after every addition but the last.
      if (ring_part_elems > 0 && j > 0 && j + 1 < W) acc = Widen(DT, Narrow(DT, acc));
    }
    if (mean) acc = acc / wf;
    StoreBits(expected, DT, i, Narrow(DT, acc));
  }
}

uint64_t Checker::Fill(size_t ti, int64_t iter) {
  CheckTensor& t = tensors_[ti];
  const uint32_t W = o_.job.world;
  const uint64_t col_base = Hash(o_.seed, kNoRank, static_cast<uint64_t>(iter), ti);
  std::vector<uint64_t> base(W);
  for (uint32_t r = 0; r < W; ++r) base[r] = Hash(o_.seed, r, static_cast<uint64_t>(iter), ti);
  t.expected.resize(t.bytes);
  const uint64_t esize = t.dtype == GL_DTYPE_F32 ? 4 : 2;
  const uint64_t ring_part_elems = o_.job.mode == GL_MODE_ALLREDUCE && !g_integer_values
                                       ? std::max<uint64_t>(1, o_.ring_partition_bytes / esize)
                                       : 0;
  switch (t.dtype) {
    case GL_DTYPE_F32:
      FillT<GL_DTYPE_F32>(t.buf, t.expected.data(), t.elems, base.data(), W, o_.job.rank, col_base,
                          o_.mean, ring_part_elems);
      break;
    case GL_DTYPE_F16:
      FillT<GL_DTYPE_F16>(t.buf, t.expected.data(), t.elems, base.data(), W, o_.job.rank, col_base,
                          o_.mean, ring_part_elems);
      break;
    case GL_DTYPE_BF16:
      FillT<GL_DTYPE_BF16>(t.buf, t.expected.data(), t.elems, base.data(), W, o_.job.rank, col_base,
                           o_.mean, ring_part_elems);
      break;
  }
  if (t.device != 0) {
    const auto r = cuda_->MemcpyHtoD(t.device, t.buf, t.bytes);
    if (r != gradlane::client::cu::kSuccess) {
      std::fprintf(stderr, "gradlane-check: writing %s to the GPU: %s\n", t.name.c_str(),
                   cuda_->Describe(r).c_str());
      std::exit(1);
    }
  }
  return t.elems;
}

void Checker::PlanPosts(size_t ti, int64_t iter, std::vector<PendingPost>* out) const {
  const CheckTensor& t = tensors_[ti];
  const uint64_t h = Hash(o_.seed ^ 0x5157ull, static_cast<uint64_t>(iter), ti);
  const uint64_t eb = ElemBytes(t.dtype);
  const uint32_t pattern = static_cast<uint32_t>(h % 4);
  std::vector<uint64_t> cuts;  // element indices strictly inside (0, elems)
  if (pattern >= 2 && t.elems >= 2) {
    const uint32_t k = 1 + static_cast<uint32_t>((h >> 8) % 3);  // 1..3 cuts
    for (uint32_t j = 0; j < k; ++j) {
      const uint64_t r = Mix(h + j + 1);
      uint64_t c;
      // Half of the cuts sit right next to a partition boundary (P3: 50,000 elements,
      // 4 MiB bytes), when the tensor is that big.
      const uint64_t boundaries[2] = {50000, (uint64_t{4} << 20) / eb};
      const uint64_t b = boundaries[(r >> 20) & 1];
      if ((r & 1) && b + 1 < t.elems) {
        c = b - 1 + ((r >> 8) % 3);  // b-1, b or b+1
      } else {
        c = 1 + (r >> 1) % (t.elems - 1);
      }
      if (c > 0 && c < t.elems) cuts.push_back(c);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }
  std::vector<PendingPost> ranges;
  uint64_t prev = 0;
  cuts.push_back(t.elems);
  for (uint64_t c : cuts) {
    PendingPost p;
    p.tensor = ti;
    p.offset = prev * eb;
    p.length = (c - prev) * eb;
    ranges.push_back(p);
    prev = c;
  }
  // The last range is posted as "to the end" in patterns 0 and 3.
  if (pattern == 0 || pattern == 3) ranges.back().whole_marker = true;
  // Ranges of one tensor in a random (but rank-independent) order.
  for (size_t i = ranges.size(); i > 1; --i) {
    const size_t j = Mix(h ^ (i * 0x77ull)) % i;
    std::swap(ranges[i - 1], ranges[j]);
  }
  out->insert(out->end(), ranges.begin(), ranges.end());
}

int Checker::Verify(const gl_completion& c, std::vector<PendingPost>& posts) {
  ++completions_;
  if (c.user_data >= posts.size()) {
    return Fail("completion with unknown user_data %" PRIu64 " (tensor %u iteration %" PRId64 ")",
                c.user_data, c.tensor_id, c.iteration);
  }
  PendingPost& p = posts[c.user_data];
  CheckTensor& t = tensors_[p.tensor];
  if (p.done)
    return Fail("second completion for post %" PRIu64 " of %s", c.user_data, t.name.c_str());
  p.done = true;
  if (c.status != GL_OK) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "error completion %s (%d) for %s iteration %" PRId64 " [%" PRIu64 ", +%" PRIu64
                  "): %s",
                  gl_strerror(c.status), c.status, t.name.c_str(), c.iteration, p.offset, p.length,
                  gl_last_error(client_));
    return Observed(buf);
  }
  const bool length_ok = c.length == p.length || (p.whole_marker && c.length == GL_WHOLE_TENSOR);
  if (c.tensor_id != t.id || c.iteration != iter_ || c.offset != p.offset || !length_ok) {
    return Fail("completion for post %" PRIu64 " names tensor %u iteration %" PRId64 " [%" PRIu64
                ", +%" PRIu64 "); posted tensor %u (%s) iteration %" PRId64 " [%" PRIu64
                ", +%" PRIu64 ")",
                c.user_data, c.tensor_id, c.iteration, c.offset, c.length, t.id, t.name.c_str(),
                iter_, p.offset, p.length);
  }
  const uint64_t eb = ElemBytes(t.dtype);
  if (t.device != 0) {
    // The result must be in GPU memory by the time the completion is seen.
    std::memset(t.buf + p.offset, 0xA5, p.length);
    const auto r = cuda_->MemcpyDtoH(t.buf + p.offset, t.device + p.offset, p.length);
    if (r != gradlane::client::cu::kSuccess) {
      return Fail("reading %s [%" PRIu64 ", +%" PRIu64 ") back from the GPU: %s", t.name.c_str(),
                  p.offset, p.length, cuda_->Describe(r).c_str());
    }
  }
  if (std::memcmp(t.buf + p.offset, t.expected.data() + p.offset, p.length) != 0) {
    uint64_t bad = 0, first = UINT64_MAX;
    for (uint64_t i = p.offset / eb; i < (p.offset + p.length) / eb; ++i) {
      if (LoadBits(t.buf, t.dtype, i) != LoadBits(t.expected.data(), t.dtype, i)) {
        if (first == UINT64_MAX) first = i;
        ++bad;
      }
    }
    // Show the contributions of the first wrong element.
    std::string contrib;
    const bool special =
        SpecialColumn(Hash(o_.seed, kNoRank, static_cast<uint64_t>(iter_), p.tensor), first);
    for (uint32_t r = 0; r < o_.job.world; ++r) {
      const uint32_t bits = ContributionBits(
          t.dtype, Mix(Hash(o_.seed, r, static_cast<uint64_t>(iter_), p.tensor) + first), special);
      char b[48];
      std::snprintf(b, sizeof b, "%s0x%x(%g)", r ? " + " : "", bits,
                    static_cast<double>(Widen(t.dtype, bits)));
      contrib += b;
    }
    return Fail("MISMATCH %s iteration %" PRId64 " range [%" PRIu64 ", +%" PRIu64 "): %" PRIu64
                " wrong elements; first at element %" PRIu64 ": got 0x%x want 0x%x; inputs %s",
                t.name.c_str(), iter_, p.offset, p.length, bad, first,
                LoadBits(t.buf, t.dtype, first), LoadBits(t.expected.data(), t.dtype, first),
                contrib.c_str());
  }
  checked_bytes_ += p.length;
  return 0;
}

int Checker::SetUpDevice() {
  namespace cu = gradlane::client::cu;
  auto cuda = gradlane::client::LoadCudaDriver();
  if (!cuda.ok()) return Fail("--device=cuda: %s", std::string(cuda.status().message()).c_str());
  cuda_ = *cuda;
  int count = 0;
  cu::Context ctx = nullptr;
  cu::Result r = cuda_->DeviceGetCount(&count);
  if (r == cu::kSuccess && count < 1) return Fail("--device=cuda: the driver sees no GPU");
  if (r == cu::kSuccess) r = cuda_->DeviceGet(&cuda_device_, 0);
  if (r == cu::kSuccess) r = cuda_->DevicePrimaryCtxRetain(&ctx, cuda_device_);
  if (r == cu::kSuccess) {
    cuda_context_retained_ = true;
    r = cuda_->CtxSetCurrent(ctx);
  }
  if (r != cu::kSuccess) return Fail("--device=cuda: GPU 0: %s", cuda_->Describe(r).c_str());
  return 0;
}

void Checker::FreeDevice() {
  if (cuda_ == nullptr) return;
  for (CheckTensor& t : tensors_) {
    if (t.device != 0) cuda_->MemFree(t.device);
    t.device = 0;
  }
  if (cuda_context_retained_) cuda_->DevicePrimaryCtxRelease(cuda_device_);
  cuda_context_retained_ = false;
}

void Checker::ReportProgress(bool force) {
  if (progress_ == nullptr) return;
  const int64_t now = NowNs();
  if (!force && now - progress_written_ns_ < 200'000'000) return;
  progress_written_ns_ = now;
  std::rewind(progress_);
  std::fprintf(progress_,
               "iteration %" PRId64 " completions %" PRIu64 " bytes-checked %20" PRIu64 "\n", iter_,
               completions_, checked_bytes_);
  std::fflush(progress_);
}

int Checker::Run() {
  const int64_t t0 = NowNs();
  BuildTensorList();
  uint64_t arena = 8ull << 20;
  for (const auto& t : tensors_) arena += (t.bytes + 4095) / 4096 * 4096 + 4096;
  bool connected = false;
  int s = gradlane::testing::ConnectAndRegister(o_.job, arena, &client_, &connected);
  if (s != GL_OK) {
    // ConnectAndRegister printed the reason. A refused registration may be what the test
    // wants; a failed connect never is (it means the test set-up is broken).
    return o_.expect_failure && connected
               ? Observed(std::string("registration refused: ") + gl_strerror(s))
               : Fail("set-up failed: %s", gl_strerror(s));
  }
  if (o_.device && (s = SetUpDevice()) != 0) {
    gl_close(client_);
    return s;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    CheckTensor& t = tensors_[i];
    void* buf = nullptr;
    if (o_.device) {
      const auto r = cuda_->MemAlloc(&t.device, t.bytes);
      if (r != gradlane::client::cu::kSuccess) {
        gl_close(client_);
        return Fail("cuMemAlloc(%" PRIu64 "): %s", t.bytes, cuda_->Describe(r).c_str());
      }
      t.host_copy.resize(t.bytes);
      buf = t.host_copy.data();
      s = gl_register_device_tensor(client_, t.name.c_str(), reinterpret_cast<void*>(t.device),
                                    t.bytes, t.dtype, static_cast<int32_t>(i), &t.id);
    } else {
      s = gl_register_tensor(client_, t.name.c_str(), t.bytes, t.dtype, static_cast<int32_t>(i),
                             &t.id, &buf);
    }
    if (s != GL_OK) {
      std::string msg = "gl_register_tensor(" + t.name + ", " + std::to_string(t.bytes) +
                        " bytes): " + gl_strerror(s) + " (" + gl_last_error(client_) + ")";
      gl_close(client_);
      return Observed(msg);
    }
    t.buf = static_cast<std::byte*>(buf);
  }
  uint64_t bytes_per_iter = 0;
  for (const auto& t : tensors_) bytes_per_iter += t.bytes;
  // --timeout_ms is the bound on a wait without any completion, plus the time the bytes still
  // outstanding need at the slowest rate a busy machine gives (the test is about progress).
  const int64_t tol = int64_t{o_.job.timeout_ms} * 1'000'000;
  if (!o_.progress_file.empty()) {
    progress_ = std::fopen(o_.progress_file.c_str(), "w");
    if (progress_ == nullptr) {
      gl_close(client_);
      return Fail("cannot write --progress_file %s: %s", o_.progress_file.c_str(),
                  std::strerror(errno));
    }
  }

  int rc = 0;
  std::vector<PendingPost> posts;
  std::vector<gl_completion> comp(64);
  for (iter_ = 0; iter_ < o_.iterations && rc == 0 && !observed_failure_; ++iter_) {
    posts.clear();
    const int64_t f0 = NowNs();
    for (size_t i = 0; i < tensors_.size(); ++i) Fill(i, iter_);
    fill_ns_ += NowNs() - f0;
    // Backward: last layer first.
    for (size_t i = tensors_.size(); i-- > 0;) PlanPosts(i, iter_, &posts);
    size_t to_post = posts.size();
    const bool stall = iter_ == o_.stall_at;
    if (stall) to_post = posts.size() / 2;
    size_t next = 0, done = 0;
    uint64_t outstanding_bytes = 0;  // posted, not yet completed
    int64_t last_progress = NowNs();
    while (rc == 0 && !observed_failure_ && (next < to_post || done < to_post)) {
      // Post as much as the ring takes.
      while (next < to_post) {
        const PendingPost& p = posts[next];
        const uint64_t len = p.whole_marker ? GL_WHOLE_TENSOR : p.length;
        s = gl_post(client_, tensors_[p.tensor].id, iter_, p.offset, len, next);
        if (s == GL_E_AGAIN) break;
        if (s != GL_OK) {
          rc = Observed(std::string("gl_post: ") + gl_strerror(s) + " (" + gl_last_error(client_) +
                        ")");
          break;
        }
        ++posts_;
        outstanding_bytes += p.length;
        ++next;
      }
      if (rc != 0 || observed_failure_) break;
      if (stall && next == to_post) break;
      uint32_t n = 0;
      const int64_t allowance =
          tol + static_cast<int64_t>(outstanding_bytes * 1'000'000'000.0 / kSlowestBytesPerSecond);
      const int64_t left_ms = (last_progress + allowance - NowNs()) / 1'000'000;
      if (left_ms <= 0) {
        rc = Fail("timed out: no completion for %" PRId64 " ms in iteration %" PRId64
                  " (%zu of %zu ranges complete, %zu posted, %" PRIu64 " bytes outstanding)",
                  allowance / 1'000'000, iter_, done, to_post, next, outstanding_bytes);
        break;
      }
      s = gl_wait(client_, comp.data(), static_cast<uint32_t>(comp.size()), &n,
                  next < to_post ? 1 : static_cast<int>(std::min<int64_t>(left_ms, 1000)));
      if (s == GL_E_TIMEOUT) continue;
      if (s != GL_OK) {
        rc = Observed(std::string("gl_wait: ") + gl_strerror(s) + " (" + gl_last_error(client_) +
                      ")");
        break;
      }
      if (n > 0) last_progress = NowNs();
      for (uint32_t k = 0; k < n && rc == 0 && !observed_failure_; ++k) {
        rc = Verify(comp[k], posts);
        outstanding_bytes -= std::min<uint64_t>(outstanding_bytes, comp[k].length);
        ++done;
      }
      if (n > 0) ReportProgress(false);
    }
    if (stall && rc == 0 && !observed_failure_) {
      std::printf("gradlane-check: rank %u stalled at iteration %" PRId64
                  " (%zu of %zu ranges posted)\n",
                  o_.job.rank, iter_, to_post, posts.size());
      std::fflush(stdout);
      for (int i = 0; i < 600; ++i) ::sleep(1);  // bounded: the test kills us long before
      return Fail("stalled for 600 s and nobody killed me");
    }
    if (rc == 0 && !observed_failure_ && !o_.quiet) {
      std::printf("gradlane-check: rank %u iteration %" PRId64 " ok\n", o_.job.rank, iter_);
      std::fflush(stdout);
    }
  }
  if (rc == 0 && observed_failure_) {  // expected failure already reported
    gl_close(client_);
    return 0;
  }
  if (rc != 0) {
    gl_close(client_);
    return rc;
  }
  --iter_;
  // Diagnosis only: keep the session open a while after the last completion (a daemon must
  // not need this; the tests never pass it).
  if (o_.linger_ms > 0) ::usleep(static_cast<useconds_t>(o_.linger_ms) * 1000);
  gl_close(client_);
  if (o_.expect_failure) {
    return Fail("expected a failure, but all %" PRId64 " iterations completed", o_.iterations);
  }
  const double secs = static_cast<double>(NowNs() - t0) / 1e9;
  std::printf("gradlane-check: OK job=%s rank=%u/%u policy=%s reduce=%s iterations=%" PRId64
              " tensors=%zu bytes/iteration=%" PRIu64 " posts=%" PRIu64 " completions=%" PRIu64
              " bytes-checked=%" PRIu64 " time=%.2fs (generating data %.2fs)\n",
              o_.job.job.c_str(), o_.job.rank, o_.job.world,
              o_.job.policy.empty() ? "(default)" : o_.job.policy.c_str(), o_.mean ? "mean" : "sum",
              o_.iterations, tensors_.size(), bytes_per_iter, posts_, completions_, checked_bytes_,
              secs, static_cast<double>(fill_ns_) / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  std::vector<std::string> known = gradlane::testing::JobFlagNames();
  known.insert(known.end(),
               {"iterations", "seed", "sizes", "dtypes", "big_mb", "reduce", "stall_at",
                "linger_ms", "progress_file", "ring_partition_bytes", "values", "device"});
  if (!f.Parse(argc, argv, known, {"expect_failure", "quiet", "self_test", "probe_device"})) {
    Usage();
    return 2;
  }
  if (f.Bool("probe_device")) {
    // For the gpu suite: 0 and a line if GPU 0 can be used, else 77 (skip) and why not.
    auto cuda = gradlane::client::LoadCudaDriver();
    int count = 0;
    if (!cuda.ok()) {
      std::printf("no GPU: %s\n", std::string(cuda.status().message()).c_str());
      return 77;
    }
    if (const auto r = (*cuda)->DeviceGetCount(&count);
        r != gradlane::client::cu::kSuccess || count < 1) {
      std::printf("no GPU: the driver (%s) sees none\n", (*cuda)->library.c_str());
      return 77;
    }
    std::printf("GPU: %d device(s) through %s\n", count, (*cuda)->library.c_str());
    return 0;
  }
  if (!SelfTestConversions(f.Bool("self_test"))) return 1;
  if (f.Bool("self_test")) {
    std::printf("gradlane-check: conversion self-test ok\n");
    return 0;
  }
  Options o;
  if (!gradlane::testing::ReadJobFlags(f, &o.job)) {
    Usage();
    return 2;
  }
  bool ok = true;
  o.iterations = f.Int("iterations", 50, &ok);
  o.seed = static_cast<uint64_t>(f.Int("seed", 1, &ok));
  o.big_mb = static_cast<uint64_t>(f.Int("big_mb", 0, &ok));
  o.stall_at = f.Int("stall_at", -1, &ok);
  o.linger_ms = f.Int("linger_ms", 0, &ok);
  o.expect_failure = f.Bool("expect_failure");
  o.quiet = f.Bool("quiet");
  o.progress_file = f.Str("progress_file");
  const std::string reduce = f.Str("reduce", "sum");
  if (reduce != "sum" && reduce != "mean") {
    std::fprintf(stderr, "error: --reduce must be sum or mean\n");
    ok = false;
  }
  o.mean = reduce == "mean";
  o.ring_partition_bytes = static_cast<uint64_t>(f.Int("ring_partition_bytes", 0, &ok));
  const std::string values = f.Str("values", "random");
  if (values != "random" && values != "integer") {
    std::fprintf(stderr, "error: --values must be random or integer\n");
    ok = false;
  }
  g_integer_values = values == "integer";
  const std::string device = f.Str("device", "host");
  if (device != "host" && device != "cuda") {
    std::fprintf(stderr, "error: --device must be host or cuda\n");
    ok = false;
  }
  o.device = device == "cuda";
  if (o.job.mode == GL_MODE_ALLREDUCE && o.ring_partition_bytes == 0 && !g_integer_values) {
    std::fprintf(stderr,
                 "error: --mode=allreduce needs --ring_partition_bytes (the reference "
                 "follows the ring's order within each partition)\n");
    ok = false;
  }
  for (const std::string& d : Flags::Split(f.Str("dtypes", "f32,f16,bf16"), ',')) {
    if (d == "f32")
      o.dtypes.push_back(GL_DTYPE_F32);
    else if (d == "f16")
      o.dtypes.push_back(GL_DTYPE_F16);
    else if (d == "bf16")
      o.dtypes.push_back(GL_DTYPE_BF16);
    else {
      std::fprintf(stderr, "error: unknown dtype '%s' (f32, f16, bf16)\n", d.c_str());
      ok = false;
    }
  }
  for (const std::string& s : Flags::Split(f.Str("sizes"), ',')) {
    auto v = Flags::ParseInt(s);
    if (!v || *v <= 0) {
      std::fprintf(stderr, "error: --sizes wants positive element counts, got '%s'\n", s.c_str());
      ok = false;
    } else {
      o.sizes.push_back(static_cast<uint64_t>(*v));
    }
  }
  if (!ok || o.iterations < 1 || o.dtypes.empty()) {
    if (ok) std::fprintf(stderr, "error: need --iterations >= 1 and at least one dtype\n");
    Usage();
    return 2;
  }
  Checker c(std::move(o));
  return c.Run();
}
