// libgradlane: the C ABI of libclient/gradlane.h over shm/ (rings, doorbells, arena, socket).
#include "libclient/gradlane.h"

#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libclient/cuda_driver.h"
#include "libclient/device_staging.h"
#include "libclient/gradlane_testing.h"
#include "shm/arena.h"
#include "shm/doorbell.h"
#include "shm/ring.h"
#include "shm/uds.h"

using gradlane::client::DeviceStaging;
using gradlane::shm::Arena;
using gradlane::shm::Doorbell;
using gradlane::shm::RingConsumer;
using gradlane::shm::RingProducer;
using gradlane::shm::RingResult;
using gradlane::shm::UniqueFd;

// Who touches what (gradlane.h, "Threads": calls on one client are not concurrent, except that
// one thread may post while another polls or waits). No lock: the poster owns `sq` and
// `sq_bell`, the poller/waiter `cq` and `cq_bell`; everything else is written by control calls
// (connect, register), which the caller never runs next to a post or a wait — except the end of
// the session, which a control call or the waiter records: `disconnected` (an atomic, set once)
// publishes `disconnect_status` and `disconnect_reason` to the other thread (below).
struct gl_client {
  UniqueFd socket;
  Arena arena;
  UniqueFd sq_efd;
  UniqueFd cq_efd;
  RingProducer<gl_sqe> sq;
  RingConsumer<gl_cqe> cq;
  Doorbell sq_bell;  // we produce: ring it if the daemon sleeps
  Doorbell cq_bell;  // we consume: arm it before sleeping
  uint64_t session_id = 0;
  int timeout_ms = 10000;
  uint64_t next_request = 1;
  // Set once, by the thread that sees the session end (a control call, or gl_wait), after
  // disconnect_reason is written; any thread may read the reason once it has seen the flag
  // (acquire), since nothing writes it again.
  std::atomic<bool> disconnected{false};
  int disconnect_status = GL_E_DISCONNECTED;
  std::string disconnect_reason;
  std::vector<uint64_t> tensor_bytes;  // by tensor id, for GL_WHOLE_TENSOR
  uint32_t completion_slots = 0;
  // The CUDA driver once gl_post_after has waited on an event for a host tensor (loaded then,
  // so a later call allocates nothing); null before.
  const gradlane::client::CudaDriver* event_driver = nullptr;
  // Made by the first gl_register_device_tensor; null while the client has only host tensors.
  // Declared after `arena`, so it is destroyed first: it unpins the arena and waits for its
  // copies before the mapping goes.
  std::unique_ptr<DeviceStaging> staging;
  // GPUDirect: why the last device tensor is staged whole ("" if it was attached).
  std::string gpudirect_note;
  // What the GPU allows (dma-buf export; a NIC's writes ordered or flushable), probed at the
  // first device tensor.
  enum class GpuDirectProbe { kNotYet, kUsable, kNoDmabuf, kNicWritesInvisible };
  GpuDirectProbe gpudirect_probe = GpuDirectProbe::kNotYet;
  bool flush_nic_writes = false;
  std::string daemon_refused_gpudirect;  // non-empty: the daemon cannot take GPU memory (why)
  // One dma-buf per allocation, by its page-aligned [start, end): the tensors in it share the
  // export (and the daemon registers that range once). Closed with the client.
  std::map<std::pair<uint64_t, uint64_t>, UniqueFd> dmabuf_exports;  // [start, end) -> fd
};

namespace {

// The detail of the last failure, per thread (the errno model): one thread may post while
// another waits on the same client, and each then reads its own failure's text, never a string
// the other thread is writing. `t_error_client` says which client it was about (nullptr:
// gl_connect).
thread_local std::string t_error;
thread_local const gl_client* t_error_client = nullptr;
thread_local bool t_error_is_disconnect = false;  // then the text is the client's reason

// How long gl_wait spins before it sleeps: long enough to catch a completion that is a few
// microseconds away without a system call, short enough not to burn a core.
constexpr int64_t kSpinNs = 20'000;

int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int Fail(gl_client* c, int status, const std::string& why) {
  t_error = why;
  t_error_client = c;
  t_error_is_disconnect = false;
  return status;
}

// A call on a client whose session has ended: its text is the session's reason, referred to,
// not copied (gl_post takes this path: the data path allocates nothing).
int FailDisconnected(gl_client* c) {
  t_error_client = c;
  t_error_is_disconnect = true;
  return GL_E_DISCONNECTED;
}

// The session has ended: records why (the first time only) for every thread, then fails the
// calling thread's call with it.
int Disconnect(gl_client* c, int daemon_status, const std::string& why) {
  if (!c->disconnected.load(std::memory_order_acquire)) {
    c->disconnect_reason = why;
    c->disconnect_status = daemon_status;
    c->disconnected.store(true, std::memory_order_release);
  }
  return FailDisconnected(c);
}

int FromStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return GL_OK;
    case absl::StatusCode::kDeadlineExceeded:
      return GL_E_TIMEOUT;
    case absl::StatusCode::kPermissionDenied:
      return GL_E_PERMISSION;
    case absl::StatusCode::kNotFound:
      return GL_E_DISCONNECTED;
    case absl::StatusCode::kInvalidArgument:
      return GL_E_INVALID_ARGUMENT;
    case absl::StatusCode::kOutOfRange:
      return GL_E_PROTOCOL;
    default:
      return GL_E_IO;
  }
}

