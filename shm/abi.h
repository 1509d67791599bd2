/* shm/abi.h — the C ABI shared by libgradlane (client) and gradlaned (daemon): the session
 * hello, control messages on the Unix socket, the arena header, ring headers, submission
 * descriptors and completions.
 *
 * Guarantees:
 * - Plain C11 / C++20, fixed-width fields, explicit padding, no pointers: every position is an
 *   offset from the start of the session's arena. Sizes and offsets are checked by
 *   static_asserts at the bottom of this file, so a layout change fails to compile.
 * - Versioned: any change to a struct here bumps GL_ABI_VERSION; the hello carries magic and
 *   version and the daemon refuses a mismatch with GL_E_BAD_VERSION before anything is mapped.
 * - Shared fields that two processes write concurrently (ring indices, sequence marks, the
 *   armed flag) are plain integers here; C++ code accesses them through std::atomic_ref (see
 *   shm/ring.h and docs/abi.md for the memory-ordering argument). C clients must use the
 *   library, never touch the rings directly.
 * - Nothing in the arena is trusted by the daemon: it reads each index once into a local and
 *   bounds-checks every offset, length and id a client writes.
 */
#ifndef GRADLANE_SHM_ABI_H_
#define GRADLANE_SHM_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GL_ABI_MAGIC 0x4E414C47u /* "GLAN" little-endian */
#define GL_ABI_VERSION 2u
/* The oldest client ABI the daemon still serves: version 1 differs only in
 * gl_msg_register_job, which had no `mode` (such a job is a parameter-server job). */
#define GL_ABI_VERSION_MIN 1u
#define GL_CACHE_LINE 64u
#define GL_DEFAULT_SOCKET_PATH "/run/gradlane/gradlaned.sock"

/* Largest control message on the socket (SOCK_SEQPACKET: one send is one message). */
#define GL_MAX_CONTROL_MESSAGE 65536u
#define GL_MESSAGE_TEXT 128u
#define GL_JOB_ID_BYTES 64u
#define GL_POLICY_BYTES 32u
#define GL_AUTH_TOKEN_BYTES 128u
#define GL_TENSOR_NAME_BYTES 128u
#define GL_MAX_PEERS 4096u

/* Status codes: returned by every libgradlane call, carried in replies and completions.
 * 0 is success; values are stable across ABI versions (new ones are only appended). */
typedef enum gl_status {
  GL_OK = 0,
  GL_E_INVALID_ARGUMENT = 1, /* a caller-side argument is wrong (NULL, too long, ...) */
  GL_E_BAD_MAGIC = 2,        /* the hello's magic is not GL_ABI_MAGIC */
  GL_E_BAD_VERSION = 3,      /* client and daemon speak different ABI versions */
  GL_E_PERMISSION = 4,       /* SO_PEERCRED uid/gid not allowed by the daemon's policy */
  GL_E_NO_MEMORY = 5,        /* the session's arena (or a limit) is exhausted */
  GL_E_AGAIN = 6,            /* submission ring full: poll completions, then retry */
  GL_E_TIMEOUT = 7,          /* nothing arrived within the timeout */
  GL_E_DISCONNECTED = 8,     /* the daemon closed the session or is gone */
  GL_E_PROTOCOL = 9,         /* malformed control message or out-of-order request */
  GL_E_BAD_TENSOR = 10,      /* descriptor names a tensor id this session never registered */
  GL_E_BAD_RANGE = 11,       /* byte range empty, outside the tensor, or not whole elements */
  GL_E_BAD_ITERATION = 12,   /* iteration negative, going backwards or skipping ahead */
  GL_E_BAD_OPCODE = 13,      /* descriptor opcode unknown */
  GL_E_BAD_DESCRIPTOR = 14,  /* descriptor flags / reserved fields not zero */
  GL_E_NO_JOB = 15,          /* posting before the job was registered */
  GL_E_ALREADY_EXISTS = 16,  /* job registered twice, tensor name registered twice */
  GL_E_RING_CORRUPT = 17,    /* ring header/indices inconsistent: session closed */
  GL_E_IO = 18,              /* a system call failed (errno in the message) */
  GL_E_INTERNAL = 19,
  GL_E_BUSY = 20,   /* a daemon limit on connections or sessions is reached: retry later */
  GL_E_DEVICE = 21, /* GPU memory or the CUDA driver: none, not device memory, a copy failed */
  GL_STATUS_COUNT = 22
} gl_status;

typedef enum gl_dtype { /* values match gradlane::sched::DType */
                        GL_DTYPE_F32 = 0,
                        GL_DTYPE_F16 = 1,
                        GL_DTYPE_BF16 = 2
} gl_dtype;

#define GL_PRIORITY_AUTO (-1)

