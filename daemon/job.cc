#include "daemon/job.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "sched/policies/bytescheduler.h"
#include "sched/shard_balance.h"

namespace gradlane::daemon {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

void Mix(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
}
template <typename T>
void MixValue(uint64_t& h, T v) {
  Mix(h, &v, sizeof(v));
}

}  // namespace

uint64_t EnginePartitionBytes(const std::string& policy, uint64_t configured, sched::DType dtype) {
  uint64_t bytes = kMaxEnginePartitionBytes;  // fifo: whole tensors (the vanilla baseline)
  if (policy != "fifo") {
    bytes = configured != 0 ? configured : sched::DefaultPartitionBytes(policy, dtype);
    // An unknown name fails at MakePolicy; until then it plans like bytescheduler.
    if (bytes == 0) bytes = sched::kByteSchedulerDefaultPartitionBytes;
  }
  return std::min(bytes, kMaxEnginePartitionBytes);
}

uint64_t BalancedKeyBytes(const std::vector<TensorInfo>& tensors, const JobPlan& plan,
                          uint64_t configured_partition_bytes) {
  // An explicit --partition_bytes is the operator's choice, fifo sends whole tensors by
  // definition, and an all-reduce job splits every partition W ways already.
  if (plan.mode != GL_MODE_PS || plan.world <= 1 || configured_partition_bytes != 0 ||
      plan.policy_name == "fifo") {
    return 0;
  }
  uint64_t policy_bytes = 0;
  std::vector<uint64_t> sizes;
  sizes.reserve(tensors.size());
  for (const TensorInfo& t : tensors) {
    sizes.push_back(t.bytes);
    policy_bytes = std::max(policy_bytes, EnginePartitionBytes(plan.policy_name, 0, t.dtype));
  }
  const uint64_t unit = sched::BalancedShardUnit(sizes, plan.world, policy_bytes);
  return unit < policy_bytes ? unit : 0;
}

const char* ModeName(gl_job_mode mode) {
  switch (mode) {
    case GL_MODE_PS:
      return "ps";
    case GL_MODE_ALLREDUCE:
      return "allreduce";
  }
  return "unknown";
}

uint64_t WireJobId(const std::string& job_id) {
  uint64_t h = kFnvOffset;
  Mix(h, job_id.data(), job_id.size());
  return h;
}

uint64_t Fingerprint(const std::vector<TensorInfo>& tensors, uint32_t world_size,
                     const std::string& policy, uint64_t partition_bytes, ps::ReduceOp reduce,
                     gl_job_mode mode, uint8_t fusion, uint64_t balanced_key_bytes) {
  uint64_t h = kFnvOffset;
  MixValue(h, world_size);
  // Mixed in only when the balance rule cut the keys finer than the policy's partitions: a job
  // whose keys did not change keeps the fingerprint a daemon without the rule computes, and one
  // whose keys did is refused by such a daemon instead of disagreeing on the keys.
  if (balanced_key_bytes != 0) {
    MixValue(h, balanced_key_bytes | (uint64_t{0x4B45} << 48));
  }
  // Mixed in only when not ps, so a ps job's fingerprint is what it was before modes existed.
  if (mode != GL_MODE_PS) {
    MixValue(h, static_cast<uint32_t>(mode) | 0x4D4F0000u);
    MixValue(h, fusion);
  }
  MixValue(h, partition_bytes);
  Mix(h, policy.data(), policy.size() + 0);
  MixValue(h, static_cast<uint8_t>(0xFF));  // separator: "ab"+"c" != "a"+"bc"
  MixValue(h, static_cast<uint8_t>(reduce));
  MixValue(h, static_cast<uint64_t>(tensors.size()));
  for (const TensorInfo& t : tensors) {
    Mix(h, t.name.data(), t.name.size());
    MixValue(h, static_cast<uint8_t>(0));
    MixValue(h, t.bytes);
    MixValue(h, static_cast<uint8_t>(t.dtype));
  }
  return h;
}

namespace {
// Parameter-server mode: the shard map over the partitions, each part's owner and the table
// of partitions this rank owns with their slab slots.
JobError BuildShardPlan(const std::vector<ps::KeyBytes>& keys, JobPlan* plan) {
  const std::string& id = plan->info.job_id;
  auto map = ps::ShardMap::Build(keys, plan->world);
  if (!map.ok()) {
    return {GL_E_INTERNAL, absl::StrCat("job ", id, ": shard map: ", map.status().message())};
  }
  plan->shard_map = std::make_unique<ps::ShardMap>(std::move(*map));
  plan->owned.clear();
  uint64_t slab = 0;
  for (size_t i = 0; i < plan->parts.size(); ++i) {
    Part& p = plan->parts[i];
    const uint32_t tid = plan->tensors[p.tensor].spec.id;
    p.owner =
        static_cast<uint16_t>(plan->shard_map->ShardOf(sched::MakeKey(tid, p.index)).value_or(0));
    if (p.owner == plan->rank) {
      OwnedPart o;
      o.part = static_cast<uint32_t>(i);
      o.slab_offset = slab;
      slab += uint64_t{plan->world} * p.length;
      p.owned = static_cast<int32_t>(plan->owned.size());
      plan->owned.push_back(o);
    }
  }
  plan->slab_bytes = slab;
  return {};
}
}  // namespace

