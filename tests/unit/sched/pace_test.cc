#include "sched/pace.h"

#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

using ::testing::ElementsAre;

TEST(PaceHorn, PreemptsForTheLongerTail) {
  // A is released first but little waits on it; B arrives at 1 with a long tail: B runs at once,
  // A resumes after. y_A = 6, y_B = 3; objective max(6 + 1, 3 + 10) = 13.
  const std::vector<PaceJob> jobs = {{0, 4, 1}, {1, 2, 10}};
  const auto s = HornSchedule(jobs);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->completion, ElementsAre(6, 3));
  EXPECT_EQ(s->objective, 13);
  EXPECT_EQ(s->preemptions, 1);
  ASSERT_EQ(s->slices.size(), 3u);
  EXPECT_EQ(s->slices[0].job, 0);
  EXPECT_EQ(s->slices[1].job, 1);
  EXPECT_EQ(s->slices[1].start, 1);
  EXPECT_EQ(s->slices[2].job, 0);
  EXPECT_EQ(s->slices[2].end, 6);
  EXPECT_THAT(PacePriorities(jobs), ElementsAre(1, 0));
}

TEST(PaceHorn, IdlesUntilRelease) {
  const std::vector<PaceJob> jobs = {{5, 2, 0}};
  const auto s = HornSchedule(jobs);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->completion, ElementsAre(7));
  EXPECT_FALSE(HornSchedule(std::vector<PaceJob>{{-1, 1, 1}}).ok());
}

// Exact optimum of 1|r_j,pmtn|Lmax over all schedules that switch jobs only at integer times
// (every slot: run any released unfinished job, or idle), by memoised search.
TimeNs BruteForceObjective(const std::vector<PaceJob>& jobs) {
  const int n = static_cast<int>(jobs.size());
  TimeNs horizon = 0;
  for (const PaceJob& j : jobs) horizon = std::max(horizon, j.release);
  for (const PaceJob& j : jobs) horizon += j.duration;
  std::map<std::pair<TimeNs, std::vector<TimeNs>>, TimeNs> memo;
  constexpr TimeNs kInf = kNever / 4;
  std::function<TimeNs(TimeNs, std::vector<TimeNs>&)> best = [&](TimeNs t,
                                                                 std::vector<TimeNs>& left) {
    bool done = true;
    for (TimeNs l : left) done &= (l == 0);
    if (done) return TimeNs{0};
    if (t >= horizon) return kInf;
    auto key = std::make_pair(t, left);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    TimeNs result = best(t + 1, left);  // idle
    for (int i = 0; i < n; ++i) {
      if (left[i] == 0 || jobs[i].release > t) continue;
      --left[i];
      TimeNs v = best(t + 1, left);
      if (left[i] == 0) v = std::max(v, t + 1 + jobs[i].tail);
      ++left[i];
      result = std::min(result, v);
    }
    memo[key] = result;
    return result;
  };
  std::vector<TimeNs> left(n);
  TimeNs zero_jobs = 0;  // zero-length jobs complete at their release in any schedule
  for (int i = 0; i < n; ++i) {
    left[i] = jobs[i].duration;
    if (left[i] == 0) zero_jobs = std::max(zero_jobs, jobs[i].release + jobs[i].tail);
  }
  return std::max(best(0, left), zero_jobs);
}

// A random worker DAG: `k` tensors, each with a recv and a send; compute ops that depend on
// earlier compute ops and on recvs; each send waits for one or two compute ops.
Dag RandomDag(std::mt19937& rng, int k) {
  std::uniform_int_distribution<int> coin(0, 99);
  std::uniform_int_distribution<int> dur(0, 4);
  std::uniform_int_distribution<int> bytes(1, 3);
  const int m = 1 + static_cast<int>(rng() % 7);
  std::vector<DagTensor> tensors;
  std::vector<DagOp> ops;
  for (int t = 0; t < k; ++t) {
    tensors.push_back(
        {"t" + std::to_string(t), static_cast<uint32_t>(t), static_cast<uint64_t>(bytes(rng))});
    ops.push_back({"recv" + std::to_string(t), OpKind::kRecv, 0, t, {}});
  }
  const int first_compute = static_cast<int>(ops.size());
  for (int j = 0; j < m; ++j) {
    DagOp op{"c" + std::to_string(j), OpKind::kCompute, dur(rng), -1, {}};
    for (int p = first_compute; p < first_compute + j; ++p) {
      if (coin(rng) < 35) op.deps.push_back(p);
    }
    for (int t = 0; t < k; ++t) {
      if (coin(rng) < 30) op.deps.push_back(t);
    }
    ops.push_back(std::move(op));
  }
  for (int t = 0; t < k; ++t) {
    DagOp send{"send" + std::to_string(t), OpKind::kSend, 0, t, {}};
    send.deps.push_back(first_compute + static_cast<int>(rng() % m));
    const int other = first_compute + static_cast<int>(rng() % m);
    if (other != send.deps[0] && coin(rng) < 40) send.deps.push_back(other);
    ops.push_back(std::move(send));
  }
  absl::StatusOr<Dag> dag = Dag::Create(std::move(tensors), std::move(ops));
  EXPECT_TRUE(dag.ok()) << dag.status();
  return *std::move(dag);
}

