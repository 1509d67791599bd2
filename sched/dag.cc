#include "sched/dag.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace gradlane::sched {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Finds one cycle among the ops Kahn's algorithm could not order, for an error message that
// lets the author of a DAG file find the edge to remove.
std::string DescribeCycle(const std::vector<DagOp>& ops, const std::vector<bool>& ordered) {
  // Walk deps backwards from an unordered op; every unordered op has an unordered dep, so the
  // walk must revisit an op, and the revisited stretch is a cycle.
  int start = -1;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ordered[i]) {
      start = static_cast<int>(i);
      break;
    }
  }
  std::vector<int> pos(ops.size(), -1);
  std::vector<int> walk;
  int cur = start;
  while (pos[cur] < 0) {
    pos[cur] = static_cast<int>(walk.size());
    walk.push_back(cur);
    int next = -1;
    for (int d : ops[cur].deps) {
      if (!ordered[d]) {
        next = d;
        break;
      }
    }
    cur = next;
  }
  // walk[pos[cur]..] is the cycle in reverse dependency order; print it dep -> dependent,
  // starting from its first-listed op so the message does not depend on the walk.
  std::vector<int> cycle(walk.rbegin(), walk.rend() - pos[cur]);
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::vector<std::string> names;
  for (int op : cycle) names.push_back(ops[op].name);
  names.push_back(ops[cycle.front()].name);
  return absl::StrJoin(names, " -> ");
}

}  // namespace

std::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kCompute:
      return "compute";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kSend:
      return "send";
  }
  return "?";
}

absl::StatusOr<Dag> Dag::Create(std::vector<DagTensor> tensors, std::vector<DagOp> ops) {
  Dag dag;
  const int n_ops = static_cast<int>(ops.size());
  const int n_tensors = static_cast<int>(tensors.size());

  absl::flat_hash_map<std::string, int> tensor_names;
  absl::flat_hash_map<uint32_t, int> tensor_ids;
  for (int t = 0; t < n_tensors; ++t) {
    if (tensors[t].name.empty()) return Invalid(absl::StrCat("tensor #", t, " has an empty name"));
    if (!tensor_names.emplace(tensors[t].name, t).second) {
      return Invalid(absl::StrCat("duplicate tensor name '", tensors[t].name, "'"));
    }
    if (!tensor_ids.emplace(tensors[t].id, t).second) {
      return Invalid(
          absl::StrCat("duplicate tensor id ", tensors[t].id, " (tensor '", tensors[t].name, "')"));
    }
  }

  absl::flat_hash_map<std::string, int> op_names;
  dag.recv_of_.assign(n_tensors, -1);
  dag.send_of_.assign(n_tensors, -1);
  dag.succ_.assign(n_ops, {});
  for (int i = 0; i < n_ops; ++i) {
    const DagOp& op = ops[i];
    if (op.name.empty()) return Invalid(absl::StrCat("op #", i, " has an empty name"));
    if (!op_names.emplace(op.name, i).second) {
      return Invalid(absl::StrCat("duplicate op name '", op.name, "'"));
    }
    if (op.duration < 0) {
      return Invalid(absl::StrCat("op '", op.name, "' has a negative duration"));
    }
    if (op.kind == OpKind::kCompute) {
      if (op.tensor != -1) {
        return Invalid(absl::StrCat("compute op '", op.name, "' must not name a tensor"));
      }
    } else {
      if (op.tensor < 0 || op.tensor >= n_tensors) {
        return Invalid(absl::StrCat(std::string(OpKindName(op.kind)), " op '", op.name,
                                    "' names no valid tensor"));
      }
      if (op.duration != 0) {
        return Invalid(absl::StrCat(std::string(OpKindName(op.kind)), " op '", op.name,
                                    "' has a duration; communication time comes from its "
                                    "tensor's bytes"));
      }
      std::vector<int32_t>& slot = op.kind == OpKind::kRecv ? dag.recv_of_ : dag.send_of_;
      if (slot[op.tensor] != -1) {
        return Invalid(absl::StrCat("tensor '", tensors[op.tensor].name, "' has two ",
                                    std::string(OpKindName(op.kind)), " ops: '",
                                    ops[slot[op.tensor]].name, "' and '", op.name, "'"));
      }
      slot[op.tensor] = i;
    }
    if (op.kind == OpKind::kRecv && !op.deps.empty()) {
      return Invalid(absl::StrCat("recv op '", op.name,
                                  "' has deps; recv ops must be roots of the worker DAG"));
    }
    for (int32_t d : op.deps) {
      if (d < 0 || d >= n_ops) {
        return Invalid(absl::StrCat("op '", op.name, "' depends on unknown op #", d));
      }
      if (ops[d].kind == OpKind::kSend) {
        return Invalid(absl::StrCat("op '", op.name, "' depends on send op '", ops[d].name,
                                    "'; send ops must be leaves of the worker DAG"));
      }
    }
    // Duplicate edges would double-count in-degrees below; keep each edge once.
    std::vector<int32_t> seen;
    for (int32_t d : op.deps) {
      bool dup = false;
      for (int32_t s : seen) dup |= (s == d);
      if (dup) {
        return Invalid(absl::StrCat("op '", op.name, "' lists dep '", ops[d].name, "' twice"));
      }
      seen.push_back(d);
      dag.succ_[d].push_back(i);
    }
  }

  // Kahn's algorithm with a min-heap, so the order is reproducible.
  std::vector<int> indegree(n_ops);
  for (int i = 0; i < n_ops; ++i) indegree[i] = static_cast<int>(ops[i].deps.size());
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n_ops; ++i) {
    if (indegree[i] == 0) ready.push(i);
  }
  std::vector<bool> ordered(n_ops, false);
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    ordered[i] = true;
    dag.topo_.push_back(i);
    for (int s : dag.succ_[i]) {
      if (--indegree[s] == 0) ready.push(s);
    }
  }
  if (static_cast<int>(dag.topo_.size()) != n_ops) {
    return Invalid(absl::StrCat("DAG has a cycle: ", DescribeCycle(ops, ordered)));
  }

  dag.tensors_ = std::move(tensors);
  dag.ops_ = std::move(ops);
  return dag;
}