bool CopyString(char* dst, size_t cap, const char* src) {
  if (src == nullptr) {
    dst[0] = '\0';
    return true;
  }
  const size_t n = std::strlen(src);
  if (n >= cap) return false;
  std::memcpy(dst, src, n + 1);
  return true;
}

// Handles an unsolicited message (GL_MSG_GOODBYE) or EOF on the socket. Returns GL_OK if the
// session is still up.
int ReadSocketEvent(gl_client* c) {
  std::array<UniqueFd, gradlane::shm::kMaxPassedFds> stray;
  gl_reply r{};
  for (;;) {
    auto rx = gradlane::shm::ReceiveMessage(c->socket.get(), &r, sizeof(r), stray);
    if (!rx.ok()) {
      if (absl::IsUnavailable(rx.status())) return GL_OK;
      return Disconnect(c, GL_E_DISCONNECTED, std::string(rx.status().message()));
    }
    if (rx->eof) return Disconnect(c, GL_E_DISCONNECTED, "the daemon closed the session");
    if (rx->bytes == sizeof(r) && r.header.type == GL_MSG_GOODBYE) {
      r.message[GL_MESSAGE_TEXT - 1] = '\0';
      return Disconnect(c, r.status,
                        absl::StrCat("daemon closed the session (", gl_strerror(r.status),
                                     "): ", r.message));
    }
    // A late reply to a request that timed out: drop it and look again.
  }
}

int Request(gl_client* c, const void* msg, uint32_t len, uint64_t request_id, gl_reply* reply,
            std::span<const int> fds = {}) {
  if (c->disconnected.load(std::memory_order_acquire)) return FailDisconnected(c);
  if (absl::Status s = gradlane::shm::SendMessage(c->socket.get(), msg, len, fds); !s.ok()) {
    return Disconnect(c, GL_E_DISCONNECTED, std::string(s.message()));
  }
  const int64_t deadline = NowNs() + int64_t{c->timeout_ms} * 1'000'000;
  std::array<UniqueFd, gradlane::shm::kMaxPassedFds> stray;
  for (;;) {
    const int64_t left_ms = (deadline - NowNs()) / 1'000'000;
    if (left_ms <= 0) return Fail(c, GL_E_TIMEOUT, "no reply from the daemon in time");
    if (absl::Status s = gradlane::shm::WaitReadable(c->socket.get(), static_cast<int>(left_ms));
        !s.ok()) {
      return Fail(c, FromStatus(s), std::string(s.message()));
    }
    auto rx = gradlane::shm::ReceiveMessage(c->socket.get(), reply, sizeof(*reply), stray);
    if (!rx.ok()) return Disconnect(c, GL_E_DISCONNECTED, std::string(rx.status().message()));
    if (rx->eof) return Disconnect(c, GL_E_DISCONNECTED, "the daemon closed the session");
    if (rx->bytes != sizeof(*reply)) continue;
    reply->message[GL_MESSAGE_TEXT - 1] = '\0';
    if (reply->header.type == GL_MSG_GOODBYE) {
      return Disconnect(c, reply->status,
                        absl::StrCat("daemon closed the session (", gl_strerror(reply->status),
                                     "): ", reply->message));
    }
    if (reply->header.type != GL_MSG_REPLY || reply->header.request_id != request_id) continue;
    if (reply->status != GL_OK) return Fail(c, reply->status, reply->message);
    if (t_error_client == c) t_error.clear();
    return GL_OK;
  }
}

}  // namespace

