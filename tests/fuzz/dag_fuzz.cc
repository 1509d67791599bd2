// Fuzz target: DAG files (sched/dag.h ParseDagJson, format in docs/dag-format.md) and the
// DAG-aware priority schemes run on an accepted DAG (TicTac: sched/tictac.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "sched/dag.h"
#include "sched/tictac.h"

namespace s = gradlane::sched;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto dag = s::ParseDagJson(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!dag.ok()) return 0;
  // The guarantees of a Dag that exists (sched/dag.h), spot-checked.
  if (dag->topo_order().size() != static_cast<size_t>(dag->num_ops())) std::abort();
  for (const s::DagOp& op : dag->ops()) {
    if (op.duration < 0) std::abort();
    for (int32_t d : op.deps) {
      if (d < 0 || d >= dag->num_ops()) std::abort();
    }
  }
  (void)s::TicPriorities(*dag);
  (void)s::GeneralTimeOracle(*dag);
  (void)s::LinkTimeOracle(*dag, 1.25e9);
  return 0;
}
