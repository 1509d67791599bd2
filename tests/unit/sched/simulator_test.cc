#include "sched/sim/simulator.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sched/model_profile.h"
#include "sched/policies/gradlane.h"
#include "sched/policies/gradlane_selector.h"
#include "sched/policy.h"

namespace gradlane::sched::sim {
namespace {

using ::testing::HasSubstr;

// --- Test-local policies: small, obviously-correct reference schedulers, so the engine is tested
// independently of the production policies (which are tested through it further down).

// Whole ranges in arrival order, no window: the vanilla framework.
class RefFifo : public Policy {
 public:
  std::string_view name() const override { return "ref-fifo"; }
  void RegisterTensor(const TensorSpec&) override {}
  void OnReady(const ReadyRange& r, TimeNs) override { queue_.push_back(r); }
  bool NextDispatch(TimeNs now, Dispatch& out) override {
    if (queue_.empty()) return false;
    const ReadyRange r = queue_.front();
    queue_.pop_front();
    out.segments.clear();
    out.segments.push_back(Segment{MakeKey(r.tensor_id, 0), r.priority, r.dtype, r.direction,
                                   r.peer, r.iteration, r.offset, r.length, now});
    out.bytes = r.length;
    in_flight_ += r.length;
    return true;
  }
  void OnAcked(uint64_t bytes, TimeNs) override { in_flight_ -= bytes; }
  TimeNs NextWakeup(TimeNs) const override { return kNever; }
  void OnLinkEstimate(double, TimeNs) override {}
  size_t queued_segments() const override { return queue_.size(); }
  uint64_t credit_in_use() const override { return in_flight_; }

 private:
  std::deque<ReadyRange> queue_;
  uint64_t in_flight_ = 0;
};

// Partitions of `partition` bytes (at tensor-relative boundaries), most urgent first, at most
// `credit` bytes unacknowledged: ByteScheduler's core.
class RefPriority : public Policy {
 public:
  RefPriority(uint64_t partition, uint64_t credit) : partition_(partition), credit_(credit) {}
  std::string_view name() const override { return "ref-priority"; }
  void RegisterTensor(const TensorSpec&) override {}
  void OnReady(const ReadyRange& r, TimeNs now) override {
    for (uint64_t off = r.offset; off < r.offset + r.length;) {
      const uint64_t boundary = (off / partition_ + 1) * partition_;
      const uint64_t end = std::min(boundary, r.offset + r.length);
      queue_.insert(Segment{MakeKey(r.tensor_id, static_cast<uint32_t>(off / partition_)),
                            r.priority, r.dtype, r.direction, r.peer, r.iteration, off, end - off,
                            now});
      off = end;
    }
  }
  bool NextDispatch(TimeNs, Dispatch& out) override {
    if (queue_.empty()) return false;
    // Always allow one segment in flight so a segment larger than the window still goes.
    if (in_flight_ > 0 && in_flight_ + queue_.begin()->length > credit_) return false;
    out.segments.clear();
    out.segments.push_back(*queue_.begin());
    out.bytes = queue_.begin()->length;
    queue_.erase(queue_.begin());
    in_flight_ += out.bytes;
    return true;
  }
  void OnAcked(uint64_t bytes, TimeNs) override { in_flight_ -= bytes; }
  TimeNs NextWakeup(TimeNs) const override { return kNever; }
  void OnLinkEstimate(double, TimeNs) override {}
  size_t queued_segments() const override { return queue_.size(); }
  uint64_t credit_in_use() const override { return in_flight_; }

 private:
  struct Urgent {
    bool operator()(const Segment& a, const Segment& b) const {
      return std::tie(a.iteration, a.priority, a.direction, a.key, a.peer, a.offset) <
             std::tie(b.iteration, b.priority, b.direction, b.key, b.peer, b.offset);
    }
  };
  uint64_t partition_;
  uint64_t credit_;
  std::set<Segment, Urgent> queue_;
  uint64_t in_flight_ = 0;
};

// Never sends anything: the engine must report a stall, not hang or crash.
class Mute : public RefFifo {
 public:
  bool NextDispatch(TimeNs, Dispatch&) override { return false; }
};

// Keeps a timer running but never sends: time moves on while nothing else does. The engine
// must give up on it by its progress guard, not run forever.
class Spinner : public RefFifo {
 public:
  bool NextDispatch(TimeNs, Dispatch&) override { return false; }
  TimeNs NextWakeup(TimeNs now) const override { return now + 1000; }
};

// Breaks the contract in a configurable way: the engine must say so, not mis-simulate.
class Broken : public RefFifo {
 public:
  enum Fault { kWrongPeer, kTwice };
  explicit Broken(Fault fault) : fault_(fault) {}
  void OnReady(const ReadyRange& r, TimeNs now) override {
    ReadyRange copy = r;
    if (fault_ == kWrongPeer && r.direction == Direction::kPush) copy.peer = (r.peer + 1) % 3;
    RefFifo::OnReady(copy, now);
    if (fault_ == kTwice) RefFifo::OnReady(copy, now);
  }

 private:
  Fault fault_;
};

struct NamedFactory {
  std::string name;
  PolicyFactory factory;
};

std::vector<NamedFactory> ReferencePolicies() {
  return {
      {"ref-fifo",
       [] { return absl::StatusOr<std::unique_ptr<Policy>>(std::make_unique<RefFifo>()); }},
      {"ref-priority-1m",
       [] {
         return absl::StatusOr<std::unique_ptr<Policy>>(
             std::make_unique<RefPriority>(1 << 20, 4 << 20));
       }},
      {"ref-stop-and-wait-256k",
       [] {
         return absl::StatusOr<std::unique_ptr<Policy>>(
             std::make_unique<RefPriority>(256 << 10, 256 << 10));
       }},
  };
}

// Production policies, through the factory the CLI uses.
std::vector<NamedFactory> ProductionPolicies() {
  std::vector<NamedFactory> out;
  for (const std::string& name : PolicyNames()) {
    out.push_back({name, [name] {
                     PolicyConfig config;
                     config.name = name;
                     return MakePolicy(config);
                   }});
  }
  return out;
}

std::vector<NamedFactory> AllPolicies() {
  std::vector<NamedFactory> all = ReferencePolicies();
  for (NamedFactory& f : ProductionPolicies()) all.push_back(std::move(f));
  return all;
}

ModelProfile MustParse(const std::string& json) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(json);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : ModelProfile{};
}

// n equal layers of `bytes` each, fwd/bwd in µs.
ModelProfile Uniform(int n, uint64_t bytes, int fwd_us, int bwd_us) {
  std::string json = R"({"model": "uniform", "layers": [)";
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"name": "l)", i, R"(", "param_bytes": )", bytes,
                    R"(, "fwd_us": )", fwd_us, R"(, "bwd_us": )", bwd_us, "}");
  }
  absl::StrAppend(&json, "]}");
  return MustParse(json);
}

// tests/data/models/<file> under GRADLANE_SOURCE_ROOT, parsed (empty layers when the root is
// unset or the file is missing: the caller asserts).
ModelProfile ProfileNamed(const std::filesystem::path& file) {
  const char* root = std::getenv("GRADLANE_SOURCE_ROOT");
  EXPECT_NE(root, nullptr) << "meson sets GRADLANE_SOURCE_ROOT";
  if (root == nullptr) return {};
  std::ifstream in(std::filesystem::path(root) / "tests/data/models" / file);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  return MustParse(text.str());
}

// Checked-in profiles plus two synthetic shapes: a VGG-like one (one huge layer near the
// output) and a stepwise one (gradients released in groups). Under GRADLANE_SIM_QUICK (the
// sanitizer builds) every third checked-in profile: the same code paths at a third of the cost;
// the plain build checks them all.
std::vector<std::pair<std::string, ModelProfile>> Profiles() {
  std::vector<std::pair<std::string, ModelProfile>> out;
  const char* root = std::getenv("GRADLANE_SOURCE_ROOT");
  EXPECT_NE(root, nullptr) << "meson sets GRADLANE_SOURCE_ROOT";
  if (root != nullptr) {
    std::vector<std::filesystem::path> files;
    for (const auto& e :
         std::filesystem::directory_iterator(std::filesystem::path(root) / "tests/data/models")) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    const size_t stride = std::getenv("GRADLANE_SIM_QUICK") != nullptr ? 3 : 1;
    for (size_t i = 0; i < files.size(); i += stride) {
      out.emplace_back(files[i].filename().string(), ProfileNamed(files[i].filename()));
    }
  }
  out.emplace_back("synthetic-vgg", MustParse(R"({"model": "vgg-like", "layers": [
    {"name": "c1", "param_bytes": 8000, "fwd_us": 900, "bwd_us": 1800},
    {"name": "c2", "param_bytes": 600000, "fwd_us": 700, "bwd_us": 1400},
    {"name": "c3", "param_bytes": 2400000, "fwd_us": 500, "bwd_us": 1000},
    {"name": "fc1", "param_bytes": 16000000, "fwd_us": 100, "bwd_us": 200},
    {"name": "fc2", "param_bytes": 1000000, "fwd_us": 20, "bwd_us": 40}]})"));
  out.emplace_back("synthetic-stepwise", MustParse(R"({"model": "steps", "layers": [
    {"name": "a", "param_bytes": 3000000, "fwd_us": 800, "bwd_us": 1600, "ready_us": 4000},
    {"name": "b", "param_bytes": 2000000, "fwd_us": 800, "bwd_us": 1600, "ready_us": 4000},
    {"name": "c", "param_bytes": 2000000, "fwd_us": 800, "bwd_us": 1600, "ready_us": 2000},
    {"name": "d", "param_bytes": 1000000, "fwd_us": 800, "bwd_us": 1600, "ready_us": 2000}]})"));
  return out;
}

