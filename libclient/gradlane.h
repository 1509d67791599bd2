/* libclient/gradlane.h — libgradlane, the C ABI a training process uses to hand gradients to
 * the host's gradlane daemon.
 *
 * Flow: gl_connect -> gl_register_job -> gl_register_tensor (returns the tensor's buffer, which
 * lives in shared memory the daemon reads and writes) -> per iteration: write the gradient into
 * the buffer, gl_post (whole tensor or a byte range) -> gl_poll / gl_wait for completions (the
 * reduced result is then in the buffer) -> gl_close.
 *
 * Guarantees and rules:
 * - Every call returns a gl_status (0 = GL_OK); gl_strerror() names it, gl_last_error() gives
 *   the detail of the last failure on that client (e.g. the daemon's message).
 * - Control calls (connect, register) talk to the daemon over its Unix socket and block for
 *   the reply (at most timeout_ms of the connect options). Data calls (post, poll) touch only
 *   shared memory: no system call while the daemon is awake, no allocation. gl_wait sleeps on
 *   an eventfd after a short spin.
 * - Threads: a gl_client may be used from several threads if calls are not concurrent with
 *   each other, with one exception: one thread may post while another polls/waits (the
 *   submission and completion rings are independent single-producer/single-consumer rings).
 * - The buffers returned by gl_register_tensor stay valid until gl_close.
 * - ABI: this header is versioned with shm/abi.h (GL_ABI_VERSION); the daemon refuses a client
 *   of another version with GL_E_BAD_VERSION at connect.
 */
#ifndef GRADLANE_LIBCLIENT_GRADLANE_H_
#define GRADLANE_LIBCLIENT_GRADLANE_H_

#include <stddef.h>
#include <stdint.h>

#include "shm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gl_client gl_client;

typedef struct gl_connect_options {
  const char* socket_path; /* NULL: $GRADLANE_SOCKET, else GL_DEFAULT_SOCKET_PATH */
  uint64_t arena_bytes;    /* 0: the daemon's default */
  uint32_t ring_slots;     /* 0: the daemon's default */
  int32_t timeout_ms;      /* control-call timeout; 0: 10000 */
} gl_connect_options;

typedef struct gl_job_info {
  const char* job_id; /* non-empty, < GL_JOB_ID_BYTES */
  uint32_t rank;
  uint32_t world_size;
  const char* const* peers; /* world_size "host:port" daemon addresses, or NULL */
  uint32_t num_peers;       /* world_size, or 0 */
  const char* policy;       /* e.g. "bytescheduler"; NULL = daemon default */
  const char* auth_token;   /* NULL = none */
} gl_job_info;

typedef struct gl_completion {
  int32_t status; /* gl_status: GL_OK, or why the descriptor was refused */
  uint32_t tensor_id;
  int64_t iteration;
  uint64_t offset;
  uint64_t length;
  uint64_t user_data;
} gl_completion;

/* Whole-tensor length for gl_post. */
#define GL_WHOLE_TENSOR UINT64_MAX

const char* gl_strerror(int status);

/* Connects, sends the hello (magic, ABI version, pid) and maps the session's arena. */
int gl_connect(const gl_connect_options* options, gl_client** out);

/* Detail of the last failure of a call on `c` made by the calling thread (per thread, like
 * errno: a thread posting and another waiting each read their own); once the session has ended,
 * a thread with no failure of its own on `c` gets the daemon's reason. `c` NULL: the calling
 * thread's last gl_connect failure. Never NULL ("" if none); valid until that thread's next
 * call on `c`. */
const char* gl_last_error(const gl_client* c);

int gl_register_job(gl_client* c, const gl_job_info* job);

/* Like gl_register_job, choosing how the job reduces its gradients: `mode` is a gl_job_mode
 * (GL_MODE_PS, what gl_register_job registers, or GL_MODE_ALLREDUCE). Every rank of a job must
 * choose the same mode; ranks that differ fail the job at its first post with GL_E_BAD_TENSOR
 * and a message naming both modes. Since GRADLANE_1.1. */
int gl_register_job_mode(gl_client* c, const gl_job_info* job, int mode);

/* Registers a tensor; the daemon places its buffer in the arena. `priority` >= 0 (0 = most
 * urgent) or GL_PRIORITY_AUTO. `dtype` is a gl_dtype. */
int gl_register_tensor(gl_client* c, const char* name, uint64_t bytes, int dtype, int32_t priority,
                       uint32_t* tensor_id, void** buffer);