extern "C" {

const char* gl_strerror(int status) {
  switch (status) {
    case GL_OK:
      return "ok";
    case GL_E_INVALID_ARGUMENT:
      return "invalid argument";
    case GL_E_BAD_MAGIC:
      return "bad magic: not a gradlane peer";
    case GL_E_BAD_VERSION:
      return "ABI version mismatch between client and daemon";
    case GL_E_PERMISSION:
      return "permission denied by the daemon's uid/gid policy";
    case GL_E_NO_MEMORY:
      return "out of arena memory or over a daemon limit";
    case GL_E_AGAIN:
      return "submission ring full: consume completions and retry";
    case GL_E_TIMEOUT:
      return "timed out";
    case GL_E_DISCONNECTED:
      return "disconnected from the daemon";
    case GL_E_PROTOCOL:
      return "protocol error in a control message";
    case GL_E_BAD_TENSOR:
      return "unknown tensor id";
    case GL_E_BAD_RANGE:
      return "byte range empty, outside the tensor or not whole elements";
    case GL_E_BAD_ITERATION:
      return "iteration negative, going backwards or skipping ahead";
    case GL_E_BAD_OPCODE:
      return "unknown descriptor opcode";
    case GL_E_BAD_DESCRIPTOR:
      return "descriptor flags or reserved fields not zero";
    case GL_E_NO_JOB:
      return "no job registered in this session";
    case GL_E_ALREADY_EXISTS:
      return "already registered";
    case GL_E_RING_CORRUPT:
      return "shared ring corrupted";
    case GL_E_IO:
      return "system call failed";
    case GL_E_INTERNAL:
      return "internal error";
    case GL_E_BUSY:
      return "the daemon is at a connection or session limit: retry later";
    default:
      return "unknown status";
  }
}

const char* gl_last_error(const gl_client* c) {
  if (t_error_client == c) {
    return t_error_is_disconnect && c != nullptr ? c->disconnect_reason.c_str() : t_error.c_str();
  }
  // Another thread saw the session end (say, the one in gl_wait): its reason is for everyone.
  if (c != nullptr && c->disconnected.load(std::memory_order_acquire)) {
    return c->disconnect_reason.c_str();
  }
  return "";
}

int gl_connect(const gl_connect_options* options, gl_client** out) {
  if (out == nullptr) return Fail(nullptr, GL_E_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  gl_connect_options o{};
  if (options != nullptr) o = *options;
  std::string path;
  if (o.socket_path != nullptr) {
    path = o.socket_path;
  } else if (const char* env = std::getenv("GRADLANE_SOCKET"); env != nullptr && *env != '\0') {
    path = env;
  } else {
    path = GL_DEFAULT_SOCKET_PATH;
  }
  auto c = std::unique_ptr<gl_client>(new (std::nothrow) gl_client());
  if (c == nullptr) return Fail(nullptr, GL_E_NO_MEMORY, "out of memory");
  c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 10000;

  auto sock = gradlane::shm::ConnectUnix(path);
  if (!sock.ok()) {
    return Fail(nullptr,
                absl::IsPermissionDenied(sock.status()) ? GL_E_PERMISSION : GL_E_DISCONNECTED,
                absl::StrCat("cannot reach the gradlane daemon: ", sock.status().message()));
  }
  c->socket = std::move(*sock);

  gl_hello h{};
  h.header.type = GL_MSG_HELLO;
  h.header.length = sizeof(h);
  h.header.request_id = c->next_request++;
  h.magic = GL_ABI_MAGIC;
  h.abi_version = GL_ABI_VERSION;
  h.pid = ::getpid();
  h.ring_slots = o.ring_slots;
  h.arena_bytes = o.arena_bytes;
  // The daemon decides admission when it accepts, before our hello: a refusal may already be
  // waiting and the socket closed, so a failed send still reads the reply that explains it.
  const absl::Status sent = gradlane::shm::SendMessage(c->socket.get(), &h, sizeof(h));
  if (!sent.ok() && !gradlane::shm::WaitReadable(c->socket.get(), 0).ok()) {
    return Fail(nullptr, GL_E_DISCONNECTED, std::string(sent.message()));
  }
  if (absl::Status s = gradlane::shm::WaitReadable(c->socket.get(), c->timeout_ms); !s.ok()) {
    return Fail(nullptr, FromStatus(s), absl::StrCat("hello: ", s.message()));
  }
  gl_hello_reply r{};
  std::array<UniqueFd, gradlane::shm::kMaxPassedFds> fds;
  auto rx = gradlane::shm::ReceiveMessage(c->socket.get(), &r, sizeof(r), fds);
  if (!rx.ok()) return Fail(nullptr, GL_E_PROTOCOL, std::string(rx.status().message()));
  if (rx->eof) return Fail(nullptr, GL_E_DISCONNECTED, "the daemon closed the connection");
  if (rx->bytes != sizeof(r) || r.header.type != GL_MSG_HELLO_REPLY) {
    return Fail(nullptr, GL_E_PROTOCOL, "unexpected reply to hello");
  }
  r.message[GL_MESSAGE_TEXT - 1] = '\0';
  if (r.status != GL_OK) return Fail(nullptr, r.status, r.message);
  if (r.abi_version != GL_ABI_VERSION) {
    return Fail(nullptr, GL_E_BAD_VERSION,
                absl::StrCat("daemon speaks ABI version ", r.abi_version, ", library ",
                             GL_ABI_VERSION));
  }
  if (rx->num_fds != 3) {
    return Fail(nullptr, GL_E_PROTOCOL,
                absl::StrCat("hello reply carried ", rx->num_fds, " fds, want 3"));
  }
  auto arena = Arena::Map(std::move(fds[0]), r.arena_bytes);
  if (!arena.ok()) return Fail(nullptr, GL_E_PROTOCOL, std::string(arena.status().message()));
  c->arena = std::move(*arena);
  c->sq_efd = std::move(fds[1]);
  c->cq_efd = std::move(fds[2]);
  c->session_id = r.session_id;

  const auto* ah = static_cast<const gl_arena_header*>(c->arena.At(0, sizeof(gl_arena_header)));
  const uint32_t slots = ah->ring_slots;
  if (ah->magic != GL_ARENA_MAGIC || !gradlane::shm::IsPowerOfTwo(slots) ||
      c->arena.At(ah->sq_offset, gradlane::shm::RingBytes<gl_sqe>(slots)) == nullptr ||
      c->arena.At(ah->cq_offset, gradlane::shm::RingBytes<gl_cqe>(slots)) == nullptr) {
    return Fail(nullptr, GL_E_PROTOCOL, "arena header inconsistent");
  }
  auto* sqh = static_cast<gl_ring_header*>(c->arena.At(ah->sq_offset, sizeof(gl_ring_header)));
  auto* cqh = static_cast<gl_ring_header*>(c->arena.At(ah->cq_offset, sizeof(gl_ring_header)));
  c->sq = RingProducer<gl_sqe>(sqh, reinterpret_cast<gl_sqe*>(sqh + 1), slots);
  c->cq = RingConsumer<gl_cqe>(cqh, reinterpret_cast<gl_cqe*>(cqh + 1), slots);
  c->completion_slots = slots;
  c->sq_bell = Doorbell(sqh, c->sq_efd.get());
  c->cq_bell = Doorbell(cqh, c->cq_efd.get());
  if (t_error_client == nullptr) t_error.clear();
  *out = c.release();
  return GL_OK;
}

int gl_register_job(gl_client* c, const gl_job_info* job) {
  return gl_register_job_mode(c, job, GL_MODE_PS);
}

int gl_register_job_mode(gl_client* c, const gl_job_info* job, int mode) {
  if (c == nullptr || job == nullptr) return Fail(c, GL_E_INVALID_ARGUMENT, "NULL argument");
  if (mode != GL_MODE_PS && mode != GL_MODE_ALLREDUCE) {
    return Fail(c, GL_E_INVALID_ARGUMENT,
                absl::StrCat("unknown job mode ", mode, " (GL_MODE_PS or GL_MODE_ALLREDUCE)"));
  }
  if (job->num_peers > GL_MAX_PEERS || (job->num_peers > 0 && job->peers == nullptr)) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "peers");
  }
  gl_msg_register_job m{};
  if (job->job_id == nullptr || !CopyString(m.job_id, sizeof(m.job_id), job->job_id)) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "job id missing or too long");
  }
  if (!CopyString(m.policy, sizeof(m.policy), job->policy)) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "policy name too long");
  }
  if (!CopyString(m.auth_token, sizeof(m.auth_token), job->auth_token)) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "auth token too long");
  }
  std::string peers;
  for (uint32_t i = 0; i < job->num_peers; ++i) {
    if (job->peers[i] == nullptr) return Fail(c, GL_E_INVALID_ARGUMENT, "NULL peer address");
    peers.append(job->peers[i]);
    peers.push_back('\0');
  }
  if (sizeof(m) + peers.size() > GL_MAX_CONTROL_MESSAGE) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "peer addresses too long for one message");
  }
  m.header.type = GL_MSG_REGISTER_JOB;
  m.header.length = static_cast<uint32_t>(sizeof(m) + peers.size());
  m.header.request_id = c->next_request++;
  m.rank = job->rank;
  m.world_size = job->world_size;
  m.num_peers = job->num_peers;
  m.peers_bytes = static_cast<uint32_t>(peers.size());
  m.mode = static_cast<uint32_t>(mode);
  std::string msg(reinterpret_cast<const char*>(&m), sizeof(m));
  msg += peers;
  gl_reply r{};
  return Request(c, msg.data(), static_cast<uint32_t>(msg.size()), m.header.request_id, &r);
}

