// sched/dag.h — the computation DAG of one training iteration on one worker, as TicTac (§2.2,
// §4.1) and PACE (§IV-A) see it: compute ops with a duration, parameter-transfer ("recv") ops
// and gradient ("send") ops, each tied to one tensor, and dependency edges between them.
//
// The DAG is the input of the DAG-aware priority schemes (sched/tictac.h, sched/pace.h) and of
// tensor fusion (sched/fusion.h). It comes either from a JSON file (format: docs/dag-format.md;
// the caller reads the file, sched/ does no I/O) or from a chain model's per-layer profile.
//
// Guarantees: a Dag that exists is valid — every edge names an existing op, there is no cycle,
// names are unique, durations and sizes are non-negative, recv ops are roots and send ops are
// leaves (TicTac §2.2: "all recv ops are roots and send ops are leaves"), and each tensor has at
// most one recv and at most one send. Immutable after construction; safe to share between
// threads. Parsing never throws: malformed input comes back as absl::InvalidArgumentError.
#ifndef GRADLANE_SCHED_DAG_H_
#define GRADLANE_SCHED_DAG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sched/types.h"

namespace gradlane::sched {

enum class OpKind : uint8_t {
  kCompute = 0,  // runs on the accelerator for `duration`
  kRecv = 1,     // a parameter arriving from the network (TicTac's recv)
  kSend = 2,     // a gradient leaving through the network (push / all-reduce input)
};

std::string_view OpKindName(OpKind kind);

// A tensor named by the DAG. `id` is the TensorSpec::id the daemon registers it under, so DAG
// priorities can be matched to registered tensors.
struct DagTensor {
  std::string name;
  uint32_t id = 0;
  uint64_t bytes = 0;
};

struct DagOp {
  std::string name;
  OpKind kind = OpKind::kCompute;
  TimeNs duration = 0;        // compute ops only; communication time comes from a cost model
  int32_t tensor = -1;        // index into Dag::tensors() for recv/send ops, -1 for compute
  std::vector<int32_t> deps;  // indices of the ops this one waits for
};

class Dag {
 public:
  // Validates and builds. Errors (InvalidArgumentError) name the offending op or tensor.
  static absl::StatusOr<Dag> Create(std::vector<DagTensor> tensors, std::vector<DagOp> ops);

  const std::vector<DagTensor>& tensors() const { return tensors_; }
  const std::vector<DagOp>& ops() const { return ops_; }
  int num_ops() const { return static_cast<int>(ops_.size()); }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }

  // Ops that list `op` among their deps.
  const std::vector<int32_t>& successors(int op) const { return succ_[op]; }
  // A topological order (every op after all its deps); stable: among ready ops, lowest index.
  const std::vector<int32_t>& topo_order() const { return topo_; }

  // The recv / send op of tensor `t` (index into tensors()), or -1 if it has none.
  int32_t recv_of(int t) const { return recv_of_[t]; }
  int32_t send_of(int t) const { return send_of_[t]; }

  std::optional<int32_t> FindOp(std::string_view name) const;
  std::optional<int32_t> FindTensor(std::string_view name) const;
  // Index into tensors() of the tensor registered as `id`.
  std::optional<int32_t> FindTensorById(uint32_t id) const;

 private:
  Dag() = default;

  std::vector<DagTensor> tensors_;
  std::vector<DagOp> ops_;
  std::vector<std::vector<int32_t>> succ_;
  std::vector<int32_t> topo_;
  std::vector<int32_t> recv_of_;
  std::vector<int32_t> send_of_;
};

// Parses the JSON DAG format of docs/dag-format.md from `text`.
absl::StatusOr<Dag> ParseDagJson(std::string_view text);

// One layer of a chain model (a model profile's layer; docs/design.md §5). Times in ns: a profile's
// fwd_us/bwd_us times kMicrosecond.
struct ChainLayer {
  std::string name;
  uint64_t param_bytes = 0;
  TimeNs fwd = 0;
  TimeNs bwd = 0;
};

// The DAG of a chain model, so a model profile yields a DAG without a DAG file. For layer i
// (forward order): compute "fwd.<name>" waits for fwd of layer i-1 and for "recv.<name>";
// compute "bwd.<name>" waits for bwd of layer i+1 (the last layer's bwd waits for its fwd);
// "send.<name>" waits for bwd of layer i. Layers with param_bytes == 0 get no recv/send and no
// tensor. Tensor ids are layer indices, matching the profile's default priorities.
absl::StatusOr<Dag> BuildChainDag(absl::Span<const ChainLayer> layers);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_DAG_H_
