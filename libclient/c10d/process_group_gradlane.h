// libclient/c10d/process_group_gradlane.h — the c10d backend "gradlane": torch.distributed
// collectives over the host's gradlaned, so an unchanged DDP script runs over the daemons
// (`import gradlane.c10d`, then `init_process_group("gradlane")`; docs/training.md §5).
//
// How: one gradlane job per process group, holding a ladder of float32 scratch tensors
// (4 KiB, 8 KiB, ... 16 MiB, doubling). A collective is cut into 16 MiB chunks and a remainder
// that is split along the ladder (binary: 9 MiB = 8 + 1), so at most the last 4 KiB is
// padding; pieces on different rungs are posted together and the daemons reduce them side by
// side; each returns when the daemons have summed it in rank order.
//   allreduce   SUM (AVG: the sum, then divided by W); float32 exactly as the daemons sum;
//               float16/bfloat16 summed in float32 and rounded once (the daemons' arithmetic);
//               integer and bool tensors while every value and sum is exact in float32
//               (|x| <= 2^24), else an error.
//   broadcast   the root contributes its values, every other rank -0.0: the sum is the root's
//               bits (x + -0.0 == x). Tensors of other dtypes travel as one float per byte.
//   allgather   rank r fills slot r, the others -0.0; the sum is every rank's slot.
//   barrier     an allreduce of one element.
// Other collectives (reduce, scatter, gather, all-to-all, send/recv) raise "not supported".
//
// Guarantees and rules: collectives run in the order issued, on one worker thread per group
// that alone uses the gradlane client; each returns a Work whose Future completes when the
// result is in place (DDP chains on it, so its buckets overlap backward as over gloo). As
// with every c10d backend, inputs must stay untouched until then. Errors (a daemon or peer
// gone, a timeout) complete the Work with a RuntimeError carrying the gradlane status and the
// daemon's message, never hang past the group's timeout; after one, every later collective
// of the group fails with it. Issuing collectives: one thread at a time, as c10d requires.
// Exceptions are the torch extension's error path (TORCH_CHECK); nothing here is on the
// daemon's data path.
#ifndef GRADLANE_LIBCLIENT_C10D_PROCESS_GROUP_GRADLANE_H_
#define GRADLANE_LIBCLIENT_C10D_PROCESS_GROUP_GRADLANE_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "libclient/gradlane.h"

namespace gradlane::c10d_backend {

class ProcessGroupGradlane final : public ::c10d::ProcessGroup {
 public:
  // The creator torch.distributed calls (Backend.register_backend). Job, peers and socket come
  // from the environment and the group's store: see docs/training.md §5.
  static c10::intrusive_ptr<::c10d::ProcessGroup> Create(
      const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
      const std::chrono::duration<float>& timeout);

  ~ProcessGroupGradlane() override;

  const std::string getBackendName() const override { return "gradlane"; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;

  struct Rung {
    uint32_t tensor_id = 0;
    float* data = nullptr;
    uint64_t floats = 0;
    int64_t next_iteration = 0;
  };

  // Use Create(); public for c10::make_intrusive. Takes ownership of `client`.
  ProcessGroupGradlane(int rank, int size, gl_client* client, std::vector<Rung> rungs,
                       int timeout_ms, std::string job_id);

 private:
  class Work;
  // Queues `run` for the worker; the returned Work completes with `outputs` after it.
  c10::intrusive_ptr<::c10d::Work> Enqueue(std::function<void()> run,
                                           std::vector<at::Tensor> outputs, ::c10d::OpType op);
  void WorkerLoop();

  // Worker thread only. Sums `flat` (contiguous float32) across the ranks in place, in rank
  // order.
  void SumInPlace(at::Tensor& flat, const char* op);
  // Posts `count` floats from `data` on `rung` (padded with zeros) as its next iteration.
  void PostPiece(Rung& rung, const float* data, uint64_t count, const char* op);
  // Waits for every posted piece and copies each result back.
  void CollectPieces(const char* op);
  [[noreturn]] void Fail(const char* op, int status, const std::string& what);

  struct Piece {
    Rung* rung;
    float* data;
    uint64_t count;
    int64_t iteration;
  };

  gl_client* client_;
  std::vector<Rung> rungs_;  // ascending size, each twice the one before
  int timeout_ms_;
  std::string job_id_;
  std::vector<Piece> in_flight_;  // worker thread only

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, c10::intrusive_ptr<Work>>> queue_;  // mu_
  bool stop_ = false;                                                             // mu_
  std::exception_ptr failed_;  // worker thread only: the first error ends the group
  std::thread worker_;
};

}  // namespace gradlane::c10d_backend

#endif  // GRADLANE_LIBCLIENT_C10D_PROCESS_GROUP_GRADLANE_H_