int gl_register_tensor(gl_client* c, const char* name, uint64_t bytes, int dtype, int32_t priority,
                       uint32_t* tensor_id, void** buffer) {
  if (c == nullptr || name == nullptr || tensor_id == nullptr || buffer == nullptr) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "NULL argument");
  }
  gl_msg_register_tensor m{};
  if (!CopyString(m.name, sizeof(m.name), name)) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "tensor name too long");
  }
  if (dtype < 0 || dtype > 255) return Fail(c, GL_E_INVALID_ARGUMENT, "dtype");
  m.header.type = GL_MSG_REGISTER_TENSOR;
  m.header.length = sizeof(m);
  m.header.request_id = c->next_request++;
  m.bytes = bytes;
  m.priority = priority;
  m.dtype = static_cast<uint8_t>(dtype);
  gl_reply r{};
  const int s = Request(c, &m, sizeof(m), m.header.request_id, &r);
  if (s != GL_OK) return s;
  void* p = c->arena.At(r.value1, r.value2);
  if (p == nullptr || r.value2 != bytes) {
    return Fail(c, GL_E_PROTOCOL, "daemon placed the tensor outside the arena");
  }
  const uint32_t id = static_cast<uint32_t>(r.value0);
  if (c->tensor_bytes.size() <= id) c->tensor_bytes.resize(id + 1, 0);
  c->tensor_bytes[id] = bytes;
  *tensor_id = id;
  *buffer = p;
  return GL_OK;
}

