#include "sched/fusion.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace gradlane::sched {
namespace {

// MaxMinSize(suffix starting at k, R) for every k and R ≤ max_r, memoised bottom-up (the paper
// memoises the recursion; Theorem 3). -1 marks an infeasible (suffix, R) pair: sizes are
// non-negative, so -1 is below every feasible value, like the paper's −∞.
class MaxMinTable {
 public:
  static absl::StatusOr<MaxMinTable> Build(absl::Span<const uint64_t> sizes, int max_r) {
    MaxMinTable table;
    const int n = static_cast<int>(sizes.size());
    table.n_ = n;
    table.max_r_ = max_r;
    table.prefix_.assign(n + 1, 0);
    for (int i = 0; i < n; ++i) {
      if (sizes[i] >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - table.prefix_[i]) {
        return absl::InvalidArgumentError("tensor sizes sum past 2^63 bytes");
      }
      table.prefix_[i + 1] = table.prefix_[i] + static_cast<int64_t>(sizes[i]);
    }
    table.best_.assign(static_cast<size_t>(max_r) * (n + 1), -1);
    table.choice_.assign(static_cast<size_t>(max_r) * (n + 1), -1);
    for (int k = 0; k < n; ++k) table.at(1, k) = table.prefix_[n] - table.prefix_[k];
    for (int r = 2; r <= max_r; ++r) {
      for (int k = 0; k + r <= n; ++k) {
        int64_t best = -1;
        int32_t choice = -1;
        // The first group is [k, j); the rest must keep r-1 non-empty groups.
        for (int j = k + 1; j <= n - (r - 1); ++j) {
          const int64_t v = std::min(table.prefix_[j] - table.prefix_[k], table.at(r - 1, j));
          if (v > best) {
            best = v;
            choice = j;
          }
        }
        table.at(r, k) = best;
        table.choice(r, k) = choice;
      }
    }
    return table;
  }

  ChainPartition Partition(int r) const {
    ChainPartition out;
    out.min_group_bytes = static_cast<uint64_t>(best(r, 0));
    int k = 0;
    for (int left = r; left > 1; --left) {
      k = choice_[static_cast<size_t>(left - 1) * (n_ + 1) + k];
      out.group_end.push_back(k);
    }
    out.group_end.push_back(n_);
    return out;
  }

 private:
  int64_t& at(int r, int k) { return best_[static_cast<size_t>(r - 1) * (n_ + 1) + k]; }
  int32_t& choice(int r, int k) { return choice_[static_cast<size_t>(r - 1) * (n_ + 1) + k]; }
  int64_t best(int r, int k) const { return best_[static_cast<size_t>(r - 1) * (n_ + 1) + k]; }

  int n_ = 0;
  int max_r_ = 0;
  std::vector<int64_t> prefix_;
  std::vector<int64_t> best_;
  std::vector<int32_t> choice_;
};

}  // namespace

absl::StatusOr<ChainPartition> MaxMinPartition(absl::Span<const uint64_t> sizes, int groups) {
  if (groups < 1 || groups > static_cast<int>(sizes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split a chain of ", sizes.size(),
                                                   " tensors into ", groups, " groups"));
  }
  absl::StatusOr<MaxMinTable> table = MaxMinTable::Build(sizes, groups);
  if (!table.ok()) return table.status();
  return table->Partition(groups);
}

absl::StatusOr<FusionPlan> BalancedFusion(const PaceInstance& unfused, const AllReduceCost& cost,
                                          int max_groups) {
  const int n = static_cast<int>(unfused.jobs.size());
  if (n == 0) return absl::InvalidArgumentError("nothing to fuse: no tensors");
  if (unfused.bytes.size() != unfused.jobs.size() || unfused.tensor.size() != unfused.jobs.size()) {
    return absl::InvalidArgumentError("instance needs one size and one tensor per job");
  }
  if (cost.fixed < 0 || !(cost.ns_per_byte >= 0)) {
    return absl::InvalidArgumentError("all-reduce cost must be non-negative");
  }
  if (max_groups < 0) return absl::InvalidArgumentError("max_groups must be >= 0");
  const int max_r = max_groups == 0 ? n : std::min(max_groups, n);

  // Line 1: the chain, by ready time (ties by index, so equal-release tensors keep DAG order).
  std::vector<int32_t> chain(n);
  std::iota(chain.begin(), chain.end(), 0);
  std::stable_sort(chain.begin(), chain.end(), [&](int32_t a, int32_t b) {
    return unfused.jobs[a].release < unfused.jobs[b].release;
  });
  std::vector<uint64_t> sizes(n);
  for (int i = 0; i < n; ++i) sizes[i] = unfused.bytes[chain[i]];
  absl::StatusOr<MaxMinTable> table = MaxMinTable::Build(sizes, max_r);
  if (!table.ok()) return table.status();

  FusionPlan best;
  bool have_best = false;
  for (int r = 1; r <= max_r; ++r) {
    const ChainPartition part = table->Partition(r);
    FusionPlan plan;
    plan.groups = r;
    plan.fused.compute_floor = unfused.compute_floor;
    int begin = 0;
    for (int32_t end : part.group_end) {
      std::vector<int32_t> members(chain.begin() + begin, chain.begin() + end);
      PaceJob job;
      uint64_t bytes = 0;
      for (int32_t m : members) {
        job.release = std::max(job.release, unfused.jobs[m].release);
        job.tail = std::max(job.tail, unfused.jobs[m].tail);
        bytes += unfused.bytes[m];
      }
      job.duration = cost.Time(bytes);
      plan.fused.tensor.push_back(unfused.tensor[members.front()]);
      plan.fused.jobs.push_back(job);
      plan.fused.bytes.push_back(bytes);
      plan.members.push_back(std::move(members));
      begin = end;
    }
    absl::StatusOr<PreemptiveSchedule> sched = HornSchedule(plan.fused.jobs);
    if (!sched.ok()) return sched.status();
    plan.schedule = *std::move(sched);
    plan.iteration_time = std::max(plan.schedule.objective, plan.fused.compute_floor);
    if (!have_best || plan.iteration_time < best.iteration_time) {
      best = std::move(plan);
      have_best = true;
    }
  }
  return best;
}

absl::StatusOr<FusionPlan> BalancedFusion(const Dag& dag, const AllReduceCost& cost,
                                          int max_groups) {
  return BalancedFusion(BuildPaceInstance(dag, cost), cost, max_groups);
}

}  // namespace gradlane::sched
