#include "sched/tictac.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace gradlane::sched {

std::vector<std::vector<int32_t>> FindDependencies(const Dag& dag) {
  // Bitsets over recv ops, propagated in topological order: the same sets as the paper's
  // depth-first post-order traversal, without recursion depth limits on deep models.
  const int n = dag.num_ops();
  std::vector<int32_t> recv_ops;
  std::vector<int32_t> recv_bit(n, -1);
  for (int i = 0; i < n; ++i) {
    if (dag.ops()[i].kind == OpKind::kRecv) {
      recv_bit[i] = static_cast<int32_t>(recv_ops.size());
      recv_ops.push_back(i);
    }
  }
  const size_t words = (recv_ops.size() + 63) / 64;
  std::vector<std::vector<uint64_t>> bits(n, std::vector<uint64_t>(words, 0));
  for (int32_t op : dag.topo_order()) {
    if (recv_bit[op] >= 0) bits[op][recv_bit[op] / 64] |= uint64_t{1} << (recv_bit[op] % 64);
    for (int32_t d : dag.ops()[op].deps) {
      for (size_t w = 0; w < words; ++w) bits[op][w] |= bits[d][w];
    }
  }
  std::vector<std::vector<int32_t>> deps(n);
  for (int i = 0; i < n; ++i) {
    for (size_t b = 0; b < recv_ops.size(); ++b) {
      if (bits[i][b / 64] >> (b % 64) & 1) deps[i].push_back(recv_ops[b]);
    }
  }
  return deps;
}

std::vector<RecvProperties> UpdateProperties(const Dag& dag,
                                             const std::vector<std::vector<int32_t>>& deps,
                                             absl::Span<const TimeNs> time,
                                             const std::vector<bool>& outstanding) {
  const int n = dag.num_ops();
  std::vector<int32_t> slot(n, -1);
  std::vector<RecvProperties> props;
  for (int i = 0; i < n; ++i) {
    if (dag.ops()[i].kind == OpKind::kRecv && outstanding[i]) {
      slot[i] = static_cast<int32_t>(props.size());
      props.push_back({i, time[i], 0, kInfiniteTime});
    }
  }
  for (int i = 0; i < n; ++i) {
    if (slot[i] >= 0) continue;  // op ∈ G − R only
    int count = 0;
    int32_t only = -1;
    TimeNs m = 0;  // op.M: transfer time of its outstanding dependencies
    for (int32_t r : deps[i]) {
      if (slot[r] < 0) continue;
      ++count;
      only = r;
      m += time[r];
    }
    if (count == 1 && dag.ops()[i].kind == OpKind::kCompute) {
      props[slot[only]].p += time[i];
    } else if (count > 1) {
      for (int32_t r : deps[i]) {
        if (slot[r] >= 0) props[slot[r]].m_plus = std::min(props[slot[r]].m_plus, m);
      }
    }
  }
  return props;
}

bool TacBefore(const RecvProperties& a, const RecvProperties& b) {
  // Eq. 2: T(A→B) = M_A + max{P_A, M_B} + P_B, so A first wins iff it overlaps more:
  // min{P_A, M_B} > min{P_B, M_A}.
  const TimeNs overlap_if_a_first = std::min(a.p, b.m);
  const TimeNs overlap_if_b_first = std::min(b.p, a.m);
  if (overlap_if_a_first != overlap_if_b_first) return overlap_if_a_first > overlap_if_b_first;
  // Case 2: no overlap to choose by; prefer the recv closest to activating a blocked op.
  return a.m_plus < b.m_plus;
}

std::vector<TimeNs> GeneralTimeOracle(const Dag& dag) {
  std::vector<TimeNs> time(dag.num_ops(), 0);
  for (int i = 0; i < dag.num_ops(); ++i) {
    if (dag.ops()[i].kind == OpKind::kRecv) time[i] = 1;
  }
  return time;
}

absl::StatusOr<std::vector<TimeNs>> LinkTimeOracle(const Dag& dag, double bytes_per_s) {
  if (!(bytes_per_s > 0) || !std::isfinite(bytes_per_s)) {
    return absl::InvalidArgumentError("link bandwidth must be a positive number of bytes/s");
  }
  std::vector<TimeNs> time(dag.num_ops(), 0);
  for (int i = 0; i < dag.num_ops(); ++i) {
    const DagOp& op = dag.ops()[i];
    if (op.kind == OpKind::kCompute) {
      time[i] = op.duration;
    } else {
      const double ns = static_cast<double>(dag.tensors()[op.tensor].bytes) * 1e9 / bytes_per_s;
      time[i] = static_cast<TimeNs>(std::ceil(ns));
    }
  }
  return time;
}

std::vector<Priority> TicPriorities(const Dag& dag) {
  const auto deps = FindDependencies(dag);
  const std::vector<TimeNs> time = GeneralTimeOracle(dag);
  std::vector<bool> outstanding(dag.num_ops(), false);
  for (int i = 0; i < dag.num_ops(); ++i) outstanding[i] = dag.ops()[i].kind == OpKind::kRecv;
  const std::vector<RecvProperties> props = UpdateProperties(dag, deps, time, outstanding);

  std::vector<TimeNs> levels;
  for (const RecvProperties& p : props) levels.push_back(p.m_plus);
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());

  const Priority unranked = static_cast<Priority>(levels.size());
  std::vector<Priority> prio(dag.num_tensors(), unranked);
  for (const RecvProperties& p : props) {
    prio[dag.ops()[p.op].tensor] = static_cast<Priority>(
        std::lower_bound(levels.begin(), levels.end(), p.m_plus) - levels.begin());
  }
  return prio;
}