namespace {

// GPUDirect: exports the GPU memory holding device tensor `id` as a dma-buf and offers it to
// the daemon, which then sends the tensor's pushes to other hosts straight from there. Anything
// that refuses (an old driver, a GPU without dma-buf, GRADLANE_GPUDIRECT=0, a daemon whose
// backend cannot, an older daemon) leaves the tensor staged as before; the reason is kept in
// gpudirect_note. Returns a status only when the session itself failed.
int OfferDeviceMemory(gl_client* c, const gradlane::client::CudaDriver& cuda, uint32_t id,
                      gradlane::client::cu::DevicePtr device,
                      const gradlane::client::DevicePointerInfo& where) {
  namespace cu = gradlane::client::cu;
  c->gpudirect_note.clear();
  if (const char* off = std::getenv("GRADLANE_GPUDIRECT");
      off != nullptr && std::strcmp(off, "0") == 0) {
    c->gpudirect_note = "GRADLANE_GPUDIRECT=0";
    return GL_OK;
  }
  if (cuda.MemGetHandleForAddressRange == nullptr) {
    c->gpudirect_note = "the CUDA driver cannot export dma-bufs (cuMemGetHandleForAddressRange)";
    return GL_OK;
  }
  if (!c->daemon_refused_gpudirect.empty()) {  // no export the daemon would refuse again
    c->gpudirect_note = c->daemon_refused_gpudirect;
    return GL_OK;
  }
  if (cuda.CtxPushCurrent(where.context) != cu::kSuccess) {
    c->gpudirect_note = "cannot make the tensor's CUDA context current";
    return GL_OK;
  }
  using Probe = gl_client::GpuDirectProbe;
  if (c->gpudirect_probe == Probe::kNotYet) {  // once per client, as NCCL does per process
    int ordinal = -1, supported = 0, ordering = 0, flush_options = 0;
    cu::Device dev{};
    const bool dmabuf =
        cuda.PointerGetAttribute(&ordinal, cu::kPointerDeviceOrdinal, device) == cu::kSuccess &&
        cuda.DeviceGet(&dev, ordinal) == cu::kSuccess &&
        cuda.DeviceGetAttribute(&supported, cu::kDeviceDmaBufSupported, dev) == cu::kSuccess &&
        supported == 1;
    // The results a NIC writes must be visible to the caller's next kernel: either the GPU
    // orders those writes itself, or it offers the flush (then done before each hand-out).
    // One that does neither keeps its tensors staged.
    if (cuda.DeviceGetAttribute(&ordering, cu::kDeviceRdmaWritesOrdering, dev) != cu::kSuccess) {
      ordering = 0;
    }
    if (cuda.DeviceGetAttribute(&flush_options, cu::kDeviceRdmaFlushOptions, dev) != cu::kSuccess) {
      flush_options = 0;
    }
    const bool ordered = ordering >= cu::kWritesOrderingOwner;
    c->flush_nic_writes = !ordered && (flush_options & cu::kFlushOptionHost) != 0 &&
                          cuda.FlushGPUDirectRDMAWrites != nullptr;
    c->gpudirect_probe = !dmabuf                            ? Probe::kNoDmabuf
                         : (ordered || c->flush_nic_writes) ? Probe::kUsable
                                                            : Probe::kNicWritesInvisible;
  }
  int fd = -1;
  uint64_t start = 0, end = 0;
  cu::Result r = cu::kSuccess;
  if (c->gpudirect_probe == Probe::kUsable) {
    // Page-aligned, as the driver requires: the allocation's pages, which hold the tensor.
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    start = where.range_start / page * page;
    end = (where.range_start + where.range_bytes + page - 1) / page * page;
    auto cached = c->dmabuf_exports.find({start, end});
    if (cached != c->dmabuf_exports.end()) {
      fd = cached->second.get();
    } else {
      r = cuda.MemGetHandleForAddressRange(&fd, static_cast<cu::DevicePtr>(start), end - start,
                                           cu::kRangeHandleDmaBufFd, 0);
      // Kept for the allocation's other tensors (registered tensors stay allocated until
      // gl_close, so the range keeps naming the same memory).
      if (r == cu::kSuccess && fd >= 0) c->dmabuf_exports[{start, end}] = UniqueFd(fd);
    }
  }
  cu::Context popped = nullptr;
  (void)cuda.CtxPopCurrent(&popped);
  if (c->gpudirect_probe == Probe::kNicWritesInvisible) {
    c->gpudirect_note =
        "the GPU neither orders a NIC's writes nor offers cuFlushGPUDirectRDMAWrites";
    return GL_OK;
  }
  if (c->gpudirect_probe != Probe::kUsable) {
    c->gpudirect_note = "the GPU does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)";
    return GL_OK;
  }
  if (r != cu::kSuccess || fd < 0) {
    c->gpudirect_note = "exporting the tensor's GPU memory as a dma-buf: " + cuda.Describe(r);
    return GL_OK;
  }
  gl_msg_attach_device m{};
  m.header.type = GL_MSG_ATTACH_DEVICE;
  m.header.length = sizeof(m);
  m.header.request_id = c->next_request++;
  m.tensor_id = id;
  m.dmabuf_offset = device - start;
  m.dmabuf_bytes = end - start;
  m.device_address = start;
  gl_reply reply{};
  const int one[1] = {fd};  // the daemon takes its own reference with the message
  const int s = Request(c, &m, sizeof(m), m.header.request_id, &reply, one);
  if (c->disconnected.load(std::memory_order_acquire)) return s;
  const bool answered =
      reply.header.type == GL_MSG_REPLY && reply.header.request_id == m.header.request_id;
  if (!answered) {
    // No answer (a timeout, a failed wait): the daemon may still accept it, and would then
    // write results into GPU memory that our copy back (of whole ranges, without its map)
    // would overwrite. The session must end.
    return Disconnect(c, s, "no answer to attaching a device tensor's GPU memory");
  }
  if (s != GL_OK) {
    // Refused (a backend without GPUDirect, or a daemon that predates it): staged, no error.
    c->gpudirect_note = t_error;
    if (t_error_client == c) t_error.clear();
    // The backend's refusal, or an older daemon's "unknown message", holds for every tensor of
    // this session: the next are not exported.
    if (s == GL_E_DEVICE ||
        (s == GL_E_PROTOCOL &&
         c->gpudirect_note.find("unknown control message") != std::string::npos)) {
      c->daemon_refused_gpudirect = c->gpudirect_note;
    }
    return GL_OK;
  }
  const auto* map =
      static_cast<const gl_stage_map*>(c->arena.At(reply.value0, sizeof(gl_stage_map)));
  const uint32_t bits = map != nullptr ? map->map_bits : 0;
  if (map == nullptr ||
      c->arena.At(reply.value0, sizeof(gl_stage_map) + (bits + 7) / 8) == nullptr) {
    // Attached there but unusable here: the same disagreement as above.
    return Disconnect(c, GL_E_PROTOCOL, "the daemon placed a stage map outside the arena");
  }
  c->staging->set_flush_nic_writes(c->flush_nic_writes);
  c->staging->SetStageMap(id, map, bits);
  return GL_OK;
}

}  // namespace