SimConfig SmallConfig(double bits_per_s) {
  SimConfig c;
  c.workers = 3;
  c.bandwidth_bits_per_s = bits_per_s;
  c.warmup_iterations = 1;
  c.measured_iterations = 2;
  return c;
}

TEST(SimulatorTest, OneLayerTwoWorkersMatchesTheHandComputedIteration) {
  // One 1 MiB layer, fwd 1 ms, bwd 2 ms. The single shard partition goes to host 0, so per
  // iteration: worker 1 pushes 1 MiB to host 0, host 0 sums two copies, sends the sum back.
  const ModelProfile p = MustParse(R"({"model": "one", "layers": [
      {"name": "w", "param_bytes": 1048576, "fwd_us": 1000, "bwd_us": 2000}]})");
  SimConfig c;
  c.workers = 2;
  c.balance_shards = false;  // one key, one owner: the hand computation's premise
  c.bandwidth_bits_per_s = 1e9;
  c.overhead_ns = 50'000;
  c.latency_ns = 25'000;
  c.aggregation_bytes_per_s = 10e9;
  c.warmup_iterations = 1;
  c.measured_iterations = 3;
  // By hand: 1 MiB at 1 Gbit/s = 8 388 608 ns on the wire; aggregation reads 2 MiB at 10 GB/s
  // = 209 715.2 ns -> 209 715 ns. push = θ + latency + wire = 8 463 608 ns, pull the same.
  const TimeNs push = 50'000 + 25'000 + 8'388'608;
  const TimeNs expected = 1'000'000 + 2'000'000 + push + 209'715 + push;
  for (const NamedFactory& f : AllPolicies()) {
    if (f.name == "ref-stop-and-wait-256k") continue;  // splits the layer: not this formula
    if (f.name == "p3" || f.name == "prophet" || f.name == "gradlane" ||
        f.name == "gradlane-rules") {
      continue;  // these cut 1 MiB too
    }
    SCOPED_TRACE(f.name);
    absl::StatusOr<SimResult> r = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->iteration_ns.size(), 3u);
    for (TimeNs t : r->iteration_ns) EXPECT_EQ(t, expected);
    EXPECT_DOUBLE_EQ(r->mean_iteration_ns, expected);
    EXPECT_EQ(r->compute_ns, 3'000'000);
    EXPECT_DOUBLE_EQ(r->gpu_idle_share, (expected - 3e6) / expected);
    ASSERT_EQ(r->links.size(), 2u);
    // Host 1 pushes 1 MiB, host 0 returns 1 MiB; nothing else moves.
    EXPECT_DOUBLE_EQ(r->links[1].up_bytes, 1048576);
    EXPECT_DOUBLE_EQ(r->links[0].up_bytes, 1048576);
    EXPECT_DOUBLE_EQ(r->links[0].down_bytes, 1048576);
    EXPECT_DOUBLE_EQ(r->links[1].down_bytes, 1048576);
    EXPECT_DOUBLE_EQ(r->links[1].up_busy_ns, 50'000 + 8'388'608);
    // N = 8 388 608 ns, C = 3 ms: α = (N + C − T) / C.
    EXPECT_NEAR(r->alpha, (8'388'608.0 + 3e6 - expected) / 3e6, 1e-12);
  }
}

TEST(SimulatorTest, OneLayerIdealBoundMatchesTheHandComputedFluidSchedule) {
  // Same one-layer case. In the fluid limit the push and the pull of the 1 MiB pipeline: the
  // last piece leaves worker 1 after S/B, is summed at once and is back one latency later, with
  // no overhead: T = fwd + bwd + latency + S/B + latency (16 KiB pieces at 1 Gbit/s take
  // exactly 131 072 ns, so no rounding).
  const ModelProfile p = MustParse(R"({"model": "one", "layers": [
      {"name": "w", "param_bytes": 1048576, "fwd_us": 1000, "bwd_us": 2000}]})");
  SimConfig c;
  c.workers = 2;
  c.balance_shards = false;  // one key, one owner: the hand computation's premise
  c.bandwidth_bits_per_s = 1e9;
  c.overhead_ns = 50'000;
  c.latency_ns = 25'000;
  c.ideal_granularity_bytes = 16384;
  c.warmup_iterations = 1;
  c.measured_iterations = 3;
  absl::StatusOr<SimResult> ideal = SimulateIdeal(p, c);
  ASSERT_TRUE(ideal.ok()) << ideal.status();
  const TimeNs expected = 1'000'000 + 2'000'000 + 25'000 + 8'388'608 + 25'000;
  for (TimeNs t : ideal->iteration_ns) EXPECT_EQ(t, expected);
}

TEST(SimulatorTest, LaggardChainBindsWhereASinglePortLetsTheHostsDriftApart) {
  // One 2 MiB layer, W = 2, balanced keys: each host owns 1 MiB, so each uplink carries a 1 MiB
  // push and a 1 MiB pull per iteration, all after the backward. Every schedule then takes
  // fwd + bwd + 2 MiB / B + one latency per iteration: the host that is last to start its
  // forward sends 2 MiB after its gradient is ready, the other host needs its pulls before
  // its next forward (the laggard chain, 1 ns per 4 KiB less for rounding). Host 0's uplink
  // alone admits less: with every other port free, host 0 can run ahead and send host 1's
  // pulls during its own next iteration's compute.
  const ModelProfile p = MustParse(R"({"model": "one", "layers": [
      {"name": "w", "param_bytes": 2097152, "fwd_us": 1000, "bwd_us": 2000}]})");
  SimConfig c = SmallConfig(1e9);
  c.workers = 2;
  c.overhead_ns = 0;
  c.aggregation_bytes_per_s = 0;
  c.warmup_iterations = 2;
  c.measured_iterations = 4;
  absl::StatusOr<SimResult> ideal = SimulateIdeal(p, c);
  ASSERT_TRUE(ideal.ok()) << ideal.status();
  constexpr TimeNs kChain = 1'000'000 + 2'000'000 + 16'777'216 + 25'000 - 2 * 256;
  EXPECT_THAT(ideal->variant, HasSubstr("laggard chain"));
  EXPECT_DOUBLE_EQ(ideal->mean_iteration_ns, kChain);
  for (TimeNs t : ideal->iteration_ns) EXPECT_EQ(t, kChain);
  // From a cold start: at least the first iteration's compute, then one chain per further one.
  EXPECT_GE(ideal->total_ns, p.ComputeNs() + 5 * kChain);
  EXPECT_LT(ideal->single_port_mean_ns, 0.9 * kChain);
  // Reachable: the all-ports fluid schedule is within a fluid piece of it per iteration.
  absl::StatusOr<SimResult> fluid = SimulateFluid(p, c);
  ASSERT_TRUE(fluid.ok()) << fluid.status();
  EXPECT_LE(ideal->total_ns, fluid->total_ns);
  EXPECT_LT(fluid->mean_iteration_ns, 1.01 * kChain);
  for (const NamedFactory& f : AllPolicies()) {
    absl::StatusOr<SimResult> r = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(r.ok()) << f.name << ": " << r.status();
    EXPECT_LE(ideal->total_ns, r->total_ns) << f.name;
  }
}