absl::StatusOr<std::vector<Priority>> TacPriorities(const Dag& dag, absl::Span<const TimeNs> time) {
  if (static_cast<int>(time.size()) != dag.num_ops()) {
    return absl::InvalidArgumentError(
        absl::StrCat("time oracle has ", time.size(), " entries for ", dag.num_ops(), " ops"));
  }
  for (int i = 0; i < dag.num_ops(); ++i) {
    if (time[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("time oracle gives op '", dag.ops()[i].name, "' a negative time"));
    }
  }
  const auto deps = FindDependencies(dag);
  std::vector<bool> outstanding(dag.num_ops(), false);
  int remaining = 0;
  for (int i = 0; i < dag.num_ops(); ++i) {
    outstanding[i] = dag.ops()[i].kind == OpKind::kRecv;
    remaining += outstanding[i];
  }
  const Priority total = remaining;
  std::vector<Priority> prio(dag.num_tensors(), -1);
  Priority count = 0;
  while (remaining > 0) {
    const std::vector<RecvProperties> props = UpdateProperties(dag, deps, time, outstanding);
    size_t best = 0;
    for (size_t k = 1; k < props.size(); ++k) {
      if (TacBefore(props[k], props[best])) best = k;
    }
    outstanding[props[best].op] = false;
    --remaining;
    prio[dag.ops()[props[best].op].tensor] = count++;
  }
  Priority next = total;
  for (Priority& p : prio) {
    if (p < 0) p = next++;
  }
  return prio;
}

double OverlapCoefficient(TimeNs comm, TimeNs compute, TimeNs iteration) {
  const TimeNs most = std::min(comm, compute);
  if (most <= 0) return 1.0;
  return static_cast<double>(comm + compute - iteration) / static_cast<double>(most);
}

double Utilization(TimeNs compute, TimeNs iteration) {
  if (iteration <= 0) return 1.0;
  return static_cast<double>(compute) / static_cast<double>(iteration);
}

double UtilizationFromRatio(double rho, double alpha) {
  return 1.0 / (1.0 + rho - alpha * std::min(rho, 1.0));
}

std::vector<int32_t> RecvOrderFromPriorities(const Dag& dag, absl::Span<const Priority> prio) {
  std::vector<int32_t> order;
  for (int t = 0; t < dag.num_tensors(); ++t) {
    if (dag.recv_of(t) >= 0) order.push_back(t);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return prio[a] < prio[b]; });
  return order;
}

absl::StatusOr<IterationTimes> SimulateIteration(const Dag& dag, absl::Span<const TimeNs> time,
                                                 absl::Span<const int32_t> recv_order) {
  const int n = dag.num_ops();
  if (static_cast<int>(time.size()) != n) {
    return absl::InvalidArgumentError("time oracle must have one entry per op");
  }
  std::vector<bool> listed(dag.num_tensors(), false);
  for (int32_t t : recv_order) {
    if (t < 0 || t >= dag.num_tensors() || dag.recv_of(t) < 0 || listed[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("recv order entry ", t, " is not a distinct tensor with a recv op"));
    }
    listed[t] = true;
  }
  for (int t = 0; t < dag.num_tensors(); ++t) {
    if (dag.recv_of(t) >= 0 && !listed[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("recv order misses tensor '", dag.tensors()[t].name, "'"));
    }
  }

  IterationTimes out;
  std::vector<TimeNs> finish(n, -1);
  TimeNs link = 0;
  for (int32_t t : recv_order) {
    const int32_t op = dag.recv_of(t);
    link += time[op];
    finish[op] = link;
    out.comm += time[op];
  }

  auto ready_time = [&](int op) {
    TimeNs r = 0;
    for (int32_t d : dag.ops()[op].deps) r = std::max(r, finish[d]);
    return r;
  };
  std::vector<int> waiting(n, 0);
  for (int i = 0; i < n; ++i) {
    for (int32_t d : dag.ops()[i].deps) waiting[i] += dag.ops()[d].kind == OpKind::kCompute;
  }
  std::vector<int32_t> candidates;
  for (int i = 0; i < n; ++i) {
    if (dag.ops()[i].kind == OpKind::kCompute && waiting[i] == 0) candidates.push_back(i);
  }
  TimeNs device = 0;
  while (!candidates.empty()) {
    size_t best = 0;
    for (size_t k = 1; k < candidates.size(); ++k) {
      const TimeNs rk = std::max(device, ready_time(candidates[k]));
      const TimeNs rb = std::max(device, ready_time(candidates[best]));
      if (rk < rb || (rk == rb && candidates[k] < candidates[best])) best = k;
    }
    const int32_t op = candidates[best];
    candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(best));
    device = std::max(device, ready_time(op)) + time[op];
    finish[op] = device;
    out.compute += time[op];
    for (int32_t s : dag.successors(op)) {
      if (dag.ops()[s].kind == OpKind::kCompute && --waiting[s] == 0) candidates.push_back(s);
    }
  }

  std::vector<std::pair<TimeNs, int32_t>> sends;
  for (int i = 0; i < n; ++i) {
    if (dag.ops()[i].kind == OpKind::kSend) sends.push_back({ready_time(i), i});
  }
  std::sort(sends.begin(), sends.end());
  for (const auto& [ready, op] : sends) {
    link = std::max(link, ready) + time[op];
    finish[op] = link;
    out.comm += time[op];
  }
  for (int i = 0; i < n; ++i) out.iteration = std::max(out.iteration, finish[i]);
  return out;
}

}  // namespace gradlane::sched
