#include "daemon/session.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradlane::daemon {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t align) { return (v + align - 1) & ~(align - 1); }

// A fixed char array from the client holds a string only if it is NUL-terminated inside it.
bool FixedString(const char* field, size_t cap, std::string* out) {
  const void* nul = std::memchr(field, '\0', cap);
  if (nul == nullptr) return false;
  out->assign(field, static_cast<const char*>(nul) - field);
  return true;
}

void CopyMessage(char (&dst)[GL_MESSAGE_TEXT], const std::string& msg) {
  const size_t n = msg.size() < GL_MESSAGE_TEXT - 1 ? msg.size() : GL_MESSAGE_TEXT - 1;
  std::memcpy(dst, msg.data(), n);
  dst[n] = '\0';
}

}  // namespace

Session::Layout Session::ComputeLayout(uint32_t ring_slots, uint64_t arena_bytes) {
  Layout l;
  l.sq_offset = shm::kPageSize;
  l.cq_offset = RoundUp(l.sq_offset + shm::RingBytes<gl_sqe>(ring_slots), shm::kPageSize);
  l.data_offset = RoundUp(l.cq_offset + shm::RingBytes<gl_cqe>(ring_slots), shm::kPageSize);
  l.arena_bytes = RoundUp(arena_bytes, shm::kPageSize);
  if (l.arena_bytes < l.data_offset + shm::kPageSize)
    l.arena_bytes = l.data_offset + shm::kPageSize;
  return l;
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(uint64_t id, shm::UniqueFd&& socket,
                                                         shm::PeerCredentials peer,
                                                         uint32_t ring_slots,
                                                         uint64_t arena_bytes) {
  if (!shm::IsPowerOfTwo(ring_slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring slots ", ring_slots, " not a power of two"));
  }
  const Layout layout = ComputeLayout(ring_slots, arena_bytes);
  auto arena = shm::Arena::Create(absl::StrCat("gradlane-session-", id), layout.arena_bytes);
  if (!arena.ok()) return arena.status();
  auto sq_efd = shm::CreateEventFd();
  if (!sq_efd.ok()) return sq_efd.status();
  auto cq_efd = shm::CreateEventFd();
  if (!cq_efd.ok()) return cq_efd.status();

  auto* hdr = static_cast<gl_arena_header*>(arena->At(0, sizeof(gl_arena_header)));
  hdr->magic = GL_ARENA_MAGIC;
  hdr->abi_version = GL_ABI_VERSION;
  hdr->ring_slots = ring_slots;
  hdr->arena_bytes = layout.arena_bytes;
  hdr->sq_offset = layout.sq_offset;
  hdr->cq_offset = layout.cq_offset;
  hdr->data_offset = layout.data_offset;
  hdr->data_bytes = layout.arena_bytes - layout.data_offset;
  return std::unique_ptr<Session>(new Session(id, std::move(socket), peer, std::move(*arena),
                                              ring_slots, layout, std::move(*sq_efd),
                                              std::move(*cq_efd)));
}

Session::Session(uint64_t id, shm::UniqueFd socket, shm::PeerCredentials peer, shm::Arena arena,
                 uint32_t ring_slots, const Layout& layout, shm::UniqueFd sq_efd,
                 shm::UniqueFd cq_efd)
    : id_(id),
      socket_(std::move(socket)),
      peer_(peer),
      arena_(std::move(arena)),
      ring_slots_(ring_slots),
      sq_efd_(std::move(sq_efd)),
      cq_efd_(std::move(cq_efd)),
      sq_header_(static_cast<gl_ring_header*>(arena_.At(layout.sq_offset, sizeof(gl_ring_header)))),
      cq_header_(static_cast<gl_ring_header*>(arena_.At(layout.cq_offset, sizeof(gl_ring_header)))),
      allocator_(layout.data_offset, layout.arena_bytes) {
  auto* sq_slots = reinterpret_cast<gl_sqe*>(sq_header_ + 1);
  auto* cq_slots = reinterpret_cast<gl_cqe*>(cq_header_ + 1);
  shm::InitRing(sq_header_, sq_slots, ring_slots);
  shm::InitRing(cq_header_, cq_slots, ring_slots);
  sq_ = shm::RingConsumer<gl_sqe>(sq_header_, sq_slots, ring_slots);
  cq_ = shm::RingProducer<gl_cqe>(cq_header_, cq_slots, ring_slots);
  sq_bell_ = shm::Doorbell(sq_header_, sq_efd_.get());
  cq_bell_ = shm::Doorbell(cq_header_, cq_efd_.get());
}

void Session::SetAbiVersion(uint32_t version) {
  abi_version_ = version;
  static_cast<gl_arena_header*>(arena_.At(0, sizeof(gl_arena_header)))->abi_version = version;
}

absl::Status Session::SendHelloReply(uint64_t request_id) {
  gl_hello_reply r{};
  r.header.type = GL_MSG_HELLO_REPLY;
  r.header.length = sizeof(r);
  r.header.request_id = request_id;
  r.status = GL_OK;
  r.abi_version = abi_version_;
  r.session_id = id_;
  r.arena_bytes = arena_.size();
  CopyMessage(r.message, "welcome");
  const int fds[3] = {arena_.fd(), sq_efd_.get(), cq_efd_.get()};
  absl::Status s = shm::SendMessage(socket_.get(), &r, sizeof(r), fds);
  // The client has its own reference now (or the session is about to be closed).
  arena_.CloseFd();
  return s;
}

absl::Status Session::Reply_st(uint32_t type, uint64_t request_id, gl_status status,
                               const std::string& msg, uint64_t v0, uint64_t v1, uint64_t v2) {
  gl_reply r{};
  r.header.type = type;
  r.header.length = sizeof(r);
  r.header.request_id = request_id;
  r.status = status;
  r.value0 = v0;
  r.value1 = v1;
  r.value2 = v2;
  CopyMessage(r.message, msg);
  return shm::SendMessage(socket_.get(), &r, sizeof(r));
}

void Session::SendGoodbye_st(gl_status status, const std::string& why) {
  (void)Reply_st(GL_MSG_GOODBYE, 0, status, why);
}

absl::Status Session::RefuseControl_st(uint64_t request_id, gl_status status,
                                       const std::string& why) {
  return Reply_st(GL_MSG_REPLY, request_id, status, why);
}

uint32_t StageMapBits(uint64_t bytes, sched::DType dtype) {
  const uint64_t elements = bytes / sched::DTypeBytes(dtype);
  return static_cast<uint32_t>(std::min<uint64_t>(elements, sched::kMaxPartitions));
}

absl::Status Session::HandleControl_st(const void* message, size_t length,
                                       std::span<shm::UniqueFd> fds, bool device_memory) {
  gl_msg_header h;
  if (length < sizeof(h)) {
    return Reply_st(GL_MSG_REPLY, 0, GL_E_PROTOCOL,
                    absl::StrCat("control message of ", length,
                                 " bytes is shorter than its header"));
  }
  std::memcpy(&h, message, sizeof(h));
  if (h.length != length) {
    return Reply_st(GL_MSG_REPLY, h.request_id, GL_E_PROTOCOL,
                    absl::StrCat("header says ", h.length, " bytes, message has ", length));
  }
  switch (h.type) {
    case GL_MSG_REGISTER_JOB:
      return HandleRegisterJob_st(message, length, h.request_id);
    case GL_MSG_REGISTER_TENSOR:
      return HandleRegisterTensor_st(message, length, h.request_id);
    case GL_MSG_ATTACH_DEVICE:
      return HandleAttachDevice_st(message, length, h.request_id, fds, device_memory);
    case GL_MSG_HELLO:
      return Reply_st(GL_MSG_REPLY, h.request_id, GL_E_PROTOCOL, "session already established");
    default:
      return Reply_st(GL_MSG_REPLY, h.request_id, GL_E_PROTOCOL,
                      absl::StrCat("unknown control message type ", h.type));
  }
}

absl::Status Session::HandleRegisterJob_st(const void* message, size_t length,
                                           uint64_t request_id) {
  auto fail = [&](gl_status s, const std::string& why) {
    return Reply_st(GL_MSG_REPLY, request_id, s, why);
  };
  gl_msg_register_job m{};
  // A version-1 client's message ends before `mode`: its job is a parameter-server job.
  const size_t fixed = abi_version_ >= 2 ? sizeof(m) : GL_REGISTER_JOB_V1_BYTES;
  if (length < fixed) return fail(GL_E_PROTOCOL, "register_job message too short");
  std::memcpy(&m, message, fixed);
  if (uint64_t{m.peers_bytes} != length - fixed) {
    return fail(GL_E_PROTOCOL, absl::StrCat("peers_bytes ", m.peers_bytes, " but ", length - fixed,
                                            " bytes follow"));
  }
  if (m.mode != GL_MODE_PS && m.mode != GL_MODE_ALLREDUCE) {
    return fail(GL_E_INVALID_ARGUMENT,
                absl::StrCat("unknown job mode ", m.mode, " (0 = ps, 1 = allreduce)"));
  }
  if (m.reserved != 0) return fail(GL_E_INVALID_ARGUMENT, "reserved field not zero");
  if (job_ != nullptr) return fail(GL_E_ALREADY_EXISTS, "job already registered in this session");
  auto job = std::make_unique<JobInfo>();
  if (!FixedString(m.job_id, sizeof(m.job_id), &job->job_id) || job->job_id.empty()) {
    return fail(GL_E_INVALID_ARGUMENT, "job id empty or not NUL-terminated");
  }
  if (!FixedString(m.policy, sizeof(m.policy), &job->policy)) {
    return fail(GL_E_INVALID_ARGUMENT, "policy not NUL-terminated");
  }
  if (!FixedString(m.auth_token, sizeof(m.auth_token), &job->auth_token)) {
    return fail(GL_E_INVALID_ARGUMENT, "auth token not NUL-terminated");
  }
  if (m.world_size == 0 || m.rank >= m.world_size) {
    return fail(GL_E_INVALID_ARGUMENT,
                absl::StrCat("rank ", m.rank, " not in a world of ", m.world_size));
  }
  if (m.num_peers != 0 && m.num_peers != m.world_size) {
    return fail(GL_E_INVALID_ARGUMENT,
                absl::StrCat(m.num_peers, " peer addresses for ", m.world_size, " ranks"));
  }
  if (m.num_peers > GL_MAX_PEERS) return fail(GL_E_INVALID_ARGUMENT, "too many peers");
  const char* p = static_cast<const char*>(message) + fixed;
  size_t left = m.peers_bytes;
  for (uint32_t i = 0; i < m.num_peers; ++i) {
    const void* nul = std::memchr(p, '\0', left);
    if (nul == nullptr) return fail(GL_E_INVALID_ARGUMENT, "peer address not NUL-terminated");
    const size_t n = static_cast<const char*>(nul) - p;
    if (n == 0) return fail(GL_E_INVALID_ARGUMENT, absl::StrCat("peer ", i, " address empty"));
    job->peers.emplace_back(p, n);
    p += n + 1;
    left -= n + 1;
  }
  if (left != 0) return fail(GL_E_PROTOCOL, "bytes left over after the peer addresses");
  job->rank = m.rank;
  job->world_size = m.world_size;
  job->mode = static_cast<gl_job_mode>(m.mode);
  job_ = std::move(job);
  return Reply_st(GL_MSG_REPLY, request_id, GL_OK, "job registered");
}

absl::Status Session::HandleRegisterTensor_st(const void* message, size_t length,
                                              uint64_t request_id) {
  auto fail = [&](gl_status s, const std::string& why) {
    return Reply_st(GL_MSG_REPLY, request_id, s, why);
  };
  gl_msg_register_tensor m;
  if (length != sizeof(m)) return fail(GL_E_PROTOCOL, "register_tensor message has the wrong size");
  std::memcpy(&m, message, sizeof(m));
  TensorInfo t;
  if (!FixedString(m.name, sizeof(m.name), &t.name) || t.name.empty()) {
    return fail(GL_E_INVALID_ARGUMENT, "tensor name empty or not NUL-terminated");
  }
  if (m.dtype > GL_DTYPE_BF16) {
    return fail(GL_E_INVALID_ARGUMENT, absl::StrCat("unknown dtype ", m.dtype));
  }
  t.dtype = static_cast<sched::DType>(m.dtype);
  if (m.bytes == 0 || m.bytes % sched::DTypeBytes(t.dtype) != 0) {
    return fail(GL_E_INVALID_ARGUMENT,
                absl::StrCat("tensor '", t.name, "': ", m.bytes, " bytes is not a positive ",
                             "number of ", std::string(sched::DTypeName(t.dtype)), " elements"));
  }
  if (m.priority < GL_PRIORITY_AUTO) {
    return fail(GL_E_INVALID_ARGUMENT, absl::StrCat("priority ", m.priority, " (want >= 0 or -1)"));
  }
  if (m.reserved[0] != 0 || m.reserved[1] != 0 || m.reserved[2] != 0) {
    return fail(GL_E_INVALID_ARGUMENT, "reserved bytes not zero");
  }
  if (tensor_by_name_.contains(t.name)) {
    return fail(GL_E_ALREADY_EXISTS, absl::StrCat("tensor '", t.name, "' already registered"));
  }
  auto off = allocator_.Allocate(m.bytes);
  if (!off.ok()) return fail(GL_E_NO_MEMORY, std::string(off.status().message()));
  t.id = static_cast<uint32_t>(tensors_.size());
  t.bytes = m.bytes;
  t.priority = m.priority;
  t.offset = *off;
  tensor_by_name_.emplace(t.name, t.id);
  tensors_.push_back(std::move(t));
  const TensorInfo& r = tensors_.back();
  return Reply_st(GL_MSG_REPLY, request_id, GL_OK, "tensor registered", r.id, r.offset, r.bytes);
}

absl::Status Session::HandleAttachDevice_st(const void* message, size_t length, uint64_t request_id,
                                            std::span<shm::UniqueFd> fds, bool device_memory) {
  auto fail = [&](gl_status s, const std::string& why) {
    return Reply_st(GL_MSG_REPLY, request_id, s, why);
  };
  gl_msg_attach_device m;
  if (length != sizeof(m)) return fail(GL_E_PROTOCOL, "attach_device message has the wrong size");
  std::memcpy(&m, message, sizeof(m));
  size_t passed = 0;
  for (const shm::UniqueFd& fd : fds) passed += fd.valid() ? 1 : 0;
  if (passed != 1 || !fds[0].valid()) {
    return fail(GL_E_PROTOCOL, absl::StrCat("attach_device carries ", passed,
                                            " file descriptors (want the dma-buf's)"));
  }
  if (m.reserved != 0) return fail(GL_E_INVALID_ARGUMENT, "reserved field not zero");
  if (m.tensor_id >= tensors_.size()) {
    return fail(GL_E_BAD_TENSOR, absl::StrCat("attach_device: no tensor ", m.tensor_id));
  }
  const TensorInfo& t = tensors_[m.tensor_id];
  for (const DeviceAttachment& a : attachments_) {
    if (a.tensor_id == m.tensor_id) {
      return fail(GL_E_ALREADY_EXISTS, absl::StrCat("tensor '", t.name, "' already attached"));
    }
  }
  if (job_started_) {
    return fail(GL_E_PROTOCOL, absl::StrCat("tensor '", t.name,
                                            "': attach before the job's first post (its "
                                            "regions are fixed then)"));
  }
  if (m.dmabuf_bytes == 0 || m.device_address == 0 || m.dmabuf_offset > m.dmabuf_bytes ||
      t.bytes > m.dmabuf_bytes - m.dmabuf_offset) {
    return fail(GL_E_INVALID_ARGUMENT,
                absl::StrCat("tensor '", t.name, "' (", t.bytes, " bytes at ", m.dmabuf_offset,
                             ") does not lie in its dma-buf of ", m.dmabuf_bytes, " bytes"));
  }
  if (!device_memory) {
    // Not an error of the client's: it stages the tensor through the arena, as without GPUDirect.
    return fail(GL_E_DEVICE,
                "this daemon's backend cannot send from GPU memory (verbs can): "
                "the tensor is staged through shared memory");
  }
  DeviceAttachment a;
  a.tensor_id = m.tensor_id;
  a.map_bits = StageMapBits(t.bytes, t.dtype);
  auto off = allocator_.Allocate(StageMapBytes(a.map_bits));
  if (!off.ok()) return fail(GL_E_NO_MEMORY, std::string(off.status().message()));
  // Not ready: the client stages every byte until the job publishes the map.
  std::memset(arena_.base() + *off, 0, StageMapBytes(a.map_bits));
  auto* map = reinterpret_cast<gl_stage_map*>(arena_.base() + *off);
  map->map_bits = a.map_bits;
  a.stage_map_offset = *off;
  a.dmabuf = std::move(fds[0]);
  a.dmabuf_offset = m.dmabuf_offset;
  a.dmabuf_bytes = m.dmabuf_bytes;
  a.device_address = m.device_address;
  attachments_.push_back(std::move(a));
  return Reply_st(GL_MSG_REPLY, request_id, GL_OK,
                  "GPU memory attached: sent from there once the job starts",
                  attachments_.back().stage_map_offset);
}

bool Session::RingHeadersIntact_st() const {
  // The constants are re-read each poll: a client that scribbles on them is broken, even if
  // the daemon itself only uses its private copies.
  const gl_ring_header* rings[2] = {sq_header_, cq_header_};
  for (const gl_ring_header* h : rings) {
    if (shm::Shared(const_cast<uint32_t&>(h->magic)).load(std::memory_order_relaxed) !=
            GL_RING_MAGIC ||
        shm::Shared(const_cast<uint32_t&>(h->slots)).load(std::memory_order_relaxed) !=
            ring_slots_ ||
        shm::Shared(const_cast<uint32_t&>(h->slot_size)).load(std::memory_order_relaxed) != 64) {
      return false;
    }
  }
  return true;
}

gl_status Session::Validate_st(const gl_sqe& e, PostDescriptor* post) {
  post->session_id = id_;
  post->tensor_id = e.tensor_id;
  post->iteration = e.iteration;
  post->offset = e.offset;
  post->length = e.length;
  post->user_data = e.user_data;
  if (e.opcode != GL_OP_POST) return GL_E_BAD_OPCODE;
  if (e.flags != 0 || e.reserved[0] != 0 || e.reserved[1] != 0) return GL_E_BAD_DESCRIPTOR;
  if (job_ == nullptr) return GL_E_NO_JOB;
  if (e.tensor_id >= tensors_.size()) return GL_E_BAD_TENSOR;
  TensorInfo& t = tensors_[e.tensor_id];
  if (e.length == 0 || e.offset > t.bytes || e.length > t.bytes - e.offset) return GL_E_BAD_RANGE;
  const uint32_t elem = sched::DTypeBytes(t.dtype);
  if (e.offset % elem != 0 || e.length % elem != 0) return GL_E_BAD_RANGE;
  // Iterations of one tensor advance by one: a rank never goes back, and skipping one would
  // leave the peers waiting for a contribution that never comes.
  if (e.iteration < 0) return GL_E_BAD_ITERATION;
  if (t.last_iteration >= 0 && (e.iteration < t.last_iteration ||
                                e.iteration - t.last_iteration > 1)) {  // no overflow at INT64_MAX
    return GL_E_BAD_ITERATION;
  }
  if (e.iteration != t.last_iteration) t.posted_count = 0;  // a new iteration starts empty
  if (!t.RecordPosted(e.offset, e.offset + e.length)) return GL_E_BAD_RANGE;
  t.last_iteration = e.iteration;
  return GL_OK;
}

bool TensorInfo::RecordPosted(uint64_t begin, uint64_t end) {
  // `posted` is sorted by begin; find the first range that ends at or after `begin`.
  int i = 0;
  while (i < posted_count && posted[i].second < begin) ++i;
  if (i < posted_count && posted[i].first < end && begin < posted[i].second) return false;
  if (i + 1 < posted_count && posted[i + 1].first < end) return false;
  const bool joins_left = i < posted_count && posted[i].second == begin;
  const int right = joins_left ? i + 1 : i;
  const bool joins_right = right < posted_count && posted[right].first == end;
  if (joins_left && joins_right) {  // fills the gap between two ranges: they become one
    posted[i].second = posted[right].second;
    for (int k = right; k + 1 < posted_count; ++k) posted[k] = posted[k + 1];
    --posted_count;
  } else if (joins_left) {
    posted[i].second = end;
  } else if (joins_right) {
    posted[right].first = begin;
  } else {
    if (posted_count == kMaxPostedRanges) return false;
    for (int k = posted_count; k > i; --k) posted[k] = posted[k - 1];
    posted[i] = {begin, end};
    ++posted_count;
  }
  return true;
}

uint32_t Session::PollSubmissions_st(PostSink* sink, uint32_t budget, bool* corrupt) {
  *corrupt = false;
  if (!RingHeadersIntact_st()) {
    *corrupt = true;
    return 0;
  }
  uint32_t taken = 0;
  cq_stalled_ = false;
  while (taken < budget) {
    if (cq_.CachedFreeSlots() <= reserved_) {
      uint32_t free = 0;
      if (cq_.FreeSlots(&free) != shm::RingResult::kOk) {
        *corrupt = true;
        break;
      }
      if (free <= reserved_) {
        ++counters_.cq_stalls;
        cq_stalled_ = true;
        break;
      }
    }
    gl_sqe e;
    const shm::RingResult r = sq_.TryPop(&e);
    if (r == shm::RingResult::kEmpty) break;
    if (r != shm::RingResult::kOk) {
      *corrupt = true;
      break;
    }
    ++taken;
    ++reserved_;
    PostDescriptor post;
    const gl_status s = Validate_st(e, &post);
    if (s != GL_OK) {
      ++counters_.bad_descriptors[s];
      if (!Complete_st(post, s).ok()) {
        *corrupt = true;
        break;
      }
      continue;
    }
    ++counters_.posts_ok;
    sink->OnPost_st(*this, post);
  }
  return taken;
}

absl::Status Session::Complete_st(const PostDescriptor& post, gl_status status) {
  if (reserved_ == 0) return absl::FailedPreconditionError("no completion slot reserved");
  gl_cqe c{};
  c.user_data = post.user_data;
  c.iteration = post.iteration;
  c.offset = post.offset;
  c.length = post.length;
  c.tensor_id = post.tensor_id;
  c.status = status;
  const shm::RingResult r = cq_.TryPush(c);
  if (r != shm::RingResult::kOk) {
    // kFull cannot happen with the reservation unless the client moved its index backwards
    // within the checks' tolerance; either way the ring is not trustworthy any more.
    return absl::DataLossError("completion ring corrupt");
  }
  --reserved_;
  ++counters_.completions;
  cq_dirty_ = true;
  return absl::OkStatus();
}

void Session::FlushCompletions_st() {
  if (!cq_dirty_) return;
  cq_dirty_ = false;
  cq_bell_.NotifyIfArmed();
}

bool Session::ArmSubmissionDoorbell_st() {
  sq_bell_.Arm();
  if (sq_.HasEntry()) {
    sq_bell_.Disarm();
    return false;
  }
  return true;
}

}  // namespace gradlane::daemon