TEST(SimulatorTest, BalancedKeysSpreadASmallModelOverEveryShard) {
  // One 3 MiB layer on three hosts: with 4 MiB keys one shard owns it all and its downlink
  // carries two pushes (and its uplink two pulls); the balance rule gives each shard 1 MiB.
  const ModelProfile p = MustParse(R"({"model": "one", "layers": [
      {"name": "w", "param_bytes": 3145728, "fwd_us": 1000, "bwd_us": 2000}]})");
  SimConfig c;
  c.workers = 3;
  c.bandwidth_bits_per_s = 1e9;
  c.warmup_iterations = 1;
  c.measured_iterations = 3;
  EXPECT_EQ(ShardUnitBytes(p, c), 1u << 20);
  absl::StatusOr<SimResult> balanced = SimulateIdeal(p, c);
  c.balance_shards = false;
  EXPECT_EQ(ShardUnitBytes(p, c), 4u << 20);
  absl::StatusOr<SimResult> plain = SimulateIdeal(p, c);
  ASSERT_TRUE(balanced.ok() && plain.ok());
  // Plain: the owner's uplink sends two 3 MiB pulls (50.3 ms at 1 Gbit/s); balanced: every
  // uplink sends two 1 MiB pushes and two 1 MiB pulls (33.6 ms).
  EXPECT_GT(plain->mean_iteration_ns, 3'000'000 + 50'000'000);
  EXPECT_LT(balanced->mean_iteration_ns, 3'000'000 + 34'000'000);
  // All-reduce keeps its partition size: every partition is split W ways already.
  c.balance_shards = true;
  c.mode = SimMode::kAllReduce;
  EXPECT_EQ(ShardUnitBytes(p, c), 4u << 20);
}

TEST(SimulatorTest, EvenShardsStillSpreadEveryTensorAndThatShortensTheIteration) {
  // Three 4 MiB layers on three hosts: with 4 MiB keys each shard owns one layer (even loads),
  // but each layer's pushes meet in one downlink and its pulls leave one uplink, so the first
  // layer's exchange, produced last and needed first, takes up to three times as long as when
  // every shard carries a third of it. The rule cuts the keys to 1 MiB (four per layer).
  // ρ ≈ 1: compute 135 ms, each uplink 134 ms of traffic.
  const ModelProfile p = MustParse(R"({"model": "three", "layers": [
      {"name": "a", "param_bytes": 4194304, "fwd_us": 15000, "bwd_us": 30000},
      {"name": "b", "param_bytes": 4194304, "fwd_us": 15000, "bwd_us": 30000},
      {"name": "c", "param_bytes": 4194304, "fwd_us": 15000, "bwd_us": 30000}]})");
  SimConfig c = SmallConfig(1e9);
  c.warmup_iterations = 2;
  c.measured_iterations = 3;
  EXPECT_EQ(ShardUnitBytes(p, c), 1u << 20);
  absl::StatusOr<SimResult> spread_bound = SimulateIdeal(p, c);
  const PolicyFactory rules = [] {
    PolicyConfig config;
    config.name = "gradlane-rules";
    config.partition_bytes = 1 << 20;  // as gradlane-sim and the daemon give it the keys
    return MakePolicy(config);
  };
  absl::StatusOr<SimResult> spread = Simulate(p, c, rules, "gradlane-rules");
  c.balance_shards = false;  // the plain map: one even, unspread key per layer
  EXPECT_EQ(ShardUnitBytes(p, c), 4u << 20);
  absl::StatusOr<SimResult> plain_bound = SimulateIdeal(p, c);
  absl::StatusOr<SimResult> plain = Simulate(p, c, rules, "gradlane-rules");
  ASSERT_TRUE(spread_bound.ok() && spread.ok() && plain_bound.ok() && plain.ok());
  // Same bytes on every port either way (each uplink 16 MiB of pushes and pulls, 134 ms; the
  // compute 135 ms): only the spread differs, and with it how long the first layer's exchange
  // holds up the next iteration. Here: bound 168.7 ms spread against 202.2 plain, the rules
  // 199.7 against 229.3.
  EXPECT_LT(spread_bound->mean_iteration_ns, 0.9 * plain_bound->mean_iteration_ns);
  EXPECT_LT(spread->mean_iteration_ns, 0.9 * plain->mean_iteration_ns);
}

TEST(SimulatorTest, ForwardWaitsOnlyForItsOwnLayersPull) {
  // Layer 0 has no parameters, layer 1 has 4 MB (owned by shard 0). ByteScheduler §3.4: no
  // global barrier, so layer 0's 5 ms forward runs while layer 1's result is still coming back,
  // and only layer 1's forward waits for it.
  const ModelProfile p = MustParse(R"({"model": "two", "layers": [
      {"name": "stem", "param_bytes": 0, "fwd_us": 5000, "bwd_us": 100},
      {"name": "big", "param_bytes": 4000000, "fwd_us": 100, "bwd_us": 100}]})");
  SimConfig c;
  c.workers = 2;
  c.balance_shards = false;  // one key, one owner: the hand computation's premise
  c.bandwidth_bits_per_s = 1e9;
  c.overhead_ns = 0;
  c.latency_ns = 0;
  c.aggregation_bytes_per_s = 0;
  c.shard_partition_bytes = 1ull << 30;
  c.warmup_iterations = 1;
  c.measured_iterations = 2;
  absl::StatusOr<SimResult> r = Simulate(p, c, ReferencePolicies()[0].factory, "fifo");
  ASSERT_TRUE(r.ok()) << r.status();
  // By hand, worker 1 (whose shard does not own the layer) is the critical one: from the start
  // of its backward, big's gradient is ready after 100 µs, the push takes 4e6 B at 1 Gbit/s =
  // 32 ms, the pull 32 ms more, then big's forward 100 µs, then the next backward. The stem's
  // forward (5 ms) and backward (100 µs) are hidden. With a global barrier it would be
  // 200 µs + 64 ms + 5.1 ms.
  const TimeNs expected = 100'000 + 32'000'000 + 32'000'000 + 100'000;
  ASSERT_EQ(r->iteration_ns.size(), 2u);
  for (TimeNs t : r->iteration_ns) EXPECT_EQ(t, expected);
}

TEST(SimulatorTest, SingleWorkerNeverTouchesTheNetwork) {
  const ModelProfile p = Uniform(4, 1 << 20, 300, 600);
  SimConfig c = SmallConfig(1e6);  // a link this slow would dominate if it were used
  c.workers = 1;
  absl::StatusOr<SimResult> r = Simulate(p, c, ReferencePolicies()[0].factory, "fifo");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->mean_iteration_ns, p.ComputeNs());
  EXPECT_DOUBLE_EQ(r->links[0].up_bytes, 0);
}

TEST(SimulatorTest, UnboundedBandwidthAndNoOverheadGivesPureComputeTime) {
  for (const auto& [name, profile] : Profiles()) {
    SimConfig c = SmallConfig(1e30);
    c.overhead_ns = 0;
    c.latency_ns = 0;
    c.aggregation_bytes_per_s = 0;
    std::vector<NamedFactory> policies = AllPolicies();
    for (const NamedFactory& f : policies) {
      SCOPED_TRACE(absl::StrCat(name, " / ", f.name));
      absl::StatusOr<SimResult> r = Simulate(profile, c, f.factory, f.name);
      ASSERT_TRUE(r.ok()) << r.status();
      for (TimeNs t : r->iteration_ns) EXPECT_EQ(t, profile.ComputeNs());
      EXPECT_DOUBLE_EQ(r->gpu_idle_share, 0.0);
    }
    absl::StatusOr<SimResult> ideal = SimulateIdeal(profile, c);
    ASSERT_TRUE(ideal.ok()) << ideal.status();
    for (TimeNs t : ideal->iteration_ns) EXPECT_EQ(t, profile.ComputeNs()) << name;
  }
}

// The link rates the every-profile tests run at: all of them, or (GRADLANE_SIM_QUICK, set for the
// sanitizer builds, where each simulation is many times slower) the middle one only.
std::vector<double> Bandwidths(std::vector<double> all) {
  if (std::getenv("GRADLANE_SIM_QUICK") != nullptr) return {all[all.size() / 2]};
  return all;
}

