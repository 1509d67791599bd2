/* libclient/gradlane_testing.h — hooks for tests and tools, not part of the installed API.
 * They bypass the library's own argument handling so the daemon's validation can be tested
 * with descriptors the public calls would never produce. */
#ifndef GRADLANE_LIBCLIENT_GRADLANE_TESTING_H_
#define GRADLANE_LIBCLIENT_GRADLANE_TESTING_H_

#include "libclient/gradlane.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Posts `sqe` as is (its seq is overwritten by the ring). */
int gl_testing_post_raw(gl_client* c, const gl_sqe* sqe);

/* Sends `len` bytes as one control message and waits for the reply to `request_id`. */
int gl_testing_control(gl_client* c, const void* msg, uint32_t len, uint64_t request_id,
                       gl_reply* reply);

/* The session's control socket (owned by the client), for tests that send what the library
 * never would (e.g. more file descriptors than a message may carry). */
int gl_testing_socket_fd(gl_client* c);

/* GPUDirect: 1 when the daemon sends device tensor `tensor_id`'s pushes from GPU memory (its
 * stage map is published), 0 when it is staged whole, -1 for a NULL client. The bytes gl_post
 * copied into the arena and those it left to the NIC, over all device tensors; why the last
 * device tensor registered is staged whole ("" if it was attached). */
int gl_testing_gpudirect(gl_client* c, uint32_t tensor_id, uint64_t* staged_bytes,
                         uint64_t* direct_bytes, const char** note);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRADLANE_LIBCLIENT_GRADLANE_TESTING_H_ */
