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

// Rungs of 4 KiB, 8 KiB, ... 16 MiB (32 MiB of arena): any size is a sum of rungs to within
// the last 4 KiB, and a DDP bucket (25 MiB by default) goes out as 16 + 8 + 1 MiB at once.
constexpr uint64_t kSmallestRungBytes = 4096;
constexpr int kRungs = 13;
// float32 holds every integer of magnitude up to 2^24 exactly.
constexpr double kExactIntegerLimit = 16777216.0;

bool SummedAsValues(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

bool IntegerLike(at::ScalarType t) { return at::isIntegralType(t, /*includeBool=*/true); }

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
  at::Tensor bytes =
      at::from_blob(contiguous.data_ptr(), {static_cast<int64_t>(contiguous.nbytes())},
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
  TORCH_CHECK(tensors.size() == 1, "gradlane backend: ", op, " takes one tensor per call (",
              tensors.size(), " given)");
  TORCH_CHECK(tensors[0].device().is_cpu(), "gradlane backend: ", op, " of a tensor on ",
              tensors[0].device(), ": only CPU tensors are supported");
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
    TORCH_CHECK(!mine.empty(),
                "gradlane backend: set GRADLANE_PEERS (every rank's daemon "
                "address, in rank order) or GRADLANE_ADDRESS (this rank's daemon's --listen "
                "address; the ranks exchange them through the store)");
    StoreSet(store, "gradlane/address/" + std::to_string(rank), mine);
    for (int r = 0; r < size; ++r)
      peers.push_back(StoreGet(store, "gradlane/address/" + std::to_string(r)));
  }
  TORCH_CHECK(size == 1 || static_cast<int>(peers.size()) == size,
              "gradlane backend: ", peers.size(), " daemon addresses in GRADLANE_PEERS for ", size,
              " ranks");

  std::vector<Rung> rungs(kRungs);
  uint64_t arena = 1u << 20;
  for (int i = 0; i < kRungs; ++i) {
    rungs[i].floats = (kSmallestRungBytes << i) / sizeof(float);
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
  const std::string mode = Env("GRADLANE_MODE", "ps");
  TORCH_CHECK(mode == "ps" || mode == "allreduce",
              "gradlane backend: GRADLANE_MODE must be ps or allreduce, got '", mode, "'");
  gl_job_info job{};
  job.job_id = job_id.c_str();
  job.rank = static_cast<uint32_t>(rank);
  job.world_size = static_cast<uint32_t>(size);
  job.peers = peer_ptrs.empty() ? nullptr : peer_ptrs.data();
  job.num_peers = static_cast<uint32_t>(peer_ptrs.size());
  job.policy = policy.empty() ? nullptr : policy.c_str();
  job.auth_token = token.empty() ? nullptr : token.c_str();
  rc = gl_register_job_mode(client, &job, mode == "allreduce" ? GL_MODE_ALLREDUCE : GL_MODE_PS);
  for (int i = 0; rc == GL_OK && i < kRungs; ++i) {
    void* buffer = nullptr;
    const std::string name = "c10d.rung" + std::to_string(i);
    rc = gl_register_tensor(client, name.c_str(), rungs[i].floats * sizeof(float), GL_DTYPE_F32, 0,
                            &rungs[i].tensor_id, &buffer);
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
  worker_ = std::thread([this] { WorkerLoop(); });
}

ProcessGroupGradlane::~ProcessGroupGradlane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;  // the worker finishes what is queued first
  }
  cv_.notify_all();
  worker_.join();
  gl_close(client_);
}

class ProcessGroupGradlane::Work final : public ::c10d::Work {
 public:
  Work(std::vector<at::Tensor> outputs, ::c10d::OpType op)
      : ::c10d::Work(-1, op),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  bool wait(std::chrono::milliseconds /*timeout: the group's own bounds every round*/) override {
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void Finish(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::Enqueue(std::function<void()> run,
                                                               std::vector<at::Tensor> outputs,
                                                               ::c10d::OpType op) {
  auto work = c10::make_intrusive<Work>(std::move(outputs), op);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(run), work);
  }
  cv_.notify_one();
  return work;
}

void ProcessGroupGradlane::WorkerLoop() {
  for (;;) {
    std::pair<std::function<void()>, c10::intrusive_ptr<Work>> next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!failed_) {
      try {
        next.first();
      } catch (...) {
        failed_ = std::current_exception();
      }
    }
    next.second->Finish(failed_);
  }
}