TEST(SimulatorTest, IdealBoundIsBelowEveryPolicyOnEveryProfileAndBandwidth) {
  for (const auto& [name, profile] : Profiles()) {
    for (double gbit : Bandwidths({1.0, 3.0, 10.0})) {
      const SimConfig c = SmallConfig(gbit * 1e9);
      absl::StatusOr<SimResult> ideal = SimulateIdeal(profile, c);
      ASSERT_TRUE(ideal.ok()) << ideal.status();
      // Never below what the GPU alone needs; never above the all-ports fluid schedule, which
      // is one feasible schedule of every relaxation the bound takes the optimum of (checked on
      // the smaller models only: the fluid network is the slowest thing to simulate).
      EXPECT_GE(ideal->mean_iteration_ns, static_cast<double>(profile.ComputeNs()));
      if (profile.TotalParamBytes() < 60'000'000) {
        absl::StatusOr<SimResult> fluid = SimulateFluid(profile, c);
        ASSERT_TRUE(fluid.ok()) << fluid.status();
        EXPECT_LE(ideal->total_ns, fluid->total_ns) << name << " " << gbit;
      }
      for (const NamedFactory& f : AllPolicies()) {
        SCOPED_TRACE(absl::StrCat(name, " at ", gbit, " Gbit/s: ", f.name));
        absl::StatusOr<SimResult> r = Simulate(profile, c, f.factory, f.name);
        ASSERT_TRUE(r.ok()) << r.status();
        // From a cold start, every prefix of iterations: what the bound guarantees exactly.
        EXPECT_LE(ideal->total_ns, r->total_ns) << "bound from " << ideal->variant;
        // Every policy moves the same bytes over the same links as the bound.
        for (size_t h = 0; h < r->links.size(); ++h) {
          EXPECT_DOUBLE_EQ(r->links[h].up_bytes, ideal->links[h].up_bytes);
          EXPECT_DOUBLE_EQ(r->links[h].down_bytes, ideal->links[h].down_bytes);
        }
        EXPECT_DOUBLE_EQ(r->comm_ns, ideal->comm_ns);
      }
    }
  }
}

// A random model of `layers` layers for the randomised bound tests: sizes from 1 kB to 6 MB, or
// no parameters (`tiny`: a few bytes instead, fewer elements than ranks), random compute, and
// half the time a stepwise ready pattern.
template <class Uniform>
std::string RandomModelJson(int layers, bool tiny, Uniform& uniform) {
  const bool stepwise = uniform(0, 1) == 1;
  std::string json = R"({"model": "random", "layers": [)";
  for (int i = 0; i < layers; ++i) {
    const uint64_t small = tiny ? uniform(0, 64) : 0;
    absl::StrAppend(&json, i ? "," : "", R"({"name": "l)", i, R"(", "param_bytes": )",
                    uniform(0, 3) == 0 ? small : uniform(1000, 6'000'000), R"(, "fwd_us": )",
                    uniform(0, 3000), R"(, "bwd_us": )", uniform(0, 6000));
    if (stepwise) absl::StrAppend(&json, R"(, "ready_us": )", 1000 * uniform(0, 8));
    absl::StrAppend(&json, "}");
  }
  absl::StrAppend(&json, "]}");
  return json;
}

// Every policy, and a priority policy of partition `partition` and a credit of `windows` of them
// (close to the bound: no overhead of its own), takes at least `bound_ns`.
void ExpectNoPolicyBeats(const ModelProfile& p, const SimConfig& c, TimeNs bound_ns,
                         uint64_t partition, uint64_t windows) {
  const uint64_t credit = partition * windows;
  const PolicyFactory tight = [partition, credit] {
    return absl::StatusOr<std::unique_ptr<Policy>>(
        std::make_unique<RefPriority>(partition, credit));
  };
  std::vector<NamedFactory> policies = AllPolicies();
  policies.push_back({"ref-priority-random", tight});
  for (const NamedFactory& f : policies) {
    absl::StatusOr<SimResult> r = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(r.ok()) << f.name << ": " << r.status();
    EXPECT_LE(bound_ns, r->total_ns) << f.name;
  }
}

// The bound against many small random models and configs, including policies without overhead
// that come close to it: a seeded generator, so a failure is reproducible. As in the all-reduce
// test below, GRADLANE_SIM_TRIALS=N runs N trials instead of 80 and GRADLANE_SIM_SEED another
// seed; GRADLANE_SIM_MAX_WORKERS=W draws W up to W instead of 4, for a longer search.
TEST(SimulatorTest, IdealBoundHoldsOnRandomSmallModels) {
  const char* trials_env = std::getenv("GRADLANE_SIM_TRIALS");
  const char* seed_env = std::getenv("GRADLANE_SIM_SEED");
  const char* workers_env = std::getenv("GRADLANE_SIM_MAX_WORKERS");
  const int trials = trials_env != nullptr ? std::atoi(trials_env) : 80;
  const uint64_t max_workers =
      workers_env != nullptr ? std::max<uint64_t>(2, std::strtoull(workers_env, nullptr, 10)) : 4;
  std::mt19937_64 rng(seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 20261122);
  auto uniform = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  for (int trial = 0; trial < trials; ++trial) {
    const int layers = static_cast<int>(uniform(1, 6));
    const std::string json = RandomModelJson(layers, /*tiny=*/false, uniform);
    const ModelProfile p = MustParse(json);
    SimConfig c = SmallConfig(1e9 * static_cast<double>(uniform(1, 40)) / 4);
    c.workers = static_cast<int>(uniform(2, max_workers));
    c.overhead_ns = static_cast<TimeNs>(uniform(0, 1) * 50'000);
    c.latency_ns = static_cast<TimeNs>(uniform(0, 50'000));
    c.aggregation_bytes_per_s = uniform(0, 1) ? 0 : 20e9;
    c.shard_partition_bytes = uniform(1, 8) << 19;
    // Hosts that start one after another (as daemons do), in half the trials.
    const uint64_t skewed = uniform(0, 1);  // (two draws, in this order: reproducible)
    c.start_skew_ns = static_cast<TimeNs>(skewed * uniform(0, 2'000'000));
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": W=", c.workers, " B=", c.bandwidth_bits_per_s,
                              " θ=", c.overhead_ns, " latency=", c.latency_ns, " start skew=",
                              c.start_skew_ns, " aggregation=", c.aggregation_bytes_per_s,
                              " shard partition=", c.shard_partition_bytes, " ", json));
    absl::StatusOr<SimResult> ideal = SimulateIdeal(p, c);
    ASSERT_TRUE(ideal.ok()) << ideal.status();
    const uint64_t partition = uniform(1, 16) << 16;  // (drawn in this order: reproducible)
    ExpectNoPolicyBeats(p, c, ideal->total_ns, partition, uniform(1, 4));
  }
}

TEST(SimulatorTest, EveryByteIsPushedAndPulledOnceByTheOwnerShard) {
  // W = 4: each byte leaves 3 workers for its shard and comes back to 3 workers.
  const ModelProfile p = Uniform(6, 3'000'000, 500, 1000);
  SimConfig c = SmallConfig(5e9);
  c.workers = 4;
  for (const NamedFactory& f : AllPolicies()) {
    SCOPED_TRACE(f.name);
    absl::StatusOr<SimResult> r = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(r.ok()) << r.status();
    double up = 0, down = 0;
    for (const LinkStats& l : r->links) {
      up += l.up_bytes;
      down += l.down_bytes;
    }
    EXPECT_DOUBLE_EQ(up, 2.0 * 3 * p.TotalParamBytes());
    EXPECT_DOUBLE_EQ(down, up);
    EXPECT_NEAR(r->rho, (2.0 * 3 / 4 * p.TotalParamBytes() * 8 / 5e9) / (p.ComputeNs() * 1e-9),
                1e-9);
  }
}

TEST(SimulatorTest, SameInputsGiveIdenticalResults) {
  const auto profiles = Profiles();
  const ModelProfile& p = profiles.back().second;
  const SimConfig c = SmallConfig(2e9);
  for (const NamedFactory& f : AllPolicies()) {
    absl::StatusOr<SimResult> a = Simulate(p, c, f.factory, f.name);
    absl::StatusOr<SimResult> b = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->iteration_ns, b->iteration_ns) << f.name;
    EXPECT_EQ(a->events, b->events) << f.name;
    for (size_t h = 0; h < a->links.size(); ++h) {
      EXPECT_EQ(a->links[h].up_busy_ns, b->links[h].up_busy_ns) << f.name;
    }
  }
  absl::StatusOr<SimResult> a = SimulateIdeal(p, c);
  absl::StatusOr<SimResult> b = SimulateIdeal(p, c);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->iteration_ns, b->iteration_ns);
  EXPECT_EQ(a->events, b->events);
}

// Where communication and computation are of the same size (ρ ≈ 1), sending the layers the
// next forward needs first lets the GPU start while the rest still flows.
TEST(SimulatorTest, PriorityBeatsFifoWhenCommunicationMatchesCompute) {
  const ModelProfile p = Uniform(12, 4'000'000, 10'000, 20'000);
  SimConfig c = SmallConfig(1e9);
  c.warmup_iterations = 2;
  c.measured_iterations = 4;
  // Bandwidth for ρ = 1.
  c.bandwidth_bits_per_s = 2.0 * 2 / 3 * p.TotalParamBytes() * 8 / (p.ComputeNs() * 1e-9);
  ASSERT_NEAR(Rho(p, c), 1.0, 1e-9);
  absl::StatusOr<SimResult> fifo = Simulate(p, c, ReferencePolicies()[0].factory, "fifo");
  absl::StatusOr<SimResult> prio = Simulate(p, c, ReferencePolicies()[1].factory, "prio");
  ASSERT_TRUE(fifo.ok() && prio.ok());
  EXPECT_LT(prio->mean_iteration_ns, 0.95 * fifo->mean_iteration_ns);
  EXPECT_GT(prio->alpha, fifo->alpha);
  EXPECT_LT(prio->gpu_idle_share, fifo->gpu_idle_share);
  // The production priority policies, with partitions small enough to reorder 4 MB layers.
  for (const char* name : {"bytescheduler", "prophet"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<SimResult> r = Simulate(
        p, c,
        [name] {
          PolicyConfig pc;
          pc.name = name;
          pc.partition_bytes = 1 << 20;
          pc.credit_bytes = 4 << 20;
          return MakePolicy(pc);
        },
        name);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->mean_iteration_ns, 0.95 * fifo->mean_iteration_ns);
  }
}