/* How a job reduces its gradients; every rank of a job must choose the same. */
typedef enum gl_job_mode {
  GL_MODE_PS = 0,       /* co-located parameter servers: push to a key's shard, pull the result */
  GL_MODE_ALLREDUCE = 1 /* ring all-reduce: reduce-scatter, then all-gather, per partition */
} gl_job_mode;

/* ---------------------------------------------------------------- control messages ----- */

typedef enum gl_msg_type {
  GL_MSG_HELLO = 1,           /* client -> daemon: gl_hello */
  GL_MSG_HELLO_REPLY = 2,     /* daemon -> client: gl_hello_reply + SCM_RIGHTS fds */
  GL_MSG_REGISTER_JOB = 3,    /* client -> daemon: gl_msg_register_job + peer addresses */
  GL_MSG_REGISTER_TENSOR = 4, /* client -> daemon: gl_msg_register_tensor */
  GL_MSG_REPLY = 5,           /* daemon -> client: gl_reply to a request */
  GL_MSG_GOODBYE = 6,         /* daemon -> client: gl_reply, unsolicited, before closing */
  GL_MSG_ATTACH_DEVICE = 7    /* client -> daemon: gl_msg_attach_device + one fd (a dma-buf) */
} gl_msg_type;

/* Every control message starts with this. `length` is the whole message in bytes;
 * `request_id` is chosen by the client and echoed in the reply. */
typedef struct gl_msg_header {
  uint32_t type;
  uint32_t length;
  uint64_t request_id;
} gl_msg_header;

/* First message on a new connection. Sizes of 0 ask for the daemon's defaults; the daemon
 * caps both at its configured maxima and reports what it granted. */
typedef struct gl_hello {
  gl_msg_header header;
  uint32_t magic;       /* GL_ABI_MAGIC */
  uint32_t abi_version; /* GL_ABI_VERSION */
  int32_t pid;          /* informational; the daemon trusts SO_PEERCRED */
  uint32_t ring_slots;  /* submission and completion ring slots (power of two), 0 = default */
  uint64_t arena_bytes; /* arena size wanted, 0 = default */
  uint64_t reserved;    /* must be 0 */
} gl_hello;

/* Reply to the hello. On GL_OK it arrives with three fds (SCM_RIGHTS), in this order:
 * the arena memfd, the submission doorbell (client writes), the completion doorbell
 * (daemon writes). On an error no fds are sent, `message` explains, and the daemon closes. */
typedef struct gl_hello_reply {
  gl_msg_header header;
  int32_t status;
  uint32_t abi_version; /* the daemon's */
  uint64_t session_id;
  uint64_t arena_bytes;
  char message[GL_MESSAGE_TEXT];
} gl_hello_reply;

/* Followed by `peers_bytes` bytes: `num_peers` NUL-terminated "host:port" strings, in rank
 * order. Strings in the fixed part are NUL-terminated within their arrays. */
typedef struct gl_msg_register_job {
  gl_msg_header header;
  char job_id[GL_JOB_ID_BYTES];
  uint32_t rank;
  uint32_t world_size;
  char policy[GL_POLICY_BYTES];
  char auth_token[GL_AUTH_TOKEN_BYTES];
  uint32_t num_peers;
  uint32_t peers_bytes;
  uint32_t mode;     /* gl_job_mode (ABI 2; a version-1 message ends before this field) */
  uint32_t reserved; /* must be 0 */
} gl_msg_register_job;

/* What a version-1 client sends: the message above without its last two fields. */
#define GL_REGISTER_JOB_V1_BYTES 256u

typedef struct gl_msg_register_tensor {
  gl_msg_header header;
  char name[GL_TENSOR_NAME_BYTES];
  uint64_t bytes;
  int32_t priority; /* 0 = most urgent; GL_PRIORITY_AUTO = learned by the daemon */
  uint8_t dtype;    /* gl_dtype */
  uint8_t reserved[3];
} gl_msg_register_tensor;

/* GPUDirect: the GPU memory behind a registered device tensor, exported by the client as a
 * dma-buf whose fd comes with this message (SCM_RIGHTS). The daemon registers it with its NIC
 * (verbs backends only) when the job starts and then reads the tensor's pushes to other hosts
 * straight from GPU memory; what the CPU must read stays staged in the arena, as the tensor's
 * gl_stage_map says. Sent after GL_MSG_REGISTER_TENSOR and before the job's first post.
 * Added within ABI 2: a daemon that predates it answers GL_E_PROTOCOL ("unknown control
 * message type 7") and the client stages everything, as before. */
