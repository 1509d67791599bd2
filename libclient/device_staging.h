// libclient/device_staging.h — tensors that live in GPU memory, staged through the session's
// shared-memory arena (gl_register_device_tensor).
//
// What it does: the daemon reads and writes the arena only, so a device tensor has a staging
// buffer there like any tensor. gl_post copies the posted range device → arena on a stream of
// our own before the descriptor goes to the daemon; a completion of a device tensor starts the
// copy arena → device of the reduced range and is handed to the caller only once that copy has
// finished, so the result is in GPU memory when the caller sees the completion. Completions
// leave in the order they came from the daemon (host and device tensors alike).
//
// Why these rules: a post must not return before its bytes are in the arena (the daemon may
// send them at once), and a completion must not be seen before its bytes are on the device
// (the caller reuses the tensor then). The copies run on streams of this client's own. The
// copy to the arena waits for the work already issued to the legacy default stream (kernels on
// stream 0, PyTorch's default stream, cudaMemcpy — whose copy from pageable memory may still be
// landing when it returns): it synchronizes that stream and runs on a blocking stream, so a
// gradient computed there needs no synchronize before gl_post. Work on the caller's other
// streams must be finished first, or named by an event (gl_post_after: that copy runs on a
// non-blocking stream that waits for the event alone, so a post from a thread of its own is
// not held up by what the training thread has queued on the legacy stream since). The copy
// back runs on a non-blocking stream, so a result never waits for compute the caller has
// queued since. The arena is pinned (cuMemHostRegister) so that the copies are DMA transfers;
// where pinning is refused they still work, through the driver's bounce buffers.
//
// Where the NIC can read GPU memory (dma-buf + RDMA verbs) staging is the fallback that path
// keeps; docs/gpu.md says what is built.
//
// Threads (gradlane.h's rule: one thread may post while another polls): StageIn and the
// tensor table are the poster's, Accept/TakeReady/WaitForHead the poller's; Add runs in control
// calls, which are never concurrent with either. Each side has its own stream; the CUDA driver
// is thread-safe.
//
// Memory: everything is allocated at Create and Add (control calls); posting and polling
// allocate nothing. The pending completions are bounded by the completion ring's slots.
#ifndef GRADLANE_LIBCLIENT_DEVICE_STAGING_H_
#define GRADLANE_LIBCLIENT_DEVICE_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libclient/cuda_driver.h"
#include "shm/abi.h"

namespace gradlane::client {

// Where a device pointer lives, as the driver reports it.
struct DevicePointerInfo {
  cu::Context context = nullptr;
  cu::DevicePtr range_start = 0;  // the allocation holding it
  uint64_t range_bytes = 0;
};

// Checks that [ptr, ptr + bytes) is device memory within one allocation. InvalidArgument
// says what is wrong (host memory, an unknown pointer, a range past the allocation's end).
absl::StatusOr<DevicePointerInfo> InspectDevicePointer(const CudaDriver& cuda, cu::DevicePtr ptr,
                                                       uint64_t bytes);

class DeviceStaging {
 public:
  // `arena` is pinned for the session's life; `completion_slots` bounds the completions held
  // while their copies run (the completion ring's size: never more are outstanding).
  static absl::StatusOr<std::unique_ptr<DeviceStaging>> Create(const CudaDriver& cuda,
                                                               cu::Context context, void* arena,
                                                               uint64_t arena_bytes,
                                                               uint32_t completion_slots);
  // Waits for copies still running (their memory is about to go), then frees streams and events
  // and unpins the arena.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  cu::Context context() const { return context_; }
  bool arena_pinned() const { return pinned_; }