// A policy's configuration as gradlane-sim makes it for a run of `c` whose keys are `unit`
// bytes: a policy whose own partitions are coarser is cut at the keys, as the daemon cuts.
PolicyConfig SimPolicyConfig(std::string_view name, const SimConfig& c, uint64_t unit) {
  PolicyConfig pc;
  pc.name = std::string(name);
  const uint64_t own = DefaultPartitionBytes(name, DType::kF32);
  pc.partition_bytes = unit < own ? unit : 0;
  pc.initial_bandwidth_bytes_per_s = c.bandwidth_bits_per_s / 8;
  pc.per_message_overhead_ns = c.overhead_ns;
  return pc;
}

// gradlane's outer loop (policies/gradlane_selector.h) where its own rules lose: googlenet at
// ρ = 2, 10 Gbit/s, W = 8 with the plain 4 MiB key map (what a job with an explicit
// --partition_bytes gets: no balance rule), where the rules are 15% behind prophet (with the
// balanced, spread keys they are ahead of every seed there). Measured after the trials, as
// gradlane-sim does: within 1% of the best of the papers' schedules, and well ahead of the
// rules alone, which shows that every host runs rank 0's choice.
TEST(SimulatorTest, GradlaneKeepsTheBestCandidateWhereItsRulesLose) {
  ModelProfile p = ProfileNamed("googlenet.json");
  ASSERT_FALSE(p.layers.empty()) << "tests/data/models/googlenet.json";
  SimConfig c;
  c.balance_shards = false;
  c.workers = 8;
  c.bandwidth_bits_per_s = 10e9;
  c.warmup_iterations = kLatestChoiceIteration + 3;  // the trials and any runoff
  // Three cycles of the 8-iteration pattern prophet's times repeat on this row: a 10-iteration
  // window's mean depends by a few percent on where in the cycle it starts.
  c.measured_iterations = 24;
  ASSERT_TRUE(ScaleComputeToRho(p, c, 2.0));
  const uint64_t unit = ShardUnitBytes(p, c);
  std::map<std::string, TimeNs> t;
  SimResult gradlane;
  for (const char* name :
       {"fifo", "p3", "bytescheduler", "prophet", "gradlane", "gradlane-rules"}) {
    absl::StatusOr<SimResult> r = Simulate(
        p, c, [&] { return MakePolicy(SimPolicyConfig(name, c, unit)); }, name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    t[name] = r->mean_iteration_ns;
    if (std::string_view(name) == "gradlane") {
      gradlane = *std::move(r);
    } else {
      EXPECT_EQ(r->schedules.size(), 1u) << name << " is one schedule throughout";
    }
  }
  // What rank 0 ran: the eight trials from iteration 1 (the first candidate also warms up in
  // 0), then any runoff, and its choice before the measured window.
  ASSERT_GE(gradlane.schedules.size(), 9u);
  const std::vector<std::pair<int64_t, std::string>> trials = {{0, "gradlane-rules"},
                                                               {4, "prophet"},
                                                               {7, "bytescheduler"},
                                                               {10, "fifo"},
                                                               {13, "p3"},
                                                               {16, "gradlane-rules-window*2"},
                                                               {19, "gradlane-rules-window/2"},
                                                               {22, "gradlane-rules-blocks*2"}};
  for (size_t i = 0; i < trials.size(); ++i) {
    EXPECT_EQ(gradlane.schedules[i].iteration, trials[i].first);
    EXPECT_EQ(gradlane.schedules[i].schedule, trials[i].second);
  }
  EXPECT_EQ(gradlane.schedules[8].iteration, 25);
  EXPECT_LT(gradlane.schedules.back().iteration, c.warmup_iterations) << "chosen before measuring";
  const TimeNs best_seed = std::min({t["fifo"], t["p3"], t["bytescheduler"], t["prophet"]});
  EXPECT_GT(static_cast<double>(t["gradlane-rules"]), 1.05 * static_cast<double>(best_seed))
      << "the premise: the rules lose on this row";
  EXPECT_LE(static_cast<double>(t["gradlane"]), 1.01 * static_cast<double>(best_seed));
}

// One of the rules' variants (which only the gradlane policy builds), the rules alone and
// gradlane, on `profile` at ρ = 1, measured after gradlane's trials and any runoff.
struct VariantRuns {
  SimResult rules;
  SimResult variant;
  SimResult gradlane;
};
VariantRuns SimulateVariantRulesAndGradlane(const char* profile, SimConfig c,
                                            GradlaneVariant variant) {
  ModelProfile p = ProfileNamed(profile);
  EXPECT_FALSE(p.layers.empty()) << "tests/data/models/" << profile;
  c.warmup_iterations = kLatestChoiceIteration + 3;
  c.measured_iterations = 10;
  EXPECT_TRUE(ScaleComputeToRho(p, c, 1.0));
  const uint64_t unit = ShardUnitBytes(p, c);
  auto run = [&](const std::string& name, GradlaneVariant v) -> SimResult {
    absl::StatusOr<SimResult> r = Simulate(
        p, c,
        [&]() -> absl::StatusOr<std::unique_ptr<Policy>> {
          const PolicyConfig pc = SimPolicyConfig(name, c, unit);
          if (v != GradlaneVariant::kRules) {
            return std::unique_ptr<Policy>(GradlanePolicy::Create(pc, v));
          }
          return MakePolicy(pc);
        },
        name);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status();
    return r.ok() ? *std::move(r) : SimResult{};
  };
  return {run("gradlane-rules", GradlaneVariant::kRules), run("gradlane-rules", variant),
          run("gradlane", GradlaneVariant::kRules)};
}

// The premise (the variant is more than 3% faster than the rules on the row) and that
// gradlane's trials find it: within 1% of it, and running it when measured.
void ExpectGradlaneKeepsTheFasterVariant(const VariantRuns& runs, std::string_view name) {
  ASSERT_GT(runs.rules.mean_iteration_ns, 0);
  EXPECT_LT(static_cast<double>(runs.variant.mean_iteration_ns),
            0.97 * static_cast<double>(runs.rules.mean_iteration_ns))
      << "the premise: " << name << " is faster on this row";
  EXPECT_LE(static_cast<double>(runs.gradlane.mean_iteration_ns),
            1.01 * static_cast<double>(runs.variant.mean_iteration_ns));
  ASSERT_FALSE(runs.gradlane.schedules.empty());
  EXPECT_EQ(runs.gradlane.schedules.back().schedule, name);
}

// The window variants among gradlane's candidates: on a model of many small tensors at W = 3
// with the plain 4 MiB key map (an explicit --partition_bytes: no balance rule) the rules'
// window is too deep (densenet121, ρ = 1, 1 Gbit/s: half of it is 4% faster, twice it 9%
// slower), and gradlane finds that from its trials; measured after them, as gradlane-sim does.
TEST(SimulatorTest, GradlaneTriesTheRulesWithAnotherWindow) {
  SimConfig c;
  c.balance_shards = false;
  c.workers = 3;
  c.bandwidth_bits_per_s = 1e9;
  ExpectGradlaneKeepsTheFasterVariant(SimulateVariantRulesAndGradlane("densenet121.json", c,
                                                                      GradlaneVariant::kHalfWindow),
                                      "gradlane-rules-window/2");
}

// The blocks variant among gradlane's candidates: squeezenet1_1 at W = 8, 10 Gbit/s, ρ = 1 with
// the daemon's balanced keys sends 268 messages per host and iteration under the rules, their θ
// a tenth of the iteration; blocks of twice δ make fewer messages of the fused backlogs and are
// the fastest schedule there, which gradlane finds from its trials.
TEST(SimulatorTest, GradlaneTriesTheRulesWithBiggerBlocks) {
  SimConfig c;
  c.workers = 8;
  c.bandwidth_bits_per_s = 10e9;
  const VariantRuns runs =
      SimulateVariantRulesAndGradlane("squeezenet1_1.json", c, GradlaneVariant::kDoubleBlocks);
  ExpectGradlaneKeepsTheFasterVariant(runs, "gradlane-rules-blocks*2");
  ASSERT_FALSE(runs.rules.links.empty());
  ASSERT_FALSE(runs.variant.links.empty());
  EXPECT_LT(runs.variant.links[0].up_messages, 0.75 * runs.rules.links[0].up_messages)
      << "because they are fewer messages";
}

TEST(SimulatorTest, ConfiguredPrioritiesReachThePolicies) {
  // Reversing the priorities (output layer most urgent) sends first what the next forward
  // needs last: a priority policy gets slower. The ideal bound ignores them (it always sends in
  // the order the next forward consumes, the optimum), so it does not change.
  const ModelProfile p = Uniform(12, 4'000'000, 10'000, 20'000);
  SimConfig c = SmallConfig(1e9);
  c.bandwidth_bits_per_s = 2.0 * 2 / 3 * p.TotalParamBytes() * 8 / (p.ComputeNs() * 1e-9);
  SimConfig reversed = c;
  for (int i = 0; i < 12; ++i) reversed.priorities.push_back(11 - i);
  const PolicyFactory prio = ReferencePolicies()[1].factory;
  absl::StatusOr<SimResult> by_index = Simulate(p, c, prio, "prio");
  absl::StatusOr<SimResult> by_reverse = Simulate(p, reversed, prio, "prio");
  ASSERT_TRUE(by_index.ok() && by_reverse.ok());
  EXPECT_LT(by_index->mean_iteration_ns, 0.95 * by_reverse->mean_iteration_ns);
  absl::StatusOr<SimResult> ideal_index = SimulateIdeal(p, c);
  absl::StatusOr<SimResult> ideal_reverse = SimulateIdeal(p, reversed);
  ASSERT_TRUE(ideal_index.ok() && ideal_reverse.ok());
  EXPECT_EQ(ideal_index->iteration_ns, ideal_reverse->iteration_ns);
  EXPECT_LT(ideal_index->total_ns, by_reverse->total_ns);
}

TEST(SimulatorTest, AStalledPolicyIsAnErrorNotAHang) {
  const ModelProfile p = Uniform(2, 1000, 10, 10);
  absl::StatusOr<SimResult> r = Simulate(
      p, SmallConfig(1e9),
      [] { return absl::StatusOr<std::unique_ptr<Policy>>(std::make_unique<Mute>()); }, "mute");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("stalled"));
}