std::optional<int32_t> Dag::FindOp(std::string_view name) const {
  for (int i = 0; i < num_ops(); ++i) {
    if (ops_[i].name == name) return i;
  }
  return std::nullopt;
}

std::optional<int32_t> Dag::FindTensor(std::string_view name) const {
  for (int i = 0; i < num_tensors(); ++i) {
    if (tensors_[i].name == name) return i;
  }
  return std::nullopt;
}

std::optional<int32_t> Dag::FindTensorById(uint32_t id) const {
  for (int i = 0; i < num_tensors(); ++i) {
    if (tensors_[i].id == id) return i;
  }
  return std::nullopt;
}

absl::StatusOr<Dag> ParseDagJson(std::string_view text) {
  Json root = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid("DAG is not valid JSON");
  if (!root.is_object()) return Invalid("DAG must be a JSON object");

  std::vector<DagTensor> tensors;
  auto tensors_it = root.find("tensors");
  if (tensors_it != root.end()) {
    if (!tensors_it->is_array()) return Invalid("'tensors' must be an array");
    for (size_t i = 0; i < tensors_it->size(); ++i) {
      const Json& t = (*tensors_it)[i];
      const std::string where = absl::StrCat("tensors[", i, "]");
      if (!t.is_object()) return Invalid(absl::StrCat(where, " must be an object"));
      DagTensor tensor;
      auto name = t.find("name");
      if (name == t.end()) return Invalid(absl::StrCat(where, " is missing 'name'"));
      if (!name->is_string()) return Invalid(absl::StrCat(where, ".name must be a string"));
      tensor.name = name->get<std::string>();
      auto bytes = t.find("bytes");
      if (bytes == t.end()) {
        return Invalid(absl::StrCat("tensor '", tensor.name, "' is missing 'bytes'"));
      }
      if (bytes->is_number_integer() && bytes->get<int64_t>() < 0) {
        return Invalid(absl::StrCat("tensor '", tensor.name, "' has negative bytes"));
      }
      if (!bytes->is_number_unsigned()) {
        return Invalid(
            absl::StrCat("tensor '", tensor.name, "': 'bytes' must be a non-negative integer"));
      }
      tensor.bytes = bytes->get<uint64_t>();
      tensor.id = static_cast<uint32_t>(i);
      auto id = t.find("id");
      if (id != t.end()) {
        if (!id->is_number_unsigned() || id->get<uint64_t>() > UINT32_MAX) {
          return Invalid(
              absl::StrCat("tensor '", tensor.name, "': 'id' must be an integer in [0, 2^32)"));
        }
        tensor.id = static_cast<uint32_t>(id->get<uint64_t>());
      }
      tensors.push_back(std::move(tensor));
    }
  }
  absl::flat_hash_map<std::string, int> tensor_index;
  for (size_t i = 0; i < tensors.size(); ++i) tensor_index.emplace(tensors[i].name, i);

  auto ops_it = root.find("ops");
  if (ops_it == root.end()) return Invalid("DAG is missing 'ops'");
  if (!ops_it->is_array()) return Invalid("'ops' must be an array");

  // First pass: names, so deps may refer to ops listed later in the file.
  absl::flat_hash_map<std::string, int> op_index;
  for (size_t i = 0; i < ops_it->size(); ++i) {
    const Json& o = (*ops_it)[i];
    const std::string where = absl::StrCat("ops[", i, "]");
    if (!o.is_object()) return Invalid(absl::StrCat(where, " must be an object"));
    auto name = o.find("name");
    if (name == o.end()) return Invalid(absl::StrCat(where, " is missing 'name'"));
    if (!name->is_string()) return Invalid(absl::StrCat(where, ".name must be a string"));
    if (!op_index.emplace(name->get<std::string>(), static_cast<int>(i)).second) {
      return Invalid(absl::StrCat("duplicate op name '", name->get<std::string>(), "'"));
    }
  }

  std::vector<DagOp> ops;
  for (size_t i = 0; i < ops_it->size(); ++i) {
    const Json& o = (*ops_it)[i];
    DagOp op;
    op.name = o["name"].get<std::string>();
    const std::string where = absl::StrCat("op '", op.name, "'");
    auto kind = o.find("kind");
    if (kind == o.end()) return Invalid(absl::StrCat(where, " is missing 'kind'"));
    if (!kind->is_string()) return Invalid(absl::StrCat(where, ": 'kind' must be a string"));
    const std::string kind_s = kind->get<std::string>();
    if (kind_s == "compute") {
      op.kind = OpKind::kCompute;
    } else if (kind_s == "recv") {
      op.kind = OpKind::kRecv;
    } else if (kind_s == "send") {
      op.kind = OpKind::kSend;
    } else {
      return Invalid(
          absl::StrCat(where, " has unknown kind '", kind_s, "' (expected compute, recv or send)"));
    }
    auto duration = o.find("duration_us");
    if (op.kind == OpKind::kCompute) {
      if (duration == o.end()) return Invalid(absl::StrCat(where, " is missing 'duration_us'"));
      if (!duration->is_number()) {
        return Invalid(absl::StrCat(where, ": 'duration_us' must be a number"));
      }
      const double us = duration->get<double>();
      if (!std::isfinite(us) || us < 0) {
        return Invalid(absl::StrCat(where, " has a negative or non-finite duration_us"));
      }
      if (us > 1e12) return Invalid(absl::StrCat(where, ": duration_us is implausibly large"));
      op.duration = static_cast<TimeNs>(std::llround(us * kMicrosecond));
    } else {
      if (duration != o.end()) {
        return Invalid(absl::StrCat(where, ": a ", kind_s,
                                    " op takes no 'duration_us' (its time comes from bytes)"));
      }
      auto tensor = o.find("tensor");
      if (tensor == o.end()) return Invalid(absl::StrCat(where, " is missing 'tensor'"));
      if (!tensor->is_string()) {
        return Invalid(absl::StrCat(where, ": 'tensor' must be a tensor name"));
      }
      auto t = tensor_index.find(tensor->get<std::string>());
      if (t == tensor_index.end()) {
        return Invalid(
            absl::StrCat(where, " references unknown tensor '", tensor->get<std::string>(), "'"));
      }
      op.tensor = t->second;
    }
    auto deps = o.find("deps");
    if (deps != o.end()) {
      if (!deps->is_array()) return Invalid(absl::StrCat(where, ": 'deps' must be an array"));
      for (const Json& d : *deps) {
        if (!d.is_string()) {
          return Invalid(absl::StrCat(where, ": 'deps' must hold op names (strings)"));
        }
        auto it = op_index.find(d.get<std::string>());
        if (it == op_index.end()) {
          return Invalid(
              absl::StrCat(where, " depends on unknown op '", d.get<std::string>(), "'"));
        }
        op.deps.push_back(it->second);
      }
    }
    ops.push_back(std::move(op));
  }
  return Dag::Create(std::move(tensors), std::move(ops));
}

