// daemon/session.h — the daemon's side of one client session: its arena, its two rings and
// doorbells, its job and tensors, validation of everything the client writes, completions.
//
// Guarantees:
// - Thread rules: Create() and SendHelloReply() run on the thread that creates the session (the
//   session server's acceptor thread); the server then hands it to the engine thread through
//   its locked queue (which orders everything before it), and from then on the session belongs
//   to that thread: every `_st` method and accessor is for it only. The accessors without the
//   suffix (id, fds, peer, arena) return what is fixed at creation: any thread. PostSink's
//   OnPost_st runs on the engine thread. Nothing here locks.
// - Shared memory is hostile. Each submission is copied out of the ring once, then checked
//   (opcode, reserved fields, job, tensor id, range, element alignment, iteration order); a
//   bad one is answered with an error completion and counted, and the session goes on. An
//   inconsistent ring header or index is fatal for this session only (PollSubmissions_st
//   reports it; the server then closes the session with GL_E_RING_CORRUPT).
// - Backpressure, never blocking: every submission taken from the ring reserves a completion
//   slot first, so Complete_st() can always post. When the client stops draining completions,
//   the daemon stops taking submissions and the client's ring fills (gl_post -> GL_E_AGAIN).
// - Data path (PollSubmissions_st, Complete_st, FlushCompletions_st) does not allocate; control
//   path (HandleControl_st) may, and answers with a gl_reply carrying a gl_status and a message.
#ifndef GRADLANE_DAEMON_SESSION_H_
#define GRADLANE_DAEMON_SESSION_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/arena_alias.h"
#include "sched/types.h"
#include "shm/abi.h"
#include "shm/arena.h"
#include "shm/doorbell.h"
#include "shm/ring.h"
#include "shm/uds.h"

namespace gradlane::daemon {

// What a client registered for its job (stored for the engine: peers, policy, token).
struct JobInfo {
  std::string job_id;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::vector<std::string> peers;  // "host:port" of every rank's daemon, in rank order
  std::string policy;
  std::string auth_token;
  gl_job_mode mode = GL_MODE_PS;
};

struct TensorInfo {
  uint32_t id = 0;  // dense per session, in registration order (equal across ranks that
                    // register the same tensors in the same order)
  std::string name;
  uint64_t bytes = 0;
  sched::DType dtype = sched::DType::kF32;
  int32_t priority = GL_PRIORITY_AUTO;
  uint64_t offset = 0;          // buffer's offset in the arena
  int64_t last_iteration = -1;  // -1: never posted

  // Bytes of last_iteration already posted, as disjoint [begin, end) ranges, adjacent ones
  // merged. The shard counts contributed bytes, so a byte posted twice in one iteration would
  // complete a partition with bytes never posted and corrupt the sum on every rank: it is
  // refused (GL_E_BAD_RANGE). Fixed capacity, so validation never allocates; posting in order
  // (or in a few out-of-order pieces) keeps one or a few ranges whatever the piece count.
  static constexpr int kMaxPostedRanges = 64;
  std::array<std::pair<uint64_t, uint64_t>, kMaxPostedRanges> posted{};
  int posted_count = 0;

