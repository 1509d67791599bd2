// Fuzz target: model profiles (sched/model_profile.h) — JSON files an operator or a replay run
// hands to gradlane-sim and the benches — and what is computed from an accepted one: the
// totals and the chain DAG (sched/dag.h BuildChainDag).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "sched/dag.h"
#include "sched/model_profile.h"

namespace s = gradlane::sched;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto p = s::ParseModelProfile(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!p.ok()) return 0;
  // A profile that parses must be usable: its totals may not overflow (UBSan checks) and its
  // layers must make a valid chain DAG.
  (void)p->ComputeNs();
  (void)p->TotalParamBytes();
  std::vector<s::ChainLayer> layers;
  for (const s::ModelLayer& l : p->layers) {
    if (l.fwd_ns < 0 || l.bwd_ns < 0 || l.ready_ns < 0) std::abort();
    layers.push_back(s::ChainLayer{l.name, l.param_bytes, l.fwd_ns, l.bwd_ns});
  }
  auto dag = s::BuildChainDag(layers);
  if (dag.ok()) (void)dag->topo_order();
  return 0;
}