int gl_register_device_tensor(gl_client* c, const char* name, void* device_ptr, uint64_t bytes,
                              int dtype, int32_t priority, uint32_t* tensor_id) {
  if (c == nullptr || name == nullptr || device_ptr == nullptr || tensor_id == nullptr) {
    return Fail(c, GL_E_INVALID_ARGUMENT, "NULL argument");
  }
  auto cuda = gradlane::client::LoadCudaDriver();
  if (!cuda.ok()) return Fail(c, GL_E_DEVICE, std::string(cuda.status().message()));
  const auto device = reinterpret_cast<gradlane::client::cu::DevicePtr>(device_ptr);
  auto where = gradlane::client::InspectDevicePointer(**cuda, device, bytes);
  if (!where.ok()) return Fail(c, GL_E_INVALID_ARGUMENT, std::string(where.status().message()));
  if (c->staging != nullptr && c->staging->context() != where->context) {
    return Fail(c, GL_E_DEVICE,
                "device tensors of one client must share one CUDA context (one GPU per client)");
  }
  if (c->staging == nullptr) {
    auto staging = DeviceStaging::Create(**cuda, where->context, c->arena.base(), c->arena.size(),
                                         c->completion_slots);
    if (!staging.ok()) return Fail(c, GL_E_DEVICE, std::string(staging.status().message()));
    c->staging = std::move(*staging);
  }
  void* buffer = nullptr;
  const int s = gl_register_tensor(c, name, bytes, dtype, priority, tensor_id, &buffer);
  if (s != GL_OK) return s;
  c->staging->Add(*tensor_id, device, static_cast<std::byte*>(buffer), bytes);
  return OfferDeviceMemory(c, **cuda, *tensor_id, device, *where);
}