  // Records [begin, end) for the current iteration; false (nothing recorded) if it overlaps
  // bytes already posted or would need more than kMaxPostedRanges disjoint ranges.
  bool RecordPosted(uint64_t begin, uint64_t end);
};

// GPUDirect: the GPU memory behind a device tensor, as the client exported it
// (GL_MSG_ATTACH_DEVICE). The job registers it with the NIC when it starts and publishes the
// tensor's stage map at `stage_map_offset` in the arena.
struct DeviceAttachment {
  uint32_t tensor_id = 0;
  shm::UniqueFd dmabuf;
  uint64_t dmabuf_offset = 0;  // the tensor's first byte in the dma-buf
  uint64_t dmabuf_bytes = 0;
  uint64_t device_address = 0;  // the dma-buf's first byte in the client's GPU address space
  uint64_t stage_map_offset = 0;
  uint32_t map_bits = 0;  // the partitions the map can describe
};

// The stage map of a tensor of `bytes` bytes of `dtype`: room for one bit per partition at the
// finest cut the engine can make (one element each), at most sched::kMaxPartitions.
uint32_t StageMapBits(uint64_t bytes, sched::DType dtype);
inline uint64_t StageMapBytes(uint32_t bits) { return sizeof(gl_stage_map) + (bits + 7) / 8; }

// A submission that passed validation, as the engine receives it.
struct PostDescriptor {
  uint64_t session_id = 0;
  uint32_t tensor_id = 0;
  int64_t iteration = 0;
  uint64_t offset = 0;  // within the tensor
  uint64_t length = 0;
  uint64_t user_data = 0;
};

class Session;

// Receives valid posts (engine thread, from inside Session::PollSubmissions_st). The engine must
// eventually call Session::Complete_st() exactly once per descriptor (a completion slot is
// already reserved for it).
class PostSink {
 public:
  virtual ~PostSink() = default;
  virtual void OnPost_st(Session& session, const PostDescriptor& post) = 0;
};

// Per-session counters (engine thread; the server aggregates them into atomics).
struct SessionCounters {
  uint64_t posts_ok = 0;
  uint64_t completions = 0;
  uint64_t cq_stalls = 0;  // polls that stopped because the client did not drain completions
  std::array<uint64_t, GL_STATUS_COUNT> bad_descriptors{};  // by gl_status
};

class Session {
 public:
  // Geometry of the arena: header page, submission ring, completion ring, then tensor data.
  struct Layout {
    uint64_t sq_offset, cq_offset, data_offset, arena_bytes;
  };
  static Layout ComputeLayout(uint32_t ring_slots, uint64_t arena_bytes);

  // Creates the arena (memfd), initialises both rings and creates the doorbells.
  // `ring_slots` must be a power of two; `arena_bytes` must leave room for the rings.
  // `socket` is taken only on success (on failure the caller still owns it, to reply).
  static absl::StatusOr<std::unique_ptr<Session>> Create(uint64_t id, shm::UniqueFd&& socket,
                                                         shm::PeerCredentials peer,
                                                         uint32_t ring_slots, uint64_t arena_bytes);

  // Sends the hello reply with the arena memfd and both doorbell fds, then drops this side's
  // copy of the memfd (the mapping stays). On the creating thread, before the hand-off.
  absl::Status SendHelloReply(uint64_t request_id);
  // The ABI version the client speaks (CheckHello accepted it), before SendHelloReply: the
  // reply, the arena header and the control messages follow it.
  void SetAbiVersion(uint32_t version);
  // Replies `status` to a control message the server could not even read (too long, too many
  // fds), so that no request goes unanswered.
  absl::Status RefuseControl_st(uint64_t request_id, gl_status status, const std::string& why);

  // Handles one control message received on the socket (anything after the hello) and sends
  // the reply. Returns an error only if the socket failed (the session should be closed).
  // `fds`: those that came with it (a GL_MSG_ATTACH_DEVICE takes its one; any other message's
  // are closed). `device_memory`: the transport can send from GPU memory.
  absl::Status HandleControl_st(const void* message, size_t length,
                                std::span<shm::UniqueFd> fds = {}, bool device_memory = false);

  // Takes up to `budget` submissions. Valid ones go to `sink`; bad ones get an error
  // completion. Returns how many were taken; `*corrupt` is set when the client broke its ring.
  uint32_t PollSubmissions_st(PostSink* sink, uint32_t budget, bool* corrupt);

  // Posts the completion of a descriptor handed to a sink (or an error for one). Never blocks.
  // FailedPrecondition if no slot was reserved; DataLoss if the client corrupted the ring.
  absl::Status Complete_st(const PostDescriptor& post, gl_status status);

  // Rings the client's completion doorbell if it sleeps and something was posted since the
  // last flush. One check per batch rather than per completion.
  void FlushCompletions_st();

  // Sleep protocol on the submission ring (see shm/doorbell.h). Arm returns false, leaving
  // the doorbell disarmed, when a submission is already waiting.
  bool ArmSubmissionDoorbell_st();
  void DisarmSubmissionDoorbell_st() { sq_bell_.Disarm(); }
  void DrainSubmissionDoorbell_st() { sq_bell_.Drain(); }

