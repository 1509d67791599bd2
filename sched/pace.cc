#include "sched/pace.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace gradlane::sched {

TimeNs AllReduceCost::Time(uint64_t bytes) const {
  return fixed + static_cast<TimeNs>(std::ceil(static_cast<double>(bytes) * ns_per_byte));
}

absl::StatusOr<AllReduceCost> RingAllReduceCost(int workers, double link_bytes_per_s,
                                                double reduce_bytes_per_s, TimeNs fixed) {
  if (workers < 1) return absl::InvalidArgumentError("all-reduce needs at least one worker");
  if (!(link_bytes_per_s > 0) || !(reduce_bytes_per_s > 0) || !std::isfinite(link_bytes_per_s) ||
      !std::isfinite(reduce_bytes_per_s)) {
    return absl::InvalidArgumentError("link and reduction rates must be positive");
  }
  if (fixed < 0) return absl::InvalidArgumentError("fixed all-reduce overhead is negative");
  const double w = workers;
  const double per_byte_s =
      (2.0 * (w - 1) / w) / link_bytes_per_s + ((w - 1) / w) / reduce_bytes_per_s;
  return AllReduceCost{fixed, per_byte_s * 1e9};
}

PaceInstance BuildPaceInstance(const Dag& dag, const AllReduceCost& cost) {
  const int n = dag.num_ops();
  // Earliest completion with unlimited compute devices and this iteration's recvs done at 0.
  std::vector<TimeNs> z(n, 0);
  for (int32_t op : dag.topo_order()) {
    TimeNs start = 0;
    for (int32_t d : dag.ops()[op].deps) start = std::max(start, z[d]);
    z[op] = start + (dag.ops()[op].kind == OpKind::kCompute ? dag.ops()[op].duration : 0);
  }
  // Longest compute path from an op (itself included) to a sink.
  std::vector<TimeNs> tail(n, 0);
  for (auto it = dag.topo_order().rbegin(); it != dag.topo_order().rend(); ++it) {
    const int32_t op = *it;
    TimeNs after = 0;
    for (int32_t s : dag.successors(op)) after = std::max(after, tail[s]);
    tail[op] = after + (dag.ops()[op].kind == OpKind::kCompute ? dag.ops()[op].duration : 0);
  }

  PaceInstance inst;
  for (int t = 0; t < dag.num_tensors(); ++t) {
    PaceJob job;
    const int32_t send = dag.send_of(t);
    const int32_t recv = dag.recv_of(t);
    job.release = send >= 0 ? z[send] : 0;
    job.tail = recv >= 0 ? tail[recv] : 0;
    job.duration = cost.Time(dag.tensors()[t].bytes);
    inst.tensor.push_back(t);
    inst.jobs.push_back(job);
    inst.bytes.push_back(dag.tensors()[t].bytes);
  }
  for (int op = 0; op < n; ++op) {
    if (dag.ops()[op].kind == OpKind::kCompute && dag.ops()[op].deps.empty()) {
      inst.compute_floor = std::max(inst.compute_floor, tail[op]);
    }
  }
  return inst;
}

TimeNs PaceObjective(absl::Span<const PaceJob> jobs, absl::Span<const TimeNs> completion) {
  TimeNs obj = 0;
  for (size_t i = 0; i < jobs.size(); ++i) obj = std::max(obj, completion[i] + jobs[i].tail);
  return obj;
}

absl::StatusOr<PreemptiveSchedule> HornSchedule(absl::Span<const PaceJob> jobs) {
  const int n = static_cast<int>(jobs.size());
  for (int i = 0; i < n; ++i) {
    if (jobs[i].release < 0 || jobs[i].duration < 0 || jobs[i].tail < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", i, " has a negative release, duration or tail"));
    }
  }
  PreemptiveSchedule out;
  out.completion.assign(n, -1);
  std::vector<TimeNs> left(n);
  for (int i = 0; i < n; ++i) left[i] = jobs[i].duration;
  int unfinished = n;
  TimeNs t = 0;
  // Ranking used by the rule: larger tail, then earlier release, then lower index.
  auto more_urgent = [&](int a, int b) {
    if (jobs[a].tail != jobs[b].tail) return jobs[a].tail > jobs[b].tail;
    if (jobs[a].release != jobs[b].release) return jobs[a].release < jobs[b].release;
    return a < b;
  };
  while (unfinished > 0) {
    int pick = -1;
    TimeNs next_release = kNever;
    for (int i = 0; i < n; ++i) {
      if (out.completion[i] >= 0) continue;
      if (jobs[i].release <= t) {
        if (pick < 0 || more_urgent(i, pick)) pick = i;
      } else {
        next_release = std::min(next_release, jobs[i].release);
      }
    }
    if (pick < 0) {  // link idle until the next gradient is ready
      t = next_release;
      continue;
    }
    // Only a release can change the choice before `pick` finishes.
    const TimeNs end = std::min(t + left[pick], next_release);
    if (end > t) {
      if (!out.slices.empty() && out.slices.back().job == pick && out.slices.back().end == t) {
        out.slices.back().end = end;
      } else {
        if (!out.slices.empty() && out.completion[out.slices.back().job] < 0) ++out.preemptions;
        out.slices.push_back({pick, t, end});
      }
    }
    left[pick] -= end - t;
    t = end;
    if (left[pick] == 0) {
      out.completion[pick] = t;
      --unfinished;
    }
  }
  out.objective = PaceObjective(jobs, out.completion);
  return out;
}

std::vector<Priority> PacePriorities(absl::Span<const PaceJob> jobs) {
  std::vector<int> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (jobs[a].tail != jobs[b].tail) return jobs[a].tail > jobs[b].tail;
    return jobs[a].release < jobs[b].release;
  });
  std::vector<Priority> prio(jobs.size());
  for (size_t k = 0; k < order.size(); ++k) prio[order[k]] = static_cast<Priority>(k);
  return prio;
}

absl::StatusOr<PacePlan> PlanPace(const Dag& dag, const AllReduceCost& cost) {
  if (cost.fixed < 0 || !(cost.ns_per_byte >= 0)) {
    return absl::InvalidArgumentError("all-reduce cost must be non-negative");
  }
  PacePlan plan;
  plan.instance = BuildPaceInstance(dag, cost);
  absl::StatusOr<PreemptiveSchedule> sched = HornSchedule(plan.instance.jobs);
  if (!sched.ok()) return sched.status();
  plan.schedule = *std::move(sched);
  const std::vector<Priority> by_job = PacePriorities(plan.instance.jobs);
  plan.priority.assign(dag.num_tensors(), 0);
  for (size_t k = 0; k < by_job.size(); ++k) plan.priority[plan.instance.tensor[k]] = by_job[k];
  plan.iteration_time = std::max(plan.schedule.objective, plan.instance.compute_floor);
  return plan;
}

}  // namespace gradlane::sched
