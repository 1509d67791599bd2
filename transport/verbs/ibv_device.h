// transport/verbs/ibv_device.h — the verbs protocol's QueuePair on a real RDMA device, through
// rdma-core's libibverbs: one opened port with its protection domain and one completion queue
// (with a completion channel the engine can sleep on), memory registrations, and RC queue pairs
// moved to ready-to-send from the peer's VerbsHello.
//
// Why one completion queue for every queue pair: the engine polls one queue per round whatever
// the number of peers, and routes each completion to its channel by queue pair number.
// RoCE needs a GID: `gid_index` picks the entry of the port's GID table (soft-RoCE on an IPv4
// interface: index 1 is the RoCEv2 IPv4-mapped address).
//
// Thread rules: an IbvDevice and its queue pairs belong to one thread (the engine's); Register
// and an IbvMemory's destruction may run on any thread (libibverbs is thread-safe, and they
// touch only the protection domain, fixed at Open): the transport registers client arenas on
// the session server's thread (registration_cache.h). Ownership: the device outlives its queue
// pairs and registrations (destroy them first). Built only where libibverbs is found (meson option
// `verbs`).
#ifndef GRADLANE_TRANSPORT_VERBS_IBV_DEVICE_H_
#define GRADLANE_TRANSPORT_VERBS_IBV_DEVICE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/verbs/registration_cache.h"
#include "transport/verbs/verbs_counters.h"
#include "transport/verbs/verbs_queue_pair.h"
#include "transport/verbs/verbs_wire.h"

namespace gradlane::transport::verbs {

// A registered memory region; deregistered when destroyed (and taken out of its device's
// registration counters).
class IbvMemory final : public MemoryRegistration {
 public:
  ~IbvMemory() override;
  IbvMemory(const IbvMemory&) = delete;
  IbvMemory& operator=(const IbvMemory&) = delete;
  uint32_t lkey() const override { return mr_->lkey; }
  uint32_t rkey() const override { return mr_->rkey; }
  uint8_t* base() const { return static_cast<uint8_t*>(mr_->addr); }
  uint64_t bytes() const { return mr_->length; }

 private:
  friend class IbvDevice;
  IbvMemory(ibv_mr* mr, RegistrationCounters& counters) : mr_(mr), counters_(counters) {}
  ibv_mr* mr_;
  RegistrationCounters& counters_;  // the device's, which outlives its registrations
};

class IbvQueuePair final : public QueuePair {
 public:
  ~IbvQueuePair() override;
  IbvQueuePair(const IbvQueuePair&) = delete;
  IbvQueuePair& operator=(const IbvQueuePair&) = delete;

  absl::Status PostSend(const SendWork& work) override;
  absl::Status PostRecv(const RecvWork& work) override;

  uint32_t qp_num() const { return qp_->qp_num; }
  // This side's handshake fields (reply region fields left to the caller).
  VerbsHello LocalHello() const;
  // RESET → INIT → RTR → RTS towards the peer that sent `peer`.
  absl::Status Connect(const VerbsHello& peer);

 private:
  friend class IbvDevice;
  IbvQueuePair(ibv_qp* qp, const class IbvDevice& device, uint32_t psn)
      : qp_(qp), device_(device), psn_(psn) {}
  ibv_qp* qp_;
  const IbvDevice& device_;
  uint32_t psn_;
};

// A completion with the queue pair it belongs to.
struct RoutedCompletion {
  uint32_t qp_num = 0;
  Completion completion;
};

class IbvDevice {
 public:
  // Opens `name` (empty: the first device found) at `port`. NotFound when there is no RDMA
  // device (the message says how to get soft-RoCE), FailedPrecondition when the port is down.
  static absl::StatusOr<std::unique_ptr<IbvDevice>> Open(std::string_view name, uint8_t port,
                                                         int gid_index, int cq_depth = 65536);
  ~IbvDevice();
  IbvDevice(const IbvDevice&) = delete;
  IbvDevice& operator=(const IbvDevice&) = delete;

  // Counted in registrations() (a refusal too), from whichever thread registers.
  // Failure: Unavailable with errno's text; when the kernel refused to pin more memory (ENOMEM
  // or EPERM while RLIMIT_MEMLOCK is finite), the message names the limit, its value and how
  // to raise it (RegistrationErrorText).
  absl::StatusOr<std::unique_ptr<IbvMemory>> Register(void* base, uint64_t bytes,
                                                      bool remote_write) const;
  // GPUDirect: registers the first `bytes` of the dma-buf `fd` (ibv_reg_dmabuf_mr) for the
  // NIC's reads and for remote writes, addressed from `iova`. Counted like Register. Unavailable
  // with errno's text when the device or the kernel refuses (no dma-buf support: soft-RoCE, a NIC
  // driver without it, an fd that is not a dma-buf).
  absl::StatusOr<std::unique_ptr<IbvMemory>> RegisterDmabuf(int fd, uint64_t bytes,
                                                            uint64_t iova) const;
  // What is registered now, and the refusals so far; any thread.
  const RegistrationCounters& registrations() const { return registrations_; }
  absl::StatusOr<std::unique_ptr<IbvQueuePair>> CreateQueuePair(uint32_t send_depth,
                                                                uint32_t recv_depth);
  // Polls up to out.size() completions; returns how many, or an error if the queue failed.
  absl::StatusOr<size_t> Poll(std::span<RoutedCompletion> out);
  // The completion channel's descriptor (readable after ArmCompletionEvent once a completion
  // arrives) and the re-arm after reading it.
  int completion_fd() const;
  absl::Status ArmCompletionEvent();
  void AckCompletionEvents();

  std::string name() const;
  uint8_t port() const { return port_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  ibv_mtu active_mtu() const { return active_mtu_; }

 private:
  IbvDevice() = default;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  uint8_t port_ = 1;
  int gid_index_ = 0;
  ibv_gid gid_{};
  ibv_mtu active_mtu_ = IBV_MTU_1024;
  mutable RegistrationCounters registrations_;  // atomics: Register is const, any thread
};

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_IBV_DEVICE_H_