typedef struct gl_msg_attach_device {
  gl_msg_header header;
  uint32_t tensor_id;
  uint32_t reserved;       /* must be 0 */
  uint64_t dmabuf_offset;  /* the tensor's first byte within the dma-buf */
  uint64_t dmabuf_bytes;   /* the dma-buf's length (what is registered) */
  uint64_t device_address; /* the dma-buf's first byte in the client's GPU address space */
} gl_msg_attach_device;

/* Generic reply. For GL_MSG_ATTACH_DEVICE: value0 = the offset in the arena of the tensor's
 * gl_stage_map. For GL_MSG_REGISTER_TENSOR: value0 = tensor id, value1 = buffer offset in
 * the arena, value2 = bytes. For GL_MSG_REGISTER_JOB: all values 0. */
typedef struct gl_reply {
  gl_msg_header header;
  int32_t status;
  uint32_t reserved;
  uint64_t value0;
  uint64_t value1;
  uint64_t value2;
  char message[GL_MESSAGE_TEXT];
} gl_reply;

/* ---------------------------------------------------------------- shared memory ---------- */

/* At offset 0 of every arena. Written once by the daemon before the fd is passed; the daemon
 * never reads it back (the client could overwrite it). */
#define GL_ARENA_MAGIC 0x414E5241474C0001ull
typedef struct gl_arena_header {
  uint64_t magic;
  uint32_t abi_version;
  uint32_t ring_slots; /* both rings */
  uint64_t arena_bytes;
  uint64_t sq_offset;   /* gl_ring_header of the submission ring; slots follow it */
  uint64_t cq_offset;   /* gl_ring_header of the completion ring; slots follow it */
  uint64_t data_offset; /* first byte of the tensor-buffer region */
  uint64_t data_bytes;
  uint64_t reserved[1];
} gl_arena_header;

/* A ring: this header, then `slots` entries of `slot_size` bytes. Indices are free-running
 * uint64 counters (never wrap in practice); slot = index & (slots - 1).
 * Cache line 0: constants. Line 1: producer index. Line 2: consumer index. Line 3: the
 * consumer's armed (sleeping) flag, apart from the consumer index so the producer's check of
 * it after every post reads a line that only changes when the consumer goes to sleep. */
#define GL_RING_MAGIC 0x474E4952u /* "RING" */
typedef struct gl_ring_header {
  uint32_t magic;
  uint32_t slots;
  uint32_t slot_size;
  uint32_t reserved0;
  uint8_t pad0[GL_CACHE_LINE - 16];
  uint64_t tail; /* producer: entries [0, tail) have been published */
  uint8_t pad1[GL_CACHE_LINE - 8];
  uint64_t head; /* consumer: entries [0, head) have been consumed; their slots are free */
  uint8_t pad2[GL_CACHE_LINE - 8];
  uint32_t armed; /* consumer: 1 = about to sleep / asleep on the doorbell, ring it */
  uint8_t pad3[GL_CACHE_LINE - 4];
} gl_ring_header;

/* Which partitions of an attached device tensor the client must still copy into its staging
 * buffer before posting: those this host's own shard reads with the CPU. Written by the daemon
 * once the job's key map is fixed (its first post), then `ready` is set to 1 with release
 * semantics and nothing changes again. While `ready` is 0 the client stages every byte (the
 * daemon reads device memory only where a bit is clear, and staged bytes are equal to device
 * bytes, so staging more than needed is always correct). Partition p is
 * [p * partition_bytes, min((p + 1) * partition_bytes, tensor bytes)); bit p of `staged`
 * (byte p / 8, bit p % 8) set means "copy it". `staged` holds `map_bits` bits. */
typedef struct gl_stage_map {
  uint32_t ready;
  uint32_t num_partitions;
  uint64_t partition_bytes;
  uint32_t map_bits; /* capacity of `staged`, fixed at the attach */
  uint32_t reserved;
  /* followed by `staged`: ceil(map_bits / 8) bytes */
} gl_stage_map;

typedef enum gl_opcode {
  GL_OP_POST = 1 /* bytes [offset, offset+length) of the tensor are ready for `iteration` */
} gl_opcode;

/* Submission descriptor, one cache line. `seq` is the sequence mark: the producer writes
 * the payload, then seq = index + 1 (release); the consumer takes slot `index` only when it
 * reads exactly that mark. */
typedef struct gl_sqe {
  uint64_t seq;
  uint64_t user_data; /* echoed in the completion */
  int64_t iteration;
  uint64_t offset; /* from the tensor's first byte */
  uint64_t length;
  uint32_t tensor_id;
  uint16_t opcode; /* gl_opcode */
  uint16_t flags;  /* must be 0 */
  uint64_t reserved[2];
} gl_sqe;

/* Completion, one cache line. One per submission, in the order the daemon finishes them
 * (not necessarily submission order once the daemon schedules). */