int gl_post(gl_client* c, uint32_t tensor_id, int64_t iteration, uint64_t offset, uint64_t length,
            uint64_t user_data) {
  return gl_post_after(c, tensor_id, iteration, offset, length, user_data, nullptr);
}

int gl_post_after(gl_client* c, uint32_t tensor_id, int64_t iteration, uint64_t offset,
                  uint64_t length, uint64_t user_data, void* cuda_event) {
  if (c == nullptr) return GL_E_INVALID_ARGUMENT;
  gl_sqe e{};
  e.user_data = user_data;
  e.iteration = iteration;
  e.offset = offset;
  if (length == GL_WHOLE_TENSOR) {
    // Unknown ids pass through with length 0: the daemon answers GL_E_BAD_TENSOR.
    const uint64_t total = tensor_id < c->tensor_bytes.size() ? c->tensor_bytes[tensor_id] : 0;
    length = total > offset ? total - offset : 0;
  }
  e.length = length;
  e.tensor_id = tensor_id;
  e.opcode = GL_OP_POST;
  const auto after = static_cast<gradlane::client::cu::Event>(cuda_event);
  if (c->staging != nullptr && c->staging->IsDevice(tensor_id)) {
    // Copy only what can be queued: a full ring would make the caller retry, and copy again.
    uint32_t free_slots = 0;
    if (c->sq.FreeSlots(&free_slots) == RingResult::kOk && free_slots == 0) return GL_E_AGAIN;
    if (absl::Status st = c->staging->StageIn(tensor_id, offset, length, after); !st.ok()) {
      return Fail(c, GL_E_DEVICE, std::string(st.message()));
    }
  } else if (after != nullptr) {
    // A host tensor filled by the GPU (a device-to-host copy the event follows).
    if (c->event_driver == nullptr) {
      auto cuda = gradlane::client::LoadCudaDriver();
      if (!cuda.ok()) return Fail(c, GL_E_DEVICE, std::string(cuda.status().message()));
      c->event_driver = *cuda;
    }
    if (const auto r = c->event_driver->EventSynchronize(after);
        r != gradlane::client::cu::kSuccess) {
      return Fail(c, GL_E_DEVICE, "waiting for the CUDA event: " + c->event_driver->Describe(r));
    }
  }
  return gl_testing_post_raw(c, &e);
}

int gl_testing_post_raw(gl_client* c, const gl_sqe* sqe) {
  if (c == nullptr || sqe == nullptr) return GL_E_INVALID_ARGUMENT;
  if (c->disconnected.load(std::memory_order_acquire)) return FailDisconnected(c);
  switch (c->sq.TryPush(*sqe)) {
    case RingResult::kOk:
      c->sq_bell.NotifyIfArmed();
      return GL_OK;
    case RingResult::kFull:
      return GL_E_AGAIN;
    default:
      return Fail(c, GL_E_RING_CORRUPT, "submission ring consumer index inconsistent");
  }
}