TEST(SimulatorTest, APolicyThatSpinsWithoutProgressIsAnErrorNotAHang) {
  const ModelProfile p = Uniform(2, 1000, 10, 10);
  SimConfig c = SmallConfig(1e9);
  c.max_events_without_progress = 100'000;
  absl::StatusOr<SimResult> r = Simulate(
      p, c, [] { return absl::StatusOr<std::unique_ptr<Policy>>(std::make_unique<Spinner>()); },
      "spinner");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no progress"));
}

TEST(SimulatorTest, TheProgressGuardDoesNotCapALongRunThatProgresses) {
  // The guard counts events since a layer's compute last finished, not in the whole run: a run
  // of many more events than the guard, each layer's wait far below it, completes.
  const ModelProfile p = Uniform(8, 200'000, 50, 50);
  SimConfig c = SmallConfig(1e9);
  c.measured_iterations = 20;
  const PolicyFactory f = ReferencePolicies()[1].factory;
  absl::StatusOr<SimResult> unguarded = Simulate(p, c, f, "ref");
  ASSERT_TRUE(unguarded.ok()) << unguarded.status();
  c.max_events_without_progress = unguarded->events / 10;
  absl::StatusOr<SimResult> guarded = Simulate(p, c, f, "ref");
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  EXPECT_EQ(guarded->events, unguarded->events);
  EXPECT_EQ(guarded->mean_iteration_ns, unguarded->mean_iteration_ns);
}

TEST(SimulatorTest, ContractBreachesAreErrors) {
  const ModelProfile p = Uniform(3, 1'000'000, 10, 10);
  for (Broken::Fault fault : {Broken::kWrongPeer, Broken::kTwice}) {
    absl::StatusOr<SimResult> r = Simulate(
        p, SmallConfig(1e9),
        [fault] {
          return absl::StatusOr<std::unique_ptr<Policy>>(std::make_unique<Broken>(fault));
        },
        "broken");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr(fault == Broken::kWrongPeer ? "invalid segment" : "byte twice"));
  }
}

TEST(SimulatorTest, InvalidConfigsAreRejected) {
  const ModelProfile p = Uniform(2, 1000, 10, 10);
  const PolicyFactory f = ReferencePolicies()[0].factory;
  auto expect_invalid = [&](SimConfig c) {
    absl::StatusOr<SimResult> r = Simulate(p, c, f, "x");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(SimulateIdeal(p, c).status().code(), absl::StatusCode::kInvalidArgument);
  };
  SimConfig c = SmallConfig(1e9);
  c.workers = 0;
  expect_invalid(c);
  c = SmallConfig(0);
  expect_invalid(c);
  c = SmallConfig(1e9);
  c.measured_iterations = 0;
  expect_invalid(c);
  c = SmallConfig(1e9);
  c.latency_ns = -1;
  expect_invalid(c);
  c = SmallConfig(1e9);
  c.priorities = {0};
  expect_invalid(c);
  c = SmallConfig(1e9);
  c.shard_partition_bytes = 0;
  expect_invalid(c);
  c = SmallConfig(1e9);
  c.start_skew_ns = -1;
  expect_invalid(c);

  // Inputs that would exhaust memory or overflow virtual time are refused, not attempted.
  const ModelProfile huge = Uniform(2, 1'000'000'000'000, 10, 10);
  c = SmallConfig(1e9);
  c.shard_partition_bytes = 1024;  // 2·10^9 shard partitions
  EXPECT_THAT(std::string(Simulate(huge, c, f, "x").status().message()),
              HasSubstr("shard partitions"));
  c = SmallConfig(1);  // 1 bit/s: 10^12 bytes take longer than TimeNs can count
  EXPECT_THAT(std::string(SimulateIdeal(huge, c).status().message()), HasSubstr("10^18 ns"));
  c = SmallConfig(1e9);
  c.measured_iterations = 100000;
  EXPECT_THAT(std::string(Simulate(Uniform(200, 1000, 10, 10), c, f, "x").status().message()),
              HasSubstr("2^25"));
}

// --- All-reduce mode (SimConfig::mode = SimMode::kAllReduce).

SimConfig AllReduce(SimConfig c) {
  c.mode = SimMode::kAllReduce;
  return c;
}

