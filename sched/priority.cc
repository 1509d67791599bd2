#include "sched/priority.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "sched/tictac.h"

namespace gradlane::sched {

absl::StatusOr<PriorityMode> ParsePriorityMode(std::string_view name) {
  if (name == "index") return PriorityMode::kIndex;
  if (name == "auto") return PriorityMode::kAuto;
  if (name == "tic") return PriorityMode::kTic;
  if (name == "tac") return PriorityMode::kTac;
  if (name == "pace") return PriorityMode::kPace;
  return absl::InvalidArgumentError(absl::StrCat("unknown priority mode '", std::string(name),
                                                 "' (expected index, auto, tic, tac or pace)"));
}

std::string_view PriorityModeName(PriorityMode mode) {
  switch (mode) {
    case PriorityMode::kIndex:
      return "index";
    case PriorityMode::kAuto:
      return "auto";
    case PriorityMode::kTic:
      return "tic";
    case PriorityMode::kTac:
      return "tac";
    case PriorityMode::kPace:
      return "pace";
  }
  return "?";
}

bool PriorityModeNeedsDag(PriorityMode mode) {
  return mode == PriorityMode::kTic || mode == PriorityMode::kTac || mode == PriorityMode::kPace;
}

void AutoPriority::Register(uint32_t tensor_id) {
  if (provisional_.contains(tensor_id)) return;
  provisional_[tensor_id] = static_cast<Priority>(registered_.size());
  registered_.push_back(tensor_id);
  if (frozen_) Append(tensor_id);
}

void AutoPriority::Observe(uint32_t tensor_id, int64_t iteration) {
  Register(tensor_id);
  if (frozen_) return;
  if (!learning_started_) {
    learning_started_ = true;
    learning_iteration_ = iteration;
  }
  if (iteration > learning_iteration_) {
    // The learning iteration is over: its order is complete.
    Freeze();
    return;
  }
  if (iteration < learning_iteration_) return;  // a straggler from before we started listening
  if (seen_[tensor_id]) return;
  seen_[tensor_id] = true;
  ready_order_.push_back(tensor_id);
}

void AutoPriority::Freeze() {
  if (frozen_) return;
  frozen_ = true;
  for (auto it = ready_order_.rbegin(); it != ready_order_.rend(); ++it) Append(*it);
  for (uint32_t id : registered_) {
    if (!learned_.contains(id)) Append(id);
  }
}

Priority AutoPriority::Append(uint32_t tensor_id) {
  auto [it, inserted] = learned_.emplace(tensor_id, next_);
  if (inserted) ++next_;
  return it->second;
}

Priority AutoPriority::PriorityOf(uint32_t tensor_id) const {
  if (frozen_) {
    auto it = learned_.find(tensor_id);
    return it != learned_.end() ? it->second : next_;
  }
  auto it = provisional_.find(tensor_id);
  return it != provisional_.end() ? it->second : static_cast<Priority>(registered_.size());
}

absl::StatusOr<std::vector<Priority>> AssignPriorities(PriorityMode mode,
                                                       absl::Span<const TensorSpec> tensors,
                                                       const Dag* dag,
                                                       const PriorityOptions& options) {
  std::vector<Priority> out;
  out.reserve(tensors.size());
  switch (mode) {
    case PriorityMode::kIndex:
      for (const TensorSpec& t : tensors) {
        if (t.priority < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor ", t.id, " has negative priority ", t.priority));
        }
        out.push_back(t.priority);
      }
      return out;
    case PriorityMode::kAuto:
      for (size_t i = 0; i < tensors.size(); ++i) {
        out.push_back(options.auto_learner != nullptr
                          ? options.auto_learner->PriorityOf(tensors[i].id)
                          : static_cast<Priority>(i));
      }
      return out;
    case PriorityMode::kTic:
    case PriorityMode::kTac:
    case PriorityMode::kPace:
      break;
  }

  if (dag == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("priority mode '", std::string(PriorityModeName(mode)), "' needs a DAG"));
  }
  std::vector<Priority> by_dag_tensor;
  if (mode == PriorityMode::kTic) {
    by_dag_tensor = TicPriorities(*dag);
  } else if (mode == PriorityMode::kTac) {
    absl::StatusOr<std::vector<TimeNs>> time = LinkTimeOracle(*dag, options.link_bytes_per_s);
    if (!time.ok()) return time.status();
    absl::StatusOr<std::vector<Priority>> prio = TacPriorities(*dag, *time);
    if (!prio.ok()) return prio.status();
    by_dag_tensor = *std::move(prio);
  } else {
    absl::StatusOr<PacePlan> plan = PlanPace(*dag, options.allreduce_cost);
    if (!plan.ok()) return plan.status();
    by_dag_tensor = std::move(plan->priority);
  }
  for (const TensorSpec& t : tensors) {
    std::optional<int32_t> k = dag->FindTensorById(t.id);
    if (!k.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor id ", t.id,
                       " is not in the DAG; every registered tensor needs "
                       "a DAG tensor with the same id for mode '",
                       std::string(PriorityModeName(mode)), "'"));
    }
    out.push_back(by_dag_tensor[*k]);
  }
  return out;
}

}  // namespace gradlane::sched