void ProcessGroupGradlane::Fail(const char* op, int status, const std::string& what) {
  const std::string detail = gl_last_error(client_);
  TORCH_CHECK(false, "gradlane backend: ", op, " (job ", job_id_, ", rank ", rank_, "): ", what,
              ": ", gl_strerror(status), detail.empty() ? "" : " (" + detail + ")");
}

void ProcessGroupGradlane::PostPiece(Rung& rung, const float* data, uint64_t count,
                                     const char* op) {
  std::memcpy(rung.data, data, count * sizeof(float));
  std::memset(rung.data + count, 0, (rung.floats - count) * sizeof(float));
  const int64_t iteration = rung.next_iteration++;
  int rc;
  while ((rc = gl_post(client_, rung.tensor_id, iteration, 0, GL_WHOLE_TENSOR, 0)) == GL_E_AGAIN) {
    std::this_thread::yield();  // the daemon is taking the ring's earlier entries
  }
  if (rc != GL_OK) Fail(op, rc, "post");
  in_flight_.push_back(Piece{&rung, const_cast<float*>(data), count, iteration});
}

void ProcessGroupGradlane::CollectPieces(const char* op) {
  // The deadline moves with each result: it bounds a stall, not a long collective.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  while (!in_flight_.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    gl_completion done[16];
    uint32_t n = 0;
    const int rc =
        gl_wait(client_, done, 16, &n, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (rc == GL_E_TIMEOUT) Fail(op, rc, "no result within the group's timeout");
    if (rc != GL_OK) Fail(op, rc, "wait");
    if (n > 0) deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    for (uint32_t i = 0; i < n; ++i) {
      const gl_completion& c = done[i];
      if (c.status != GL_OK) Fail(op, c.status, "round " + std::to_string(c.iteration));
      auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const Piece& p) {
        return p.rung->tensor_id == c.tensor_id && p.iteration == c.iteration;
      });
      TORCH_CHECK(it != in_flight_.end(), "gradlane backend: completion of tensor ", c.tensor_id,
                  " iteration ", c.iteration, ", which was not posted");
      std::memcpy(it->data, it->rung->data, it->count * sizeof(float));
      in_flight_.erase(it);
    }
  }
}