TEST(AllReduceSimTest, OneTensorRingMatchesTheHandComputedTime) {
  // One tensor of W MiB in one partition: W chunks of 1 MiB. No compute overlaps the ring, so
  // per iteration: fwd + bwd, then 2(W−1) steps of θ + latency + 1 MiB/B each (every host sends
  // one chunk per step, so no link carries two messages at once), and W−1 reductions of
  // 2 MiB of input at 10 GB/s = 209 715.2 ns -> 209 715 ns.
  for (int w : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("W=", w));
    const ModelProfile p =
        MustParse(absl::StrCat(R"({"model": "one", "layers": [{"name": "w", "param_bytes": )",
                               w * 1048576, R"(, "fwd_us": 1000, "bwd_us": 2000}]})"));
    SimConfig c;
    c.workers = w;
    c.bandwidth_bits_per_s = 1e9;
    c.overhead_ns = 50'000;
    c.latency_ns = 25'000;
    c.aggregation_bytes_per_s = 10e9;
    c.warmup_iterations = 1;
    c.measured_iterations = 3;
    c.ideal_granularity_bytes = 16384;
    c = AllReduce(c);
    const TimeNs step = 50'000 + 25'000 + 8'388'608;
    const TimeNs expected = 3'000'000 + 2 * (w - 1) * step + (w - 1) * 209'715;
    for (const NamedFactory& f : AllPolicies()) {
      // Those that cut a 1 MiB chunk into several messages (each paying θ) or hold the next
      // step until the previous one's ack is back: not this formula.
      if (f.name == "ref-stop-and-wait-256k" || f.name == "p3" || f.name == "prophet" ||
          f.name == "gradlane" || f.name == "gradlane-rules") {
        continue;
      }
      SCOPED_TRACE(f.name);
      absl::StatusOr<SimResult> r = Simulate(p, c, f.factory, f.name);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->iteration_ns.size(), 3u);
      for (TimeNs t : r->iteration_ns) EXPECT_EQ(t, expected);
      ASSERT_EQ(r->links.size(), static_cast<size_t>(w));
      for (const LinkStats& l : r->links) {
        // 2(W−1)/W of the tensor's bytes each way: one 1 MiB message per step.
        EXPECT_DOUBLE_EQ(l.up_bytes, 2.0 * (w - 1) * 1048576);
        EXPECT_DOUBLE_EQ(l.down_bytes, 2.0 * (w - 1) * 1048576);
        EXPECT_DOUBLE_EQ(l.up_messages, 2.0 * (w - 1));
        EXPECT_DOUBLE_EQ(l.up_busy_ns, 2.0 * (w - 1) * (50'000 + 8'388'608));
      }
      EXPECT_NEAR(r->rho, 2.0 * (w - 1) / w * w * 1048576 * 8 / 1e9 / 3e-3, 1e-9);
    }
    // The bound: the same 2(W−1) hops with neither θ nor summing time, each 1 ns per 4 KiB
    // shorter (256 ns); the ports (2(W−1) MiB per uplink, then one latency) finish earlier.
    absl::StatusOr<SimResult> ideal = SimulateIdeal(p, c);
    ASSERT_TRUE(ideal.ok()) << ideal.status();
    for (TimeNs t : ideal->iteration_ns) {
      EXPECT_EQ(t, 3'000'000 + 2 * (w - 1) * (25'000 + 8'388'608 - 256));
    }
    for (const LinkStats& l : ideal->links) {
      EXPECT_DOUBLE_EQ(l.up_bytes, 2.0 * (w - 1) * 1048576);
    }
  }
}

TEST(AllReduceSimTest, ChunksAreElementAlignedAndEveryHostSendsItsShare) {
  // 1 000 003 bytes in 4 MiB partitions: 250 000 elements + 3 bytes, W = 3: chunks of 83 333,
  // 83 333 and 83 334 elements (+ 3 bytes). Host h sends a reduce-scatter hop of chunks at
  // distance 0..W−2 and an all-gather hop of those at distance W−1 and 0..W−3 from its start.
  const ModelProfile p = Uniform(2, 1'000'003, 500, 1000);
  SimConfig c = AllReduce(SmallConfig(5e9));
  for (const NamedFactory& f : AllPolicies()) {
    SCOPED_TRACE(f.name);
    absl::StatusOr<SimResult> r = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<double> chunk = {333'332, 333'332, 333'339};
    double up = 0;
    for (int h = 0; h < 3; ++h) {
      // W = 3: host h starts chunk h's ring (sends it in both phases), sends chunk h−1 on
      // (reduce-scatter) and its own sum, chunk h+1 (all-gather): its tensor's bytes plus chunk h.
      const double mine = 1'000'003 + chunk[h];
      EXPECT_DOUBLE_EQ(r->links[h].up_bytes, 2 * mine) << h;         // two tensors
      EXPECT_DOUBLE_EQ(r->links[(h + 1) % 3].down_bytes, 2 * mine);  // all to the right
      up += r->links[h].up_bytes;
    }
    EXPECT_DOUBLE_EQ(up, 2.0 * 2 * 2 * 1'000'003);  // 2(W−1) of W chunks of each tensor
  }
}

// Records, per host, the tensor of every segment a policy dispatches (and when).
class Recording : public RefPriority {
 public:
  using Log = std::vector<std::pair<TimeNs, uint32_t>>;
  Recording(uint64_t partition, uint64_t credit, std::shared_ptr<Log> log)
      : RefPriority(partition, credit), log_(std::move(log)) {}
  bool NextDispatch(TimeNs now, Dispatch& out) override {
    if (!RefPriority::NextDispatch(now, out)) return false;
    for (const Segment& s : out.segments) {
      if (s.iteration == 1) log_->emplace_back(now, KeyTensor(s.key));
    }
    return true;
  }

 private:
  std::shared_ptr<Log> log_;
};

TEST(AllReduceSimTest, AnUrgentTensorsRingStepsOvertakeALessUrgentOnes) {
  // Layer 1 (24 MiB, 6 partitions) is ready 10 ms into backward, layer 0 (3 MiB) 10 ms later,
  // with layer 1's ring steps queued on every host. A priority policy sends layer 0's steps
  // between layer 1's partitions: layer 0's result is back long before layer 1's, its 100 ms
  // forward overlaps layer 1's ring, and the iteration is shorter than with FIFO.
  const ModelProfile p = MustParse(R"({"model": "two", "layers": [
      {"name": "first", "param_bytes": 3145728, "fwd_us": 100000, "bwd_us": 10000},
      {"name": "big", "param_bytes": 25165824, "fwd_us": 1000, "bwd_us": 10000}]})");
  SimConfig c = AllReduce(SmallConfig(1e9));
  auto log = std::make_shared<Recording::Log>();
  const PolicyFactory recording = [log] {
    return absl::StatusOr<std::unique_ptr<Policy>>(
        std::make_unique<Recording>(1 << 20, 2 << 20, log));
  };
  absl::StatusOr<SimResult> prio = Simulate(p, c, recording, "prio");
  absl::StatusOr<SimResult> fifo = Simulate(p, c, ReferencePolicies()[0].factory, "fifo");
  ASSERT_TRUE(prio.ok() && fifo.ok());
  EXPECT_LT(prio->mean_iteration_ns, 0.9 * fifo->mean_iteration_ns);
  // In iteration 1, the last segment of layer 0 leaves well before the last of layer 1, though
  // layer 1 was ready first and was still being sent when layer 0 became ready.
  TimeNs first_big = kNever, last_first = 0, last_big = 0, first_first = kNever;
  for (const auto& [t, tensor] : *log) {
    if (tensor == 0) {
      first_first = std::min(first_first, t);
      last_first = std::max(last_first, t);
    } else {
      first_big = std::min(first_big, t);
      last_big = std::max(last_big, t);
    }
  }
  EXPECT_LT(first_big, first_first);
  EXPECT_LT(last_first, last_big);
  EXPECT_LT(last_first - first_first, (last_big - first_big) / 2);
  // The configured priorities reach the policies: reversed, layer 1 goes first and the
  // iteration gets longer; the bound ignores them.
  SimConfig reversed = c;
  reversed.priorities = {1, 0};
  absl::StatusOr<SimResult> by_reverse = Simulate(p, reversed, recording, "prio");
  ASSERT_TRUE(by_reverse.ok());
  EXPECT_LT(prio->mean_iteration_ns, 0.9 * by_reverse->mean_iteration_ns);
  absl::StatusOr<SimResult> ideal = SimulateIdeal(p, c);
  absl::StatusOr<SimResult> ideal_reverse = SimulateIdeal(p, reversed);
  ASSERT_TRUE(ideal.ok() && ideal_reverse.ok());
  EXPECT_EQ(ideal->iteration_ns, ideal_reverse->iteration_ns);
  EXPECT_LE(ideal->total_ns, prio->total_ns);
}

// A ring under gradlane's rules has two steady states where hosts forward their chunks in
// the order of their offsets: in step, from an in-step start, and staggered around the ring
// (each host starting its iteration up to a millisecond after its left neighbour), from any
// other start — daemons never start in step — or after a few iterations of another schedule,
// such as gradlane's trials (tiny, 3 Gbit/s, W = 8, ρ = 1: 66.5 ms in step, 76–78 ms staggered).
// Forwarded in the order they arrived (ReadyRange::ring_hop), the hops pull the ring into step
// from any start, and gradlane after its trials runs as fast as its rules from an in-step one.
TEST(AllReduceSimTest, RingHopsInArrivalOrderPullAStaggeredRingIntoStep) {
  ModelProfile p = ProfileNamed("tiny.json");
  ASSERT_FALSE(p.layers.empty()) << "tests/data/models/tiny.json";
  SimConfig c = AllReduce(SimConfig{});
  c.workers = 8;
  c.bandwidth_bits_per_s = 3e9;
  c.warmup_iterations = kLatestChoiceIteration + 3;
  ASSERT_TRUE(ScaleComputeToRho(p, c, 1.0));
  const uint64_t unit = ShardUnitBytes(p, c);
  auto run = [&](const char* name, TimeNs skew) {
    SimConfig sc = c;
    sc.start_skew_ns = skew;
    absl::StatusOr<SimResult> r = Simulate(
        p, sc, [&] { return MakePolicy(SimPolicyConfig(name, sc, unit)); }, name);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status();
    return r.ok() ? r->mean_iteration_ns : 0.0;
  };
  const double in_step = run("gradlane-rules", 0);
  ASSERT_GT(in_step, 0);
  for (TimeNs skew : {100 * kMicrosecond, 1000 * kMicrosecond}) {
    SCOPED_TRACE(absl::StrCat("hosts starting ", skew, " ns one after another"));
    EXPECT_LE(run("gradlane-rules", skew), 1.02 * in_step);
    EXPECT_LE(run("gradlane", skew), 1.02 * in_step);
  }
  EXPECT_LE(run("gradlane", 0), 1.02 * in_step) << "after the trials";
}

TEST(AllReduceSimTest, SameInputsGiveIdenticalResults) {
  const auto profiles = Profiles();
  const ModelProfile& p = profiles.back().second;
  const SimConfig c = AllReduce(SmallConfig(2e9));
  for (const NamedFactory& f : AllPolicies()) {
    absl::StatusOr<SimResult> a = Simulate(p, c, f.factory, f.name);
    absl::StatusOr<SimResult> b = Simulate(p, c, f.factory, f.name);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->iteration_ns, b->iteration_ns) << f.name;
    EXPECT_EQ(a->events, b->events) << f.name;
    for (size_t h = 0; h < a->links.size(); ++h) {
      EXPECT_EQ(a->links[h].up_busy_ns, b->links[h].up_busy_ns) << f.name;
    }
    // Not the ps run under another name.
    absl::StatusOr<SimResult> ps = Simulate(p, SmallConfig(2e9), f.factory, f.name);
    ASSERT_TRUE(ps.ok());
    EXPECT_NE(a->events, ps->events) << f.name;
  }
  absl::StatusOr<SimResult> a = SimulateIdeal(p, c);
  absl::StatusOr<SimResult> b = SimulateIdeal(p, c);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->iteration_ns, b->iteration_ns);
  EXPECT_EQ(a->events, b->events);
}

