// libclient/c10d/process_group_gradlane.cc — see process_group_gradlane.h.
#include "libclient/c10d/process_group_gradlane.h"

#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

namespace gradlane::c10d_backend {
namespace {

// Rungs of 4 KiB, 16 KiB, ... 16 MiB: a collective of n bytes pads at most to 4n (or to
// 4 KiB), and a DDP bucket (25 MiB by default) takes two rounds.
constexpr uint64_t kSmallestRungBytes = 4096;
constexpr int kRungs = 7;
// float32 holds every integer of magnitude up to 2^24 exactly.
constexpr double kExactIntegerLimit = 16777216.0;

bool SummedAsValues(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

bool IntegerLike(at::ScalarType t) {
  return at::isIntegralType(t, /*includeBool=*/true);
}

std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::string StoreGet(const c10::intrusive_ptr<::c10d::Store>& store, const std::string& key) {
  const std::vector<uint8_t> v = store->get(key);
  return std::string(v.begin(), v.end());
}

void StoreSet(const c10::intrusive_ptr<::c10d::Store>& store, const std::string& key,
              const std::string& value) {
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

// The bytes of a contiguous tensor, one float each: any dtype crosses a sum exactly.
at::Tensor BytesAsFloats(const at::Tensor& contiguous) {
  at::Tensor bytes = at::from_blob(contiguous.data_ptr(),
                                   {static_cast<int64_t>(contiguous.nbytes())},
                                   at::TensorOptions().dtype(at::kByte));
  return bytes.to(at::kFloat);
}

// Writes floats holding one byte each back into `t` (any layout).
void FloatsIntoBytes(const at::Tensor& floats, at::Tensor& t) {
  at::Tensor bytes = floats.to(at::kByte);
  at::Tensor dst = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
  std::memcpy(dst.data_ptr(), bytes.data_ptr(), dst.nbytes());
  if (!dst.is_same(t)) t.copy_(dst);
}

at::Tensor ValuesAsFloats(const at::Tensor& t) {
  return t.contiguous().reshape({-1}).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

// The contribution of a rank that only adds nothing: -0.0 leaves every x (+0.0 included) as it
// is, where +0.0 would turn a -0.0 into +0.0.
at::Tensor NothingFloats(int64_t n) {
  return at::full({n}, -0.0f, at::TensorOptions().dtype(at::kFloat));
}

int64_t EncodedLength(const at::Tensor& t) {
  return SummedAsValues(t.scalar_type()) ? t.numel() : static_cast<int64_t>(t.nbytes());
}

at::Tensor Encode(const at::Tensor& t) {
  return SummedAsValues(t.scalar_type()) ? ValuesAsFloats(t) : BytesAsFloats(t.contiguous());
}

void Decode(const at::Tensor& floats, at::Tensor& t) {
  if (SummedAsValues(t.scalar_type())) {
    t.copy_(floats.reshape(t.sizes()));
  } else {
    FloatsIntoBytes(floats, t);
  }
}

void CheckCpu(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "gradlane backend: ", op,
              " takes one tensor per call (", tensors.size(), " given)");
  TORCH_CHECK(tensors[0].device().is_cpu(), "gradlane backend: ", op,
              " of a tensor on ", tensors[0].device(), ": only CPU tensors are supported");
}

class CompletedWork final : public ::c10d::Work {
 public:
  CompletedWork(std::vector<at::Tensor> result, ::c10d::OpType op)
      : ::c10d::Work(-1, op),
        result_(std::move(result)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

c10::intrusive_ptr<::c10d::Work> Done(std::vector<at::Tensor> result, ::c10d::OpType op) {
  return c10::make_intrusive<CompletedWork>(std::move(result), op);
}

}  // namespace

c10::intrusive_ptr<::c10d::ProcessGroup> ProcessGroupGradlane::Create(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    const std::chrono::duration<float>& timeout) {
  const int timeout_ms = static_cast<int>(
      std::min<double>(std::chrono::duration<double, std::milli>(timeout).count(), 2147483647.0));
  // One job per process group: rank 0 names it (the group's store is prefixed per group).
  std::string job_id;
  if (rank == 0) {
    std::random_device rd;
    std::ostringstream id;
    id << Env("GRADLANE_JOB", "c10d").substr(0, 40) << "-" << std::hex << rd() << rd();
    job_id = id.str();
    StoreSet(store, "gradlane/job", job_id);
  } else {
    job_id = StoreGet(store, "gradlane/job");
  }
  std::vector<std::string> peers = Split(Env("GRADLANE_PEERS"), ',');
  if (peers.empty() && size > 1) {
    const std::string mine = Env("GRADLANE_ADDRESS");
    TORCH_CHECK(!mine.empty(), "gradlane backend: set GRADLANE_PEERS (every rank's daemon "
                "address, in rank order) or GRADLANE_ADDRESS (this rank's daemon's --listen "
                "address; the ranks exchange them through the store)");
    StoreSet(store, "gradlane/address/" + std::to_string(rank), mine);
    for (int r = 0; r < size; ++r) peers.push_back(StoreGet(store, "gradlane/address/" + std::to_string(r)));
  }
  TORCH_CHECK(size == 1 || static_cast<int>(peers.size()) == size, "gradlane backend: ",
              peers.size(), " daemon addresses in GRADLANE_PEERS for ", size, " ranks");

  std::vector<Rung> rungs(kRungs);
  uint64_t arena = 1u << 20;
  for (int i = 0; i < kRungs; ++i) {
    rungs[i].floats = (kSmallestRungBytes << (2 * i)) / sizeof(float);
    arena += rungs[i].floats * sizeof(float);
  }
  const std::string socket = Env("GRADLANE_SOCKET");
  gl_connect_options options{};
  options.socket_path = socket.empty() ? nullptr : socket.c_str();
  options.arena_bytes = arena;
  options.timeout_ms = std::max(timeout_ms, 1000);
  gl_client* client = nullptr;
  int rc = gl_connect(&options, &client);
  TORCH_CHECK(rc == GL_OK, "gradlane backend: cannot connect to gradlaned",
              socket.empty() ? "" : " at " + socket, ": ", gl_strerror(rc), " (",
              gl_last_error(nullptr), ")");
  std::vector<const char*> peer_ptrs;
  for (const std::string& p : peers) peer_ptrs.push_back(p.c_str());
  const std::string policy = Env("GRADLANE_POLICY");
  const std::string token = Env("GRADLANE_TOKEN");
  gl_job_info job{};
  job.job_id = job_id.c_str();
  job.rank = static_cast<uint32_t>(rank);
  job.world_size = static_cast<uint32_t>(size);
  job.peers = peer_ptrs.empty() ? nullptr : peer_ptrs.data();
  job.num_peers = static_cast<uint32_t>(peer_ptrs.size());
  job.policy = policy.empty() ? nullptr : policy.c_str();
  job.auth_token = token.empty() ? nullptr : token.c_str();
  rc = gl_register_job(client, &job);
  for (int i = 0; rc == GL_OK && i < kRungs; ++i) {
    void* buffer = nullptr;
    const std::string name = "c10d.rung" + std::to_string(i);
    rc = gl_register_tensor(client, name.c_str(), rungs[i].floats * sizeof(float), GL_DTYPE_F32,
                            0, &rungs[i].tensor_id, &buffer);
    rungs[i].data = static_cast<float*>(buffer);
  }
  if (rc != GL_OK) {
    const std::string detail = gl_last_error(client);
    gl_close(client);
    TORCH_CHECK(false, "gradlane backend: job ", job_id, ": ", gl_strerror(rc), " (", detail, ")");
  }
  return c10::intrusive_ptr<::c10d::ProcessGroup>(c10::make_intrusive<ProcessGroupGradlane>(
      rank, size, client, std::move(rungs), timeout_ms, std::move(job_id)));
}

ProcessGroupGradlane::ProcessGroupGradlane(int rank, int size, gl_client* client,
                                           std::vector<Rung> rungs, int timeout_ms,
                                           std::string job_id)
    : ::c10d::ProcessGroup(rank, size),
      client_(client),
      rungs_(std::move(rungs)),
      timeout_ms_(timeout_ms),
      job_id_(std::move(job_id)) {
  init();
}

ProcessGroupGradlane::~ProcessGroupGradlane() { gl_close(client_); }

void ProcessGroupGradlane::Fail(const char* op, int status, const std::string& what) {
  const std::string detail = gl_last_error(client_);
  TORCH_CHECK(false, "gradlane backend: ", op, " (job ", job_id_, ", rank ", rank_, "): ", what,
              ": ", gl_strerror(status), detail.empty() ? "" : " (" + detail + ")");
}

void ProcessGroupGradlane::SumChunk(float* data, uint64_t count, const char* op) {
  Rung* rung = &rungs_.back();
  for (Rung& r : rungs_) {
    if (r.floats >= count) {
      rung = &r;
      break;
    }
  }
  std::memcpy(rung->data, data, count * sizeof(float));
  std::memset(rung->data + count, 0, (rung->floats - count) * sizeof(float));
  const int64_t iteration = rung->next_iteration++;
  int rc;
  while ((rc = gl_post(client_, rung->tensor_id, iteration, 0, GL_WHOLE_TENSOR, 0)) == GL_E_AGAIN) {
    std::this_thread::yield();  // the daemon is taking the ring's earlier entries
  }
  if (rc != GL_OK) Fail(op, rc, "post");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  gl_completion done{};
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    uint32_t n = 0;
    rc = gl_wait(client_, &done, 1, &n, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (rc == GL_E_TIMEOUT) Fail(op, rc, "no result within the group's timeout");
    if (rc != GL_OK) Fail(op, rc, "wait");
    if (n == 1) break;
  }
  if (done.status != GL_OK) Fail(op, done.status, "round " + std::to_string(iteration));
  TORCH_CHECK(done.tensor_id == rung->tensor_id && done.iteration == iteration,
              "gradlane backend: completion of tensor ", done.tensor_id, " iteration ",
              done.iteration, " where ", rung->tensor_id, "/", iteration, " was due");
  std::memcpy(data, rung->data, count * sizeof(float));
}

void ProcessGroupGradlane::SumInPlace(at::Tensor& flat, const char* op) {
  TORCH_CHECK(flat.scalar_type() == at::kFloat && flat.is_contiguous(), "internal: flat buffer");
  float* data = flat.data_ptr<float>();
  const uint64_t n = static_cast<uint64_t>(flat.numel());
  const uint64_t largest = rungs_.back().floats;
  for (uint64_t off = 0; off < n; off += largest) {
    SumChunk(data + off, std::min(largest, n - off), op);
  }
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::broadcast(
    std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  CheckCpu(tensors, "broadcast");
  at::Tensor& t = tensors[0];
  at::Tensor flat = rank_ == opts.rootRank ? Encode(t) : NothingFloats(EncodedLength(t));
  SumInPlace(flat, "broadcast");
  if (rank_ != opts.rootRank) Decode(flat, t);
  return Done(tensors, ::c10d::OpType::BROADCAST);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::allreduce(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  CheckCpu(tensors, "allreduce");
  at::Tensor& t = tensors[0];
  const auto op = opts.reduceOp.op_;
  TORCH_CHECK(op == ::c10d::ReduceOp::SUM || op == ::c10d::ReduceOp::AVG,
              "gradlane backend: allreduce sums (SUM, AVG); reduce op ", static_cast<int>(op),
              " is not supported");
  const at::ScalarType type = t.scalar_type();
  if (!SummedAsValues(type)) {
    TORCH_CHECK(IntegerLike(type), "gradlane backend: allreduce of ", type,
                ": the daemons sum float32 (float16, bfloat16 and small integers convert "
                "exactly; float64 does not)");
  }
  at::Tensor flat = ValuesAsFloats(t);
  if (IntegerLike(type) && flat.numel() > 0) {
    TORCH_CHECK(flat.abs().max().item<double>() <= kExactIntegerLimit,
                "gradlane backend: allreduce of ", type, " values beyond 2^24 (not exact in "
                "float32)");
  }
  SumInPlace(flat, "allreduce");
  if (IntegerLike(type) && flat.numel() > 0) {
    TORCH_CHECK(flat.abs().max().item<double>() <= kExactIntegerLimit,
                "gradlane backend: allreduce of ", type, ": a sum beyond 2^24 (not exact in "
                "float32)");
  }
  if (op == ::c10d::ReduceOp::AVG) flat.div_(size_);
  t.copy_(flat.reshape(t.sizes()));
  return Done(tensors, ::c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts);
  }
  return Done(tensors, ::c10d::OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& /*opts*/) {
  CheckCpu(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "gradlane backend: allgather needs one list of ", size_, " output tensors");
  const at::Tensor& in = inputs[0];
  const int64_t n = EncodedLength(in);
  for (const at::Tensor& o : outputs[0]) {
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "gradlane backend: allgather outputs must match the input's size and dtype");
  }
  at::Tensor flat = NothingFloats(n * size_);
  flat.narrow(0, n * rank_, n).copy_(Encode(in));
  SumInPlace(flat, "allgather");
  for (int r = 0; r < size_; ++r) Decode(flat.narrow(0, n * r, n).contiguous(), outputs[0][r]);
  return Done(outputs[0], ::c10d::OpType::ALLGATHER);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::_allgather_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.numel() == input.numel() * size_ && output.is_contiguous(),
              "gradlane backend: _allgather_base needs a contiguous output of W x the input");
  std::vector<std::vector<at::Tensor>> outputs{output.reshape({-1}).chunk(size_)};
  for (at::Tensor& o : outputs[0]) o = o.view(input.sizes());
  std::vector<at::Tensor> inputs{input};
  allgather(outputs, inputs, opts);
  return Done({output}, ::c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::barrier(
    const ::c10d::BarrierOptions& /*opts*/) {
  at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat));
  SumInPlace(one, "barrier");
  TORCH_CHECK(one.item<float>() == static_cast<float>(size_), "gradlane backend: barrier "
              "counted ", one.item<float>(), " ranks of ", size_,
              " (are the daemons running --reduce=sum?)");
  return Done({}, ::c10d::OpType::BARRIER);
}

}  // namespace gradlane::c10d_backend

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "gradlane's torch.distributed backend (registered by gradlane.c10d)";
  m.def("create_process_group", &gradlane::c10d_backend::ProcessGroupGradlane::Create,
        pybind11::arg("store"), pybind11::arg("rank"), pybind11::arg("size"),
        pybind11::arg("timeout"));
}
