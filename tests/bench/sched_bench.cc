// Scheduler overhead (docs/design.md §5.3): nanoseconds per segment for enqueue + dequeue + ack,
// per policy, with 10k ready segments (100 tensors × 100 partitions of 64 KiB).
//
//   BM_Burst/<policy>:       all 10k segments become ready (backward order, 10 µs apart), then
//                            are drained: the ready queue holds 10k at its peak.
//   BM_Interleaved/<policy>: each tensor's 100 segments become ready 1 ms after the previous
//                            tensor's and are drained as far as the policy allows before the
//                            next arrives (a backward pass; exercises Prophet's block planning).
// Virtual time; each dispatch is acknowledged as soon as it is committed, and when a policy
// holds, time jumps to its NextWakeup. The reported counter per_segment is CPU time divided by
// the number of 64 KiB ready ranges that went through the policy (counted in bytes: gradlane's
// rules cut and fuse messages of their own size, so their segments are not the ranges).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "sched/policy.h"

namespace gradlane::sched {
namespace {

constexpr uint32_t kTensors = 100;
constexpr uint32_t kPartitionsPerTensor = 100;
constexpr uint64_t kPartition = 64 * 1024;
constexpr uint64_t kTensorBytes = kPartition * kPartitionsPerTensor;
constexpr int64_t kSegments = int64_t{kTensors} * kPartitionsPerTensor;

std::unique_ptr<Policy> MakeBenchPolicy(const std::string& name) {
  PolicyConfig config;
  config.name = name;
  config.partition_bytes = kPartition;
  config.credit_bytes = 4 * kPartition;
  config.initial_bandwidth_bytes_per_s = 1.25e9;
  auto p = MakePolicy(config);
  if (!p.ok()) return nullptr;
  for (uint32_t t = 0; t < kTensors; ++t) {
    (*p)->RegisterTensor({t, kTensorBytes, DType::kF32, static_cast<Priority>(t)});
  }
  return std::move(*p);
}

ReadyRange PartitionRange(uint32_t tensor, uint32_t partition, int64_t iteration) {
  ReadyRange r;
  r.tensor_id = tensor;
  r.priority = static_cast<Priority>(tensor);
  r.dtype = DType::kF32;
  r.direction = Direction::kPush;
  r.iteration = iteration;
  r.tensor_bytes = kTensorBytes;
  r.offset = uint64_t{partition} * kPartition;
  r.length = kPartition;
  return r;
}

// Dispatches and acknowledges until the policy stops; returns the bytes moved.
int64_t DispatchAll(Policy& p, TimeNs now, Dispatch& d) {
  int64_t n = 0;
  while (p.NextDispatch(now, d)) {
    n += static_cast<int64_t>(d.bytes);
    p.OnAcked(d.bytes, now);
  }
  return n;
}

int64_t DrainRest(Policy& p, TimeNs& now, Dispatch& d) {
  int64_t n = 0;
  while (p.queued_segments() > 0) {
    n += DispatchAll(p, now, d);
    if (p.queued_segments() == 0) break;
    const TimeNs wake = p.NextWakeup(now);
    now = wake == kNever ? now + 1 : std::max(now + 1, wake);
  }
  return n;
}

// Every byte made ready must have gone out, once: then the ranges moved are the items.
void Report(benchmark::State& state, int64_t moved_bytes) {
  if (moved_bytes != kSegments * static_cast<int64_t>(kPartition) * state.iterations()) {
    state.SkipWithError("bytes lost or sent twice");
    return;
  }
  const int64_t ranges = moved_bytes / static_cast<int64_t>(kPartition);
  state.SetItemsProcessed(ranges);
  // An inverted rate is seconds per range; the reporter prints it with an SI prefix ("ns").
  state.counters["per_segment"] = benchmark::Counter(
      static_cast<double>(ranges), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_Burst(benchmark::State& state, const std::string& name) {
  auto p = MakeBenchPolicy(name);
  if (p == nullptr) {
    state.SkipWithError("MakePolicy failed");
    return;
  }
  Dispatch d;
  int64_t iteration = 0;
  TimeNs now = 0;
  int64_t moved = 0;
  for (auto _ : state) {
    ++iteration;
    for (uint32_t t = kTensors; t-- > 0;) {
      for (uint32_t k = 0; k < kPartitionsPerTensor; ++k) {
        p->OnReady(PartitionRange(t, k, iteration), now);
      }
      now += 10 * kMicrosecond;
    }
    moved += DrainRest(*p, now, d);
    now += kMillisecond;
  }
  Report(state, moved);
}

void BM_Interleaved(benchmark::State& state, const std::string& name) {
  auto p = MakeBenchPolicy(name);
  if (p == nullptr) {
    state.SkipWithError("MakePolicy failed");
    return;
  }
  Dispatch d;
  int64_t iteration = 0;
  TimeNs now = 0;
  int64_t moved = 0;
  for (auto _ : state) {
    ++iteration;
    for (uint32_t t = kTensors; t-- > 0;) {
      for (uint32_t k = 0; k < kPartitionsPerTensor; ++k) {
        p->OnReady(PartitionRange(t, k, iteration), now);
      }
      moved += DispatchAll(*p, now, d);
      now += kMillisecond;
    }
    moved += DrainRest(*p, now, d);
    now += kMillisecond;
  }
  Report(state, moved);
}

const int kRegistered = [] {
  for (const std::string& name : PolicyNames()) {
    benchmark::RegisterBenchmark(("BM_Burst/" + name).c_str(), BM_Burst, name)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_Interleaved/" + name).c_str(), BM_Interleaved, name)
        ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}();

}  // namespace
}  // namespace gradlane::sched

BENCHMARK_MAIN();
