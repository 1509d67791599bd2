// Parameter-server aggregation throughput versus memory bandwidth (docs/design.md §5.3).
//
// The shard's reduction is a streaming kernel: W inputs read once, one output written once.
// So its ceiling is memory bandwidth, and the figure that matters is how close it gets. Every
// benchmark here reports `bytes_per_second` as memory traffic (bytes read + bytes written), the
// same unit for the aggregation kernels and for the memcpy / read-only baselines measured in the
// same run, plus `contrib_rate`: contribution bytes reduced per second (W x bytes / time), which
// is what the network side has to feed.
//
//   build-ps/tests/bench/ps_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true   (one command line)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "daemon/ps/aggregator.h"
#include "daemon/ps/half.h"

namespace gradlane::ps {
namespace {

using sched::DType;

constexpr int kWorld = 3;

// Realistic gradient values (no NaN/Inf fast paths, no denormal slow paths), touched once so the
// pages exist before timing.
std::vector<std::byte> MakeBuffer(DType d, size_t bytes, uint64_t seed) {
  std::vector<std::byte> buf(bytes);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  const size_t eb = sched::DTypeBytes(d);
  for (size_t i = 0; i + eb <= bytes; i += eb) {
    const float f = normal(rng);
    if (d == DType::kF32) {
      std::memcpy(buf.data() + i, &f, 4);
    } else {
      const uint16_t h = d == DType::kF16 ? F32ToF16(f) : F32ToBf16(f);
      std::memcpy(buf.data() + i, &h, 2);
    }
  }
  return buf;
}

// Args: bytes per contribution, KernelIsa.
void BM_Aggregate(benchmark::State& state, DType dtype, ReduceOp op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const auto isa = static_cast<KernelIsa>(state.range(1));
  if (!KernelIsaAvailable(isa)) {
    state.SkipWithError("kernel not supported on this CPU");
    return;
  }
  std::vector<std::vector<std::byte>> in;
  std::vector<const std::byte*> ptrs;
  for (int r = 0; r < kWorld; ++r) in.push_back(MakeBuffer(dtype, bytes, r + 1));
  for (const auto& b : in) ptrs.push_back(b.data());
  std::vector<std::byte> out(bytes, std::byte{1});
  for (auto _ : state) {
    auto s = ReduceInRankOrder(dtype, ptrs, bytes, op, out.data(), isa);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * (kWorld + 1) * bytes);
  state.counters["contrib_rate"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kWorld * bytes,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.SetLabel(std::string(KernelIsaName(isa == KernelIsa::kAuto ? ResolvedKernelIsa() : isa)));
}

// Baseline 1: memcpy, read `bytes` + write `bytes`.
void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<std::byte> src = MakeBuffer(DType::kF32, bytes, 9);
  std::vector<std::byte> dst(bytes, std::byte{1});
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

// Baseline 2: the same access pattern as the W=3 reduction with no arithmetic worth the name:
// three streams read, one written (integer OR, which the compiler vectorises at -O2 since the
// trip count is a fixed block). The aggregation kernels cannot beat this; the gap to it is
// their compute cost.
void BM_ThreeReadsOneWrite(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t words = bytes / 8;
  std::vector<std::vector<std::byte>> in;
  for (int r = 0; r < kWorld; ++r) in.push_back(MakeBuffer(DType::kF32, bytes, r + 20));
  std::vector<std::byte> out(bytes, std::byte{1});
  for (auto _ : state) {
    const auto* a = reinterpret_cast<const uint64_t*>(in[0].data());
    const auto* b = reinterpret_cast<const uint64_t*>(in[1].data());
    const auto* c = reinterpret_cast<const uint64_t*>(in[2].data());
    auto* o = reinterpret_cast<uint64_t*>(out.data());
    for (size_t i = 0; i < words; ++i) o[i] = a[i] | b[i] | c[i];
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * (kWorld + 1) * bytes);
}

// 1 MiB per contribution: the working set (4 MiB) sits in L2/L3 — the case of a shard reducing
// a partition right after it arrived. 128 MiB: streams from DRAM.
void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {int64_t{1} << 20, int64_t{128} << 20}) {
    for (auto isa : {KernelIsa::kBaseline, KernelIsa::kAvx2}) {
      b->Args({bytes, static_cast<int64_t>(isa)});
    }
  }
  b->ArgNames({"bytes", "isa"});
  b->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Aggregate, f32_sum, DType::kF32, ReduceOp::kSum)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Aggregate, f16_sum, DType::kF16, ReduceOp::kSum)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Aggregate, bf16_sum, DType::kBF16, ReduceOp::kSum)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Aggregate, f32_mean, DType::kF32, ReduceOp::kMean)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Aggregate, f16_mean, DType::kF16, ReduceOp::kMean)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Aggregate, bf16_mean, DType::kBF16, ReduceOp::kMean)->Apply(Sizes);
BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(128 << 20)->ArgName("bytes")->UseRealTime();
BENCHMARK(BM_ThreeReadsOneWrite)->Arg(1 << 20)->Arg(128 << 20)->ArgName("bytes")->UseRealTime();

}  // namespace
}  // namespace gradlane::ps

BENCHMARK_MAIN();