/* Registers a tensor that lives in GPU memory: `bytes` bytes at the CUDA device pointer
 * `device_ptr` (cuMemAlloc, cudaMalloc, a CUDA tensor's data pointer), which must stay
 * allocated until gl_close. It is then posted and completed like any tensor, and the reduced
 * result lands in that device memory:
 * - gl_post copies the posted range to the daemon's shared memory before it returns — with
 *   GPUDirect (below) only the part this host's own shard reduces. Either way it returns once
 *   the work already issued to the legacy default stream (stream 0, PyTorch's default stream,
 *   cudaMemcpy) has finished: a gradient computed there needs no synchronize. One computed
 *   on another stream must be finished first, or posted with gl_post_after.
 * - A completion of the tensor is handed out by gl_poll/gl_wait only once the result has been
 *   copied back into device memory. Completions keep the order the daemon gave them.
 * - Until then the range belongs to libgradlane, as for host tensors: neither read nor write it.
 * The CUDA driver is loaded on the first call (libcuda.so.1, or $GRADLANE_CUDA_LIBRARY); no
 * driver, no GPU, host memory, a range past the allocation, or device tensors of different CUDA
 * contexts on one client: GL_E_DEVICE or GL_E_INVALID_ARGUMENT with the reason in
 * gl_last_error. A copy that fails turns gl_post's return, or the completion's status, into
 * GL_E_DEVICE.
 * GPUDirect: where the GPU exports dma-bufs and the daemon's backend is RDMA verbs, the
 * tensor's allocation is offered to the daemon, whose NIC then reads the pushes from, and
 * writes other hosts' results into, GPU memory directly (parameter-server jobs; docs/gpu.md).
 * Where anything refuses, the tensor is staged as above and this call still succeeds.
 * GRADLANE_GPUDIRECT=0 turns it off. If the daemon does not answer the offer, or answers with
 * a stage map outside the arena, the session ends (GL_E_DISCONNECTED): it may have taken the
 * memory. Since GRADLANE_1.2. */
int gl_register_device_tensor(gl_client* c, const char* name, void* device_ptr, uint64_t bytes,
                              int dtype, int32_t priority, uint32_t* tensor_id);

/* Posts "bytes [offset, offset+length) of the tensor are ready for `iteration`"
 * (length GL_WHOLE_TENSOR = from offset to the end). GL_E_AGAIN if the submission ring is
 * full: consume completions and retry. The daemon validates the descriptor; a bad one comes
 * back as a completion with an error status. */
int gl_post(gl_client* c, uint32_t tensor_id, int64_t iteration, uint64_t offset, uint64_t length,
            uint64_t user_data);

/* gl_post for a range computed on any CUDA stream: `cuda_event` (a CUevent, or a cudaEvent_t,
 * the same handle) was recorded on that stream after the range was written. The copy of a
 * device tensor waits for that event only — not for the legacy default stream, so work queued
 * there since (the rest of a backward pass) does not delay the post; a host tensor's post waits
 * on the host for the event (a device-to-host copy into the buffer, say). Returns once the
 * bytes are in shared memory, like gl_post; blocks the calling thread until the event has
 * passed, so a training loop posts from a thread of its own. `cuda_event` NULL: gl_post.
 * GL_E_DEVICE if waiting for the event or the copy fails (nothing is queued). Since
 * GRADLANE_1.3. */
int gl_post_after(gl_client* c, uint32_t tensor_id, int64_t iteration, uint64_t offset,
                  uint64_t length, uint64_t user_data, void* cuda_event);

/* Copies up to `max` completions into `out` without blocking; `*count` says how many. */
int gl_poll(gl_client* c, gl_completion* out, uint32_t max, uint32_t* count);

/* Like gl_poll but waits up to `timeout_ms` (-1 = forever) for at least one completion.
 * GL_E_TIMEOUT if none came; GL_E_DISCONNECTED (with the daemon's reason in gl_last_error)
 * if the daemon closed the session. */
int gl_wait(gl_client* c, gl_completion* out, uint32_t max, uint32_t* count, int timeout_ms);

/* The whole arena mapping (for registering it with a NIC or GPU driver). */
int gl_arena(const gl_client* c, void** base, uint64_t* bytes);

/* Session id the daemon assigned. */
uint64_t gl_session_id(const gl_client* c);

/* Closes the session; the daemon reclaims its arena and ids. Buffers become invalid. */
void gl_close(gl_client* c);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRADLANE_LIBCLIENT_GRADLANE_H_ */