TEST(AllReduceSimTest, FreeNetworkOrOneWorkerGivesPureComputeTime) {
  for (const auto& [name, profile] : Profiles()) {
    SimConfig c = AllReduce(SmallConfig(1e30));
    c.overhead_ns = 0;
    c.latency_ns = 0;
    c.aggregation_bytes_per_s = 0;
    for (const NamedFactory& f : AllPolicies()) {
      SCOPED_TRACE(absl::StrCat(name, " / ", f.name));
      absl::StatusOr<SimResult> r = Simulate(profile, c, f.factory, f.name);
      ASSERT_TRUE(r.ok()) << r.status();
      for (TimeNs t : r->iteration_ns) EXPECT_EQ(t, profile.ComputeNs());
    }
    absl::StatusOr<SimResult> ideal = SimulateIdeal(profile, c);
    ASSERT_TRUE(ideal.ok()) << ideal.status();
    for (TimeNs t : ideal->iteration_ns) EXPECT_EQ(t, profile.ComputeNs()) << name;
  }
  const ModelProfile p = Uniform(4, 1 << 20, 300, 600);
  SimConfig one = AllReduce(SmallConfig(1e6));
  one.workers = 1;
  absl::StatusOr<SimResult> r = Simulate(p, one, ReferencePolicies()[0].factory, "fifo");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->mean_iteration_ns, p.ComputeNs());
  EXPECT_DOUBLE_EQ(r->links[0].up_bytes, 0);
  absl::StatusOr<SimResult> ideal = SimulateIdeal(p, one);
  ASSERT_TRUE(ideal.ok()) << ideal.status();
  EXPECT_DOUBLE_EQ(ideal->mean_iteration_ns, p.ComputeNs());
}

TEST(AllReduceSimTest, BoundIsBelowEveryPolicyOnEveryProfileAndBandwidth) {
  for (const auto& [name, profile] : Profiles()) {
    for (double gbit : Bandwidths({1.0, 10.0})) {
      const SimConfig c = AllReduce(SmallConfig(gbit * 1e9));
      absl::StatusOr<SimResult> ideal = SimulateIdeal(profile, c);
      ASSERT_TRUE(ideal.ok()) << ideal.status();
      EXPECT_GE(ideal->mean_iteration_ns, static_cast<double>(profile.ComputeNs()));
      for (const NamedFactory& f : AllPolicies()) {
        SCOPED_TRACE(absl::StrCat(name, " at ", gbit, " Gbit/s: ", f.name));
        absl::StatusOr<SimResult> r = Simulate(profile, c, f.factory, f.name);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_LE(ideal->total_ns, r->total_ns);
        // Every policy and the bound's ports move the same bytes per uplink.
        for (size_t h = 0; h < r->links.size(); ++h) {
          EXPECT_DOUBLE_EQ(r->links[h].up_bytes, ideal->links[h].up_bytes);
        }
        EXPECT_DOUBLE_EQ(r->comm_ns, ideal->comm_ns);
      }
    }
  }
}

// The all-reduce bound against many small random models and configs: W = 1–5, θ 0 or 50 µs,
// random latency, summing rate, partition size, stepwise ready times and priorities (the bound
// ignores them; policies follow them), every policy plus a priority policy with random δ and
// credit. Seeded: a failure is reproducible. GRADLANE_SIM_TRIALS=N runs N trials instead of 150
// (and GRADLANE_SIM_SEED another seed), for a longer search.
TEST(AllReduceSimTest, BoundHoldsOnRandomSmallModels) {
  const char* trials_env = std::getenv("GRADLANE_SIM_TRIALS");
  const char* seed_env = std::getenv("GRADLANE_SIM_SEED");
  const int trials = trials_env != nullptr ? std::atoi(trials_env) : 150;
  std::mt19937_64 rng(seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 20261126);
  auto uniform = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  for (int trial = 0; trial < trials; ++trial) {
    const int layers = static_cast<int>(uniform(1, 6));
    const std::string json = RandomModelJson(layers, /*tiny=*/true, uniform);
    const ModelProfile p = MustParse(json);
    SimConfig c = AllReduce(SmallConfig(1e9 * static_cast<double>(uniform(1, 40)) / 4));
    c.workers = static_cast<int>(uniform(1, 5));
    c.overhead_ns = static_cast<TimeNs>(uniform(0, 1) * 50'000);
    c.latency_ns = static_cast<TimeNs>(uniform(0, 50'000));
    c.aggregation_bytes_per_s = uniform(0, 1) ? 0 : 20e9;
    c.shard_partition_bytes = uniform(1, 16) << 18;
    if (uniform(0, 1)) {
      for (int i = 0; i < layers; ++i) c.priorities.push_back(static_cast<Priority>(i));
      std::shuffle(c.priorities.begin(), c.priorities.end(), rng);
    }
    const uint64_t skewed = uniform(0, 1);  // (two draws, in this order: reproducible)
    c.start_skew_ns = static_cast<TimeNs>(skewed * uniform(0, 2'000'000));
    SCOPED_TRACE(absl::StrCat(
        "trial ", trial, ": W=", c.workers, " B=", c.bandwidth_bits_per_s, " θ=", c.overhead_ns,
        " latency=", c.latency_ns, " start skew=", c.start_skew_ns,
        " aggregation=", c.aggregation_bytes_per_s, " partition=", c.shard_partition_bytes,
        " priorities=", c.priorities.size(), " ", json));
    absl::StatusOr<SimResult> ideal = SimulateIdeal(p, c);
    ASSERT_TRUE(ideal.ok()) << ideal.status();
    EXPECT_GE(ideal->total_ns, p.ComputeNs() * (c.warmup_iterations + c.measured_iterations));
    const uint64_t partition = uniform(1, 16) << 16;  // (drawn in this order: reproducible)
    ExpectNoPolicyBeats(p, c, ideal->total_ns, partition, uniform(1, 4));
  }
}

TEST(AllReduceSimTest, ContractBreachesAndStallsAreErrors) {
  const ModelProfile p = Uniform(3, 1'000'000, 10, 10);
  const SimConfig c = AllReduce(SmallConfig(1e9));
  for (Broken::Fault fault : {Broken::kWrongPeer, Broken::kTwice}) {
    absl::StatusOr<SimResult> r = Simulate(
        p, c,
        [fault] {
          return absl::StatusOr<std::unique_ptr<Policy>>(std::make_unique<Broken>(fault));
        },
        "broken");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr(fault == Broken::kWrongPeer ? "invalid segment" : "byte twice"));
  }
  absl::StatusOr<SimResult> r = Simulate(
      p, c, [] { return absl::StatusOr<std::unique_ptr<Policy>>(std::make_unique<Mute>()); },
      "mute");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("stalled"));
  EXPECT_EQ(SimulateFluid(p, c).status().code(), absl::StatusCode::kInvalidArgument);
  // A ring the simulator could only run by exhausting memory is refused up front.
  SimConfig huge = AllReduce(SmallConfig(1e9));
  huge.workers = 4096;
  absl::StatusOr<SimResult> big =
      Simulate(Uniform(2, 100'000'000, 10, 10), huge, ReferencePolicies()[0].factory, "fifo");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("ring hops"));
}

}  // namespace
}  // namespace gradlane::sched::sim