typedef struct gl_cqe {
  uint64_t seq;
  uint64_t user_data;
  int64_t iteration;
  uint64_t offset;
  uint64_t length;
  uint32_t tensor_id;
  int32_t status; /* gl_status */
  uint64_t reserved[2];
} gl_cqe;

#ifdef __cplusplus
} /* extern "C" */
#define GL_STATIC_ASSERT static_assert
#else
#define GL_STATIC_ASSERT _Static_assert
#endif

#include <stddef.h>

GL_STATIC_ASSERT(sizeof(gl_msg_header) == 16, "gl_msg_header layout");
GL_STATIC_ASSERT(sizeof(gl_hello) == 48, "gl_hello layout");
GL_STATIC_ASSERT(offsetof(gl_hello, magic) == 16, "gl_hello layout");
GL_STATIC_ASSERT(offsetof(gl_hello, arena_bytes) == 32, "gl_hello layout");
GL_STATIC_ASSERT(sizeof(gl_hello_reply) == 168, "gl_hello_reply layout");
GL_STATIC_ASSERT(offsetof(gl_hello_reply, session_id) == 24, "gl_hello_reply layout");
GL_STATIC_ASSERT(offsetof(gl_hello_reply, message) == 40, "gl_hello_reply layout");
GL_STATIC_ASSERT(sizeof(gl_msg_register_job) == 264, "gl_msg_register_job layout");
GL_STATIC_ASSERT(offsetof(gl_msg_register_job, mode) == GL_REGISTER_JOB_V1_BYTES,
                 "version 2 appends mode to the version-1 message");
GL_STATIC_ASSERT(offsetof(gl_msg_register_job, rank) == 80, "gl_msg_register_job layout");
GL_STATIC_ASSERT(offsetof(gl_msg_register_job, policy) == 88, "gl_msg_register_job layout");
GL_STATIC_ASSERT(offsetof(gl_msg_register_job, num_peers) == 248, "gl_msg_register_job layout");
GL_STATIC_ASSERT(sizeof(gl_msg_register_tensor) == 160, "gl_msg_register_tensor layout");
GL_STATIC_ASSERT(offsetof(gl_msg_register_tensor, bytes) == 144, "gl_msg_register_tensor layout");
GL_STATIC_ASSERT(offsetof(gl_msg_register_tensor, dtype) == 156, "gl_msg_register_tensor layout");
GL_STATIC_ASSERT(sizeof(gl_msg_attach_device) == 48, "gl_msg_attach_device layout");
GL_STATIC_ASSERT(offsetof(gl_msg_attach_device, dmabuf_offset) == 24,
                 "gl_msg_attach_device layout");
GL_STATIC_ASSERT(sizeof(gl_stage_map) == 24, "gl_stage_map layout");
GL_STATIC_ASSERT(offsetof(gl_stage_map, partition_bytes) == 8, "gl_stage_map layout");
GL_STATIC_ASSERT(sizeof(gl_reply) == 176, "gl_reply layout");
GL_STATIC_ASSERT(offsetof(gl_reply, value0) == 24, "gl_reply layout");
GL_STATIC_ASSERT(offsetof(gl_reply, message) == 48, "gl_reply layout");
GL_STATIC_ASSERT(sizeof(gl_arena_header) == 64, "gl_arena_header layout");
GL_STATIC_ASSERT(offsetof(gl_arena_header, data_offset) == 40, "gl_arena_header layout");
GL_STATIC_ASSERT(sizeof(gl_ring_header) == 4 * GL_CACHE_LINE, "gl_ring_header layout");
GL_STATIC_ASSERT(offsetof(gl_ring_header, tail) == 1 * GL_CACHE_LINE, "tail on line 1");
GL_STATIC_ASSERT(offsetof(gl_ring_header, head) == 2 * GL_CACHE_LINE, "head on line 2");
GL_STATIC_ASSERT(offsetof(gl_ring_header, armed) == 3 * GL_CACHE_LINE, "armed on line 3");
GL_STATIC_ASSERT(sizeof(gl_sqe) == GL_CACHE_LINE, "gl_sqe is one cache line");
GL_STATIC_ASSERT(offsetof(gl_sqe, seq) == 0, "sequence mark first");
GL_STATIC_ASSERT(offsetof(gl_sqe, tensor_id) == 40, "gl_sqe layout");
GL_STATIC_ASSERT(offsetof(gl_sqe, opcode) == 44, "gl_sqe layout");
GL_STATIC_ASSERT(sizeof(gl_cqe) == GL_CACHE_LINE, "gl_cqe is one cache line");
GL_STATIC_ASSERT(offsetof(gl_cqe, seq) == 0, "sequence mark first");
GL_STATIC_ASSERT(offsetof(gl_cqe, status) == 44, "gl_cqe layout");

#endif /* GRADLANE_SHM_ABI_H_ */