  // Control: tensor `id`'s data lives at `device`; `staging` is its buffer in the arena.
  void Add(uint32_t id, cu::DevicePtr device, std::byte* staging, uint64_t bytes);
  bool IsDevice(uint32_t id) const { return id < tensors_.size() && tensors_[id].bytes > 0; }
  // Control, GPUDirect: the daemon sends tensor `id`'s pushes from GPU memory once `map`
  // (in the arena, `map_bits` bits of room) says ready; StageIn then copies only the
  // partitions it marks.
  void SetStageMap(uint32_t id, const gl_stage_map* map, uint32_t map_bits) {
    if (id < tensors_.size()) {
      tensors_[id].map = map;
      tensors_[id].map_bits = map_bits;
    }
  }
  // Control: the GPU needs cuFlushGPUDirectRDMAWrites before it may read what a NIC wrote
  // (it does not order those writes itself).
  void set_flush_nic_writes(bool flush) { flush_nic_writes_ = flush; }
  // The daemon has published the tensor's map (any thread).
  bool IsDirect(uint32_t id) const;
  // Bytes StageIn copied, and bytes it left to the NIC to read from GPU memory (poster's).
  uint64_t staged_bytes() const { return staged_bytes_; }
  uint64_t direct_bytes() const { return direct_bytes_; }
  // Result bytes Accept copied back, and those the NIC wrote into GPU memory (poller's).
  uint64_t copied_back_bytes() const { return copied_back_bytes_; }
  uint64_t written_direct_bytes() const { return written_direct_bytes_; }

  // Poster: copies bytes [offset, offset + length) of device tensor `id` into its staging
  // buffer and waits for the copy. A range outside the tensor is left alone (the daemon refuses
  // the descriptor with GL_E_BAD_RANGE). Internal error: the driver's words.
  // `after` non-null (gl_post_after): the copy waits for that event instead of the legacy
  // default stream.
  absl::Status StageIn(uint32_t id, uint64_t offset, uint64_t length, cu::Event after = nullptr);

  // Poller. Full(): no room for another completion (stop taking from the ring).
  bool Full() const { return count_ == slots_.size(); }
  bool HasPending() const { return count_ > 0; }
  // Takes a completion from the ring: a device tensor's successful one starts its copy back;
  // a failed copy turns it into GL_E_DEVICE, with the reason kept for last_error().
  void Accept(const gl_cqe& e);
  // The oldest completion, if its copy (if any) has finished.
  bool TakeReady(gl_cqe* out);
  // Blocks until the oldest completion's copy has finished (gl_wait, when nothing else can
  // arrive sooner).
  void WaitForHead();
  // Why the last completion turned into GL_E_DEVICE ("" if none has).
  const std::string& last_error() const { return last_error_; }

 private:
  struct Tensor {
    cu::DevicePtr device = 0;
    std::byte* staging = nullptr;
    uint64_t bytes = 0;
    const gl_stage_map* map = nullptr;  // GPUDirect: what to stage, once ready
    uint32_t map_bits = 0;
  };
  struct Slot {
    gl_cqe cqe{};
    cu::Event event = nullptr;  // created once, reused
    bool copying = false;       // `event` marks a copy still to finish
  };
  // Pushes the tensors' context on the calling thread for the scope of one driver call chain
  // (the caller's own current context is restored after).
  class ContextScope;

  DeviceStaging(const CudaDriver& cuda, cu::Context context) : cuda_(cuda), context_(context) {}
  void FailSlot(Slot& s, const std::string& why);
  // Calls fn(begin, bytes) for each run of [offset, offset + length) that goes through the
  // arena: all of it (kWhole), or with a ready stage map only the partitions it marks (kByMap;
  // the rest the NIC reads from, and writes into, GPU memory). Adds the bytes of each kind to
  // the counters. kBrokenMap: a ready map that does not fit the tensor, nothing called.
  enum class Staging { kWhole, kByMap, kBrokenMap };
  template <typename Fn>
  Staging ForEachStagedPiece(const Tensor& t, uint64_t offset, uint64_t length, uint64_t* staged,
                             uint64_t* direct, Fn&& fn);

  const CudaDriver& cuda_;
  cu::Context context_;
  void* arena_ = nullptr;
  bool pinned_ = false;
  cu::Stream to_arena_ = nullptr;              // the poster's (blocking: after the legacy stream)
  cu::Stream to_arena_after_event_ = nullptr;  // the poster's, for gl_post_after (non-blocking)
  cu::Stream to_device_ = nullptr;             // the poller's
  std::vector<Tensor> tensors_;                // by tensor id; bytes 0 = a host tensor
  std::vector<Slot> slots_;                    // FIFO of completions held for their copies
  size_t head_ = 0, count_ = 0;
  std::string last_error_;
  uint64_t staged_bytes_ = 0, direct_bytes_ = 0;               // the poster's
  uint64_t copied_back_bytes_ = 0, written_direct_bytes_ = 0;  // the poller's
  bool flush_nic_writes_ = false;
};

}  // namespace gradlane::client

#endif  // GRADLANE_LIBCLIENT_DEVICE_STAGING_H_