  // Best-effort unsolicited gl_reply (GL_MSG_GOODBYE) before the server closes the session.
  void SendGoodbye_st(gl_status status, const std::string& why);

  // Fixed at creation: any thread.
  uint64_t id() const { return id_; }
  int socket_fd() const { return socket_.get(); }
  int sq_doorbell_fd() const { return sq_efd_.get(); }
  const shm::PeerCredentials& peer() const { return peer_; }
  uint64_t arena_bytes() const { return arena_.size(); }
  uint8_t* arena_base() const { return arena_.base(); }  // for the engine (tensor data)
  // The daemon's alias of the arena, registered with the transport's device where it has one
  // (daemon/arena_alias.h): the session server sets it on the creating thread, before the
  // hand-off; jobs share it. Null for a session made without a server (tests).
  const std::shared_ptr<ArenaAlias>& alias() const { return alias_; }
  void set_alias(std::shared_ptr<ArenaAlias> alias) { alias_ = std::move(alias); }
  // The session's reference, for the server to retire off the engine thread when it closes.
  std::shared_ptr<ArenaAlias> TakeAlias_st() { return std::move(alias_); }

  // What the control and data paths change: engine thread.
  const JobInfo* job_st() const { return job_ ? job_.get() : nullptr; }
  const std::vector<TensorInfo>& tensors_st() const { return tensors_; }
  const std::vector<DeviceAttachment>& device_attachments_st() const { return attachments_; }
  // The job's first post activated it: its regions are fixed, a later attach is refused.
  void MarkJobStarted_st() { job_started_ = true; }
  const SessionCounters& counters_st() const { return counters_; }
  uint64_t tensor_bytes_in_use_st() const { return allocator_.bytes_in_use(); }
  uint32_t reserved_completions_st() const { return reserved_; }
  // True when the last poll stopped because the client left no completion slot free. The
  // client has no doorbell towards the daemon for that, so the server re-polls it on a timer.
  bool completion_stalled_st() const { return cq_stalled_; }

  // Checks one descriptor copy; on success fills `*post` and advances the tensor's iteration.
  gl_status Validate_st(const gl_sqe& e, PostDescriptor* post);

 private:
  Session(uint64_t id, shm::UniqueFd socket, shm::PeerCredentials peer, shm::Arena arena,
          uint32_t ring_slots, const Layout& layout, shm::UniqueFd sq_efd, shm::UniqueFd cq_efd);

  absl::Status Reply_st(uint32_t type, uint64_t request_id, gl_status status,
                        const std::string& msg, uint64_t v0 = 0, uint64_t v1 = 0, uint64_t v2 = 0);
  absl::Status HandleRegisterJob_st(const void* message, size_t length, uint64_t request_id);
  absl::Status HandleRegisterTensor_st(const void* message, size_t length, uint64_t request_id);
  absl::Status HandleAttachDevice_st(const void* message, size_t length, uint64_t request_id,
                                     std::span<shm::UniqueFd> fds, bool device_memory);
  bool RingHeadersIntact_st() const;

  const uint64_t id_;
  shm::UniqueFd socket_;
  const shm::PeerCredentials peer_;
  shm::Arena arena_;
  std::shared_ptr<ArenaAlias> alias_;
  const uint32_t ring_slots_;
  uint32_t abi_version_ = GL_ABI_VERSION;
  shm::UniqueFd sq_efd_;  // client writes, daemon sleeps on it
  shm::UniqueFd cq_efd_;  // daemon writes, client sleeps on it
  gl_ring_header* sq_header_;
  gl_ring_header* cq_header_;
  shm::RingConsumer<gl_sqe> sq_;
  shm::RingProducer<gl_cqe> cq_;
  shm::Doorbell sq_bell_;
  shm::Doorbell cq_bell_;
  uint32_t reserved_ = 0;  // submissions taken whose completion is not posted yet
  bool cq_dirty_ = false;
  bool cq_stalled_ = false;
  shm::ArenaAllocator allocator_;
  std::unique_ptr<JobInfo> job_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, uint32_t> tensor_by_name_;
  std::vector<DeviceAttachment> attachments_;
  bool job_started_ = false;
  SessionCounters counters_;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_SESSION_H_