int gl_testing_control(gl_client* c, const void* msg, uint32_t len, uint64_t request_id,
                       gl_reply* reply) {
  if (c == nullptr || msg == nullptr || reply == nullptr) return GL_E_INVALID_ARGUMENT;
  return Request(c, msg, len, request_id, reply);
}

int gl_testing_socket_fd(gl_client* c) { return c == nullptr ? -1 : c->socket.get(); }

int gl_testing_gpudirect(gl_client* c, uint32_t tensor_id, uint64_t* staged_bytes,
                         uint64_t* direct_bytes, const char** note) {
  if (c == nullptr) return -1;
  if (staged_bytes != nullptr) *staged_bytes = c->staging ? c->staging->staged_bytes() : 0;
  if (direct_bytes != nullptr) *direct_bytes = c->staging ? c->staging->direct_bytes() : 0;
  if (note != nullptr) *note = c->gpudirect_note.c_str();
  return c->staging != nullptr && c->staging->IsDirect(tensor_id) ? 1 : 0;
}

int gl_poll(gl_client* c, gl_completion* out, uint32_t max, uint32_t* count) {
  if (c == nullptr || count == nullptr || (out == nullptr && max > 0)) return GL_E_INVALID_ARGUMENT;
  uint32_t n = 0;
  DeviceStaging* staging = c->staging.get();
  while (n < max) {
    gl_cqe e;
    // With device tensors every completion queues behind the copies of those before it.
    if (staging != nullptr && staging->TakeReady(&e)) {
      if (e.status == GL_E_DEVICE) Fail(c, GL_E_DEVICE, staging->last_error());
    } else {
      if (staging != nullptr && staging->Full()) break;
      const RingResult r = c->cq.TryPop(&e);
      if (r == RingResult::kEmpty) break;
      if (r != RingResult::kOk) {
        *count = n;
        return Fail(c, GL_E_RING_CORRUPT, "completion ring producer index inconsistent");
      }
      if (staging != nullptr) {
        staging->Accept(e);
        continue;
      }
    }
    gl_completion& o = out[n++];
    o.status = e.status;
    o.tensor_id = e.tensor_id;
    o.iteration = e.iteration;
    o.offset = e.offset;
    o.length = e.length;
    o.user_data = e.user_data;
  }
  *count = n;
  return GL_OK;
}

int gl_wait(gl_client* c, gl_completion* out, uint32_t max, uint32_t* count, int timeout_ms) {
  if (c == nullptr || count == nullptr || out == nullptr || max == 0) return GL_E_INVALID_ARGUMENT;
  const int64_t start = NowNs();
  const int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + int64_t{timeout_ms} * 1'000'000;
  for (;;) {
    int s = gl_poll(c, out, max, count);
    if (s != GL_OK || *count > 0) return s;
    if (c->staging != nullptr && c->staging->HasPending()) {
      // The next completion is a copy to the GPU away: no doorbell will say when it ends.
      c->staging->WaitForHead();
      continue;
    }
    if (c->disconnected.load(std::memory_order_acquire)) return FailDisconnected(c);
    const int64_t now = NowNs();
    if (now - start < kSpinNs && now < deadline) continue;
    if (now >= deadline) return GL_E_TIMEOUT;
    c->cq_bell.Arm();
    if (c->cq.HasEntry()) {
      c->cq_bell.Disarm();
      continue;
    }
    int wait_ms = -1;
    if (deadline != INT64_MAX) wait_ms = static_cast<int>((deadline - now + 999'999) / 1'000'000);
    bool socket_event = false;
    c->cq_bell.Wait(wait_ms, c->socket.get(), &socket_event);
    c->cq_bell.Drain();
    c->cq_bell.Disarm();
    if (socket_event) {
      s = ReadSocketEvent(c);
      if (s != GL_OK) {
        // Completions posted before the goodbye are still valid: hand them out first.
        if (gl_poll(c, out, max, count) == GL_OK && *count > 0) return GL_OK;
        return s;
      }
    }
  }
}

int gl_arena(const gl_client* c, void** base, uint64_t* bytes) {
  if (c == nullptr || base == nullptr || bytes == nullptr) return GL_E_INVALID_ARGUMENT;
  *base = c->arena.base();
  *bytes = c->arena.size();
  return GL_OK;
}

uint64_t gl_session_id(const gl_client* c) { return c == nullptr ? 0 : c->session_id; }

void gl_close(gl_client* c) {
  if (c != nullptr && t_error_client == c) {  // a later client may get the same address
    t_error_client = nullptr;
    t_error_is_disconnect = false;
    t_error.clear();
  }
  delete c;
}

}  // extern "C"