TEST(PaceHorn, EqualsBruteForceOnRandomDags) {
  std::mt19937 rng(2020);
  const AllReduceCost cost{0, 1.0};  // g_i = bytes: 1..3 slots
  int nontrivial = 0;
  for (int instance = 0; instance < 200; ++instance) {
    const int k = 1 + static_cast<int>(rng() % 6);
    const Dag dag = RandomDag(rng, k);
    const PaceInstance inst = BuildPaceInstance(dag, cost);
    ASSERT_EQ(inst.jobs.size(), static_cast<size_t>(k));
    const auto horn = HornSchedule(inst.jobs);
    ASSERT_TRUE(horn.ok());

    // A feasible schedule: slices disjoint and ordered, never before release, exact durations.
    std::vector<TimeNs> served(k, 0), last_end(k, -1);
    TimeNs prev_end = 0;
    for (const ScheduleSlice& s : horn->slices) {
      ASSERT_GE(s.start, prev_end);
      ASSERT_LT(s.start, s.end);
      ASSERT_GE(s.start, inst.jobs[s.job].release);
      served[s.job] += s.end - s.start;
      last_end[s.job] = s.end;
      prev_end = s.end;
    }
    for (int i = 0; i < k; ++i) {
      ASSERT_EQ(served[i], inst.jobs[i].duration);
      if (inst.jobs[i].duration > 0) {
        ASSERT_EQ(horn->completion[i], last_end[i]);
      }
    }

    const TimeNs brute = BruteForceObjective(inst.jobs);
    ASSERT_EQ(horn->objective, brute) << "instance " << instance;
    if (horn->preemptions > 0) ++nontrivial;

    // A preemptive priority queue fed PacePriorities reproduces Horn's objective.
    const std::vector<Priority> prio = PacePriorities(inst.jobs);
    std::vector<TimeNs> left(k), done(k, -1);
    for (int i = 0; i < k; ++i) left[i] = inst.jobs[i].duration;
    int unfinished = k;
    for (int i = 0; i < k; ++i) {
      if (left[i] == 0) done[i] = inst.jobs[i].release, --unfinished;
    }
    for (TimeNs t = 0; unfinished > 0; ++t) {
      int pick = -1;
      for (int i = 0; i < k; ++i) {
        if (left[i] > 0 && inst.jobs[i].release <= t && (pick < 0 || prio[i] < prio[pick]))
          pick = i;
      }
      if (pick >= 0 && --left[pick] == 0) done[pick] = t + 1, --unfinished;
    }
    ASSERT_EQ(PaceObjective(inst.jobs, done), horn->objective);

    // Theorem 1: finishing each tensor's all-reduce at y_i, the DAG (ideal computation) ends at
    // max_i (y_i + L_i), or at the longest all-reduce-free compute path if that is longer.
    std::vector<TimeNs> z(dag.num_ops(), 0);
    for (int32_t op : dag.topo_order()) {
      const DagOp& o = dag.ops()[op];
      if (o.kind == OpKind::kRecv) {
        z[op] = horn->completion[o.tensor];
        continue;
      }
      TimeNs start = 0;
      for (int32_t d : o.deps) start = std::max(start, z[d]);
      z[op] = start + (o.kind == OpKind::kCompute ? o.duration : 0);
    }
    ASSERT_EQ(*std::max_element(z.begin(), z.end()), std::max(horn->objective, inst.compute_floor))
        << "instance " << instance;
  }
  EXPECT_GT(nontrivial, 10);  // preemption actually happens in the sample
}

TEST(PaceInstance, ChainReleasesAndTails) {
  const std::vector<ChainLayer> layers = {{"a", 10, 3, 5}, {"b", 20, 7, 11}, {"c", 30, 13, 17}};
  const Dag dag = *BuildChainDag(layers);
  const PaceInstance inst = BuildPaceInstance(dag, AllReduceCost{100, 2.0});
  TimeNs fwd = 0, bwd = 0;
  for (const ChainLayer& l : layers) fwd += l.fwd, bwd += l.bwd;
  for (int i = 0; i < 3; ++i) {
    TimeNs bwd_from_top = 0, fwd_from_i = 0;
    for (int j = i; j < 3; ++j) bwd_from_top += layers[j].bwd, fwd_from_i += layers[j].fwd;
    // Gradient i is ready after the whole forward and backward down to layer i; the next
    // forward from layer i on, then the whole backward, waits for it.
    EXPECT_EQ(inst.jobs[i].release, fwd + bwd_from_top) << i;
    EXPECT_EQ(inst.jobs[i].tail, fwd_from_i + bwd) << i;
    EXPECT_EQ(inst.jobs[i].duration, 100 + 2 * static_cast<TimeNs>(layers[i].param_bytes));
  }
  const auto plan = PlanPace(dag, AllReduceCost{100, 2.0});
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->priority, ElementsAre(0, 1, 2));  // forward order: largest L first
}

TEST(PaceCost, RingAllReduceFollowsEq1) {
  const auto cost = RingAllReduceCost(4, 1e9, 1e10, 50);
  ASSERT_TRUE(cost.ok());
  // (S/W)·2(W−1)/B + (S/W)(W−1)/G = 1e6·(1.5/1e9 + 0.75/1e10) s = 1.575 ms, plus 50 ns.
  EXPECT_EQ(cost->Time(1000000), 1575000 + 50);
  EXPECT_EQ(RingAllReduceCost(1, 1e9, 1e10)->Time(1000000), 0);  // one worker moves nothing
  EXPECT_FALSE(RingAllReduceCost(0, 1e9, 1e10).ok());
  EXPECT_FALSE(RingAllReduceCost(2, 0, 1e10).ok());
}

}  // namespace
}  // namespace gradlane::sched