void ProcessGroupGradlane::SumInPlace(at::Tensor& flat, const char* op) {
  TORCH_CHECK(flat.scalar_type() == at::kFloat && flat.is_contiguous(), "internal: flat buffer");
  float* data = flat.data_ptr<float>();
  const uint64_t n = static_cast<uint64_t>(flat.numel());
  Rung& top = rungs_.back();
  uint64_t off = 0;
  // Whole top rungs, one after the other (a rung holds one round at a time)...
  for (; n - off > top.floats; off += top.floats) {
    PostPiece(top, data + off, top.floats, op);
    CollectPieces(op);
  }
  // ...then the rest along the ladder: in units of the smallest rung, rounded up, its binary
  // digits name distinct rungs, all in flight at once; only the last piece is partial.
  uint64_t left = n - off;
  const uint64_t units = (left + rungs_[0].floats - 1) / rungs_[0].floats;
  for (int i = kRungs - 1; i >= 0 && left > 0; --i) {
    if ((units & (uint64_t{1} << i)) == 0) continue;
    const uint64_t count = std::min(left, rungs_[i].floats);
    PostPiece(rungs_[i], data + off, count, op);
    off += count;
    left -= count;
  }
  CollectPieces(op);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::broadcast(
    std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  CheckCpu(tensors, "broadcast");
  at::Tensor t = tensors[0];
  const int64_t root = opts.rootRank;
  return Enqueue(
      [this, t, root]() mutable {
        at::Tensor flat = rank_ == root ? Encode(t) : NothingFloats(EncodedLength(t));
        SumInPlace(flat, "broadcast");
        if (rank_ != root) Decode(flat, t);
      },
      tensors, ::c10d::OpType::BROADCAST);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::allreduce(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  CheckCpu(tensors, "allreduce");
  at::Tensor t = tensors[0];
  const auto op = opts.reduceOp.op_;
  TORCH_CHECK(op == ::c10d::ReduceOp::SUM || op == ::c10d::ReduceOp::AVG,
              "gradlane backend: allreduce sums (SUM, AVG); reduce op ", static_cast<int>(op),
              " is not supported");
  const at::ScalarType type = t.scalar_type();
  const bool integer = IntegerLike(type);
  TORCH_CHECK(SummedAsValues(type) || integer, "gradlane backend: allreduce of ", type,
              ": the daemons sum float32 (float16, bfloat16 and small integers convert "
              "exactly; float64 does not)");
  if (integer && t.numel() > 0) {
    TORCH_CHECK(t.to(at::kDouble).abs().max().item<double>() <= kExactIntegerLimit,
                "gradlane backend: allreduce of ", type,
                " values beyond 2^24 (not exact in "
                "float32)");
  }
  const bool average = op == ::c10d::ReduceOp::AVG;
  return Enqueue(
      [this, t, integer, average, type]() mutable {
        at::Tensor flat = ValuesAsFloats(t);
        SumInPlace(flat, "allreduce");
        if (integer && flat.numel() > 0) {
          TORCH_CHECK(flat.abs().max().item<double>() <= kExactIntegerLimit,
                      "gradlane backend: allreduce of ", type,
                      ": a sum beyond 2^24 (not "
                      "exact in float32)");
        }
        if (average) flat.div_(size_);
        t.copy_(flat.reshape(t.sizes()));
      },
      tensors, ::c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts);
  }
  // Queued after them: it completes when they all have.
  return Enqueue([] {}, tensors, ::c10d::OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& /*opts*/) {
  CheckCpu(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "gradlane backend: allgather needs one list of ", size_, " output tensors");
  const at::Tensor in = inputs[0];
  for (const at::Tensor& o : outputs[0]) {
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "gradlane backend: allgather outputs must match the input's size and dtype");
  }
  std::vector<at::Tensor> outs = outputs[0];
  return Enqueue(
      [this, in, outs]() mutable {
        const int64_t n = EncodedLength(in);
        at::Tensor flat = NothingFloats(n * size_);
        flat.narrow(0, n * rank_, n).copy_(Encode(in));
        SumInPlace(flat, "allgather");
        for (int r = 0; r < size_; ++r) Decode(flat.narrow(0, n * r, n).contiguous(), outs[r]);
      },
      outputs[0], ::c10d::OpType::ALLGATHER);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::_allgather_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.numel() == input.numel() * size_ && output.is_contiguous(),
              "gradlane backend: _allgather_base needs a contiguous output of W x the input");
  std::vector<std::vector<at::Tensor>> outputs{output.reshape({-1}).chunk(size_)};
  for (at::Tensor& o : outputs[0]) o = o.view(input.sizes());
  std::vector<at::Tensor> inputs{input};
  allgather(outputs, inputs, opts);
  return Enqueue([] {}, {output}, ::c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupGradlane::barrier(
    const ::c10d::BarrierOptions& /*opts*/) {
  return Enqueue(
      [this] {
        at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat));
        SumInPlace(one, "barrier");
        TORCH_CHECK(one.item<float>() == static_cast<float>(size_),
                    "gradlane backend: "
                    "barrier counted ",
                    one.item<float>(), " ranks of ", size_,
                    " (are the daemons running --reduce=sum?)");
      },
      {}, ::c10d::OpType::BARRIER);
}

}  // namespace gradlane::c10d_backend

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "gradlane's torch.distributed backend (registered by gradlane.c10d)";
  m.def("create_process_group", &gradlane::c10d_backend::ProcessGroupGradlane::Create,
        pybind11::arg("store"), pybind11::arg("rank"), pybind11::arg("size"),
        pybind11::arg("timeout"));
}