JobError BuildJobPlan(const Session& session, const std::string& default_policy,
                      uint64_t partition_bytes, ps::ReduceOp reduce, uint8_t fusion,
                      JobPlan* plan) {
  const JobInfo* info = session.job_st();
  if (info == nullptr) return {GL_E_NO_JOB, "no job registered in this session"};
  plan->info = *info;
  plan->wire_id = WireJobId(info->job_id);
  plan->policy_name = info->policy.empty() ? default_policy : info->policy;
  plan->mode = info->mode;
  plan->fusion = info->mode == GL_MODE_ALLREDUCE && info->world_size > 1 ? fusion : 0;
  plan->reduce = reduce;
  const std::string& id = info->job_id;
  if (info->world_size > ps::kMaxWorldSize) {
    return {GL_E_INVALID_ARGUMENT,
            absl::StrCat("job ", id, ": world size ", info->world_size,
                         " above the parameter-server limit of ", ps::kMaxWorldSize)};
  }
  if (info->world_size > 1 && info->peers.size() != info->world_size) {
    return {GL_E_INVALID_ARGUMENT,
            absl::StrCat("job ", id, ": ", info->peers.size(), " peer addresses for ",
                         info->world_size, " ranks (one host:port per rank is required)")};
  }
  if (info->auth_token.size() > transport::kMaxTokenBytes) {
    return {GL_E_INVALID_ARGUMENT,
            absl::StrCat("job ", id, ": auth token of ", info->auth_token.size(),
                         " bytes (at most ", transport::kMaxTokenBytes, ")")};
  }
  plan->rank = static_cast<uint16_t>(info->rank);
  plan->world = static_cast<uint16_t>(info->world_size);
  const std::vector<TensorInfo>& tensors = session.tensors_st();
  if (tensors.empty()) {
    return {GL_E_NO_JOB, absl::StrCat("job ", id, ": no tensors registered before the first post")};
  }

  std::vector<ps::KeyBytes> keys;
  plan->tensors.clear();
  plan->parts.clear();
  if (plan->fusion) {
    // Fusion appends at most one virtual tensor and partition per two client tensors; reserved
    // now so that appending never moves what references point at.
    plan->tensors.reserve(tensors.size() + tensors.size() / 2 + 1);
  }
  plan->total_bytes = 0;
  plan->balanced_key_bytes = BalancedKeyBytes(tensors, *plan, partition_bytes);
  for (const TensorInfo& t : tensors) {
    JobTensor jt;
    jt.name = t.name;
    jt.spec.id = t.id;
    jt.spec.bytes = t.bytes;
    jt.spec.dtype = t.dtype;
    jt.auto_priority = t.priority == GL_PRIORITY_AUTO;
    jt.spec.priority = jt.auto_priority ? 0 : t.priority;
    jt.arena_offset = t.offset;
    // Balanced keys are cut as a configured --partition_bytes would be: one size for every
    // dtype, the size the policy is then given (JobRuntime::SetUp_st), so its partitions are
    // exactly the keys even for p3, whose own size depends on the dtype.
    const uint64_t key_bytes =
        plan->balanced_key_bytes != 0
            ? plan->balanced_key_bytes
            : EnginePartitionBytes(plan->policy_name, partition_bytes, t.dtype);
    jt.plan = sched::PartitionPlan::Make(t.bytes, t.dtype, key_bytes);
    jt.first_part = static_cast<uint32_t>(plan->parts.size());
    jt.active_posts.reserve(4);
    const uint32_t n = jt.plan.partition_count();
    for (uint32_t k = 0; k < n; ++k) {
      Part p;
      p.tensor = static_cast<uint32_t>(plan->tensors.size());
      p.index = k;
      p.offset = uint64_t{k} * jt.plan.partition_bytes();
      p.length = std::min(jt.plan.partition_bytes(), t.bytes - p.offset);
      keys.push_back({sched::MakeKey(t.id, k), p.length});
      plan->parts.push_back(p);
    }
    plan->total_bytes += t.bytes;
    plan->tensors.push_back(std::move(jt));
  }
  plan->owned.clear();
  plan->slab_bytes = 0;
  plan->staging_offset.clear();
  plan->staging_bytes = 0;
  if (plan->mode == GL_MODE_ALLREDUCE) {
    // Every rank reduces a chunk of every partition: no owner, no shard slab.
    for (Part& p : plan->parts) {
      p.owner = plan->rank;
      plan->staging_offset.push_back(plan->staging_bytes);
      plan->staging_bytes += p.length;
    }
  } else {
    if (JobError e = BuildShardPlan(keys, plan); e.status != GL_OK) return e;
  }
  plan->client_tensors = static_cast<uint32_t>(plan->tensors.size());
  plan->client_parts = static_cast<uint32_t>(plan->parts.size());
  if (plan->fusion) plan->parts.reserve(plan->parts.size() + plan->tensors.size() / 2 + 1);
  plan->fingerprint = Fingerprint(tensors, plan->world, plan->policy_name, partition_bytes, reduce,
                                  plan->mode, plan->fusion, plan->balanced_key_bytes);
  plan->manifest = ManifestBody{kManifestMagic,
                                plan->fingerprint,
                                static_cast<uint32_t>(tensors.size()),
                                plan->world,
                                static_cast<uint16_t>(plan->mode),
                                plan->total_bytes};
  return {};
}

Part* JobPlan::PartAt(uint32_t tensor_id, uint64_t offset) {
  if (tensor_id >= tensors.size()) return nullptr;
  const JobTensor& t = tensors[tensor_id];
  if (offset >= t.spec.bytes) return nullptr;
  return &parts[t.first_part + t.plan.PartitionOf(offset)];
}

}  // namespace gradlane::daemon