absl::StatusOr<Dag> BuildChainDag(absl::Span<const ChainLayer> layers) {
  if (layers.empty()) return Invalid("a chain model needs at least one layer");
  std::vector<DagTensor> tensors;
  std::vector<DagOp> ops;
  const int n = static_cast<int>(layers.size());
  std::vector<int> fwd(n), bwd(n), recv(n, -1), tensor(n, -1);
  for (int i = 0; i < n; ++i) {
    const ChainLayer& l = layers[i];
    if (l.fwd < 0 || l.bwd < 0) {
      return Invalid(absl::StrCat("layer '", l.name, "' has a negative time"));
    }
    if (l.param_bytes > 0) {
      tensor[i] = static_cast<int>(tensors.size());
      tensors.push_back({l.name, static_cast<uint32_t>(i), l.param_bytes});
      recv[i] = static_cast<int>(ops.size());
      ops.push_back({absl::StrCat("recv.", l.name), OpKind::kRecv, 0, tensor[i], {}});
    }
    DagOp f{absl::StrCat("fwd.", l.name), OpKind::kCompute, l.fwd, -1, {}};
    if (i > 0) f.deps.push_back(fwd[i - 1]);
    if (recv[i] >= 0) f.deps.push_back(recv[i]);
    fwd[i] = static_cast<int>(ops.size());
    ops.push_back(std::move(f));
  }
  for (int i = n - 1; i >= 0; --i) {
    DagOp b{absl::StrCat("bwd.", layers[i].name), OpKind::kCompute, layers[i].bwd, -1, {}};
    b.deps.push_back(i == n - 1 ? fwd[i] : bwd[i + 1]);
    bwd[i] = static_cast<int>(ops.size());
    ops.push_back(std::move(b));
    if (tensor[i] >= 0) {
      ops.push_back({absl::StrCat("send.", layers[i].name), OpKind::kSend, 0, tensor[i], {bwd[i]}});
    }
  }
  return Dag::Create(std::move(tensors), std::move(ops));
}

}  // namespace gradlane::sched
