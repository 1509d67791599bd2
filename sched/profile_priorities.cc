#include "sched/profile_priorities.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "sched/dag.h"

namespace gradlane::sched {

absl::StatusOr<std::vector<Priority>> ProfileLayerPriorities(const ModelProfile& profile,
                                                             PriorityMode mode,
                                                             double link_bytes_per_s) {
  if (mode == PriorityMode::kIndex) return std::vector<Priority>{};
  std::vector<TensorSpec> tensors;
  std::vector<ChainLayer> chain;
  for (size_t i = 0; i < profile.layers.size(); ++i) {
    const ModelLayer& l = profile.layers[i];
    // The DAG needs a name for every op (vit_b_16's class token has none in its profile).
    chain.push_back(
        {l.name.empty() ? absl::StrCat("layer#", i) : l.name, l.param_bytes, l.fwd_ns, l.bwd_ns});
    if (l.param_bytes > 0) {
      tensors.push_back(
          {static_cast<uint32_t>(i), l.param_bytes, DType::kF32, static_cast<Priority>(i)});
    }
  }
  PriorityOptions options;
  options.link_bytes_per_s = link_bytes_per_s;
  AutoPriority learner;
  if (mode == PriorityMode::kAuto) {
    std::vector<size_t> order;
    for (const TensorSpec& t : tensors) {
      learner.Register(t.id);
      order.push_back(t.id);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const TimeNs ra = profile.layers[a].ready_ns, rb = profile.layers[b].ready_ns;
      return ra != rb ? ra < rb : a > b;
    });
    for (size_t id : order) learner.Observe(static_cast<uint32_t>(id), 0);
    learner.Freeze();
    options.auto_learner = &learner;
  }
  absl::StatusOr<Dag> dag = BuildChainDag(chain);
  if (!dag.ok()) return dag.status();
  absl::StatusOr<std::vector<Priority>> assigned = AssignPriorities(mode, tensors, &*dag, options);
  if (!assigned.ok()) return assigned.status();
  std::vector<Priority> per_layer(profile.layers.size());
  for (size_t i = 0; i < per_layer.size(); ++i) per_layer[i] = static_cast<Priority>(i);
  for (size_t k = 0; k < tensors.size(); ++k) per_layer[tensors[k].id] = (*assigned)[k];
  return per_layer;
}

}  // namespace gradlane::sched
