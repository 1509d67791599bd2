// transport/tcp/socket_util.h — the socket plumbing of the TCP backend: numeric address
// parsing, listener and non-blocking connect set-up, and peer socket tuning.
//
// Guarantees: no name resolution (numeric addresses only, so nothing here can block the engine
// thread on DNS); every failure is an absl::Status naming the address and the errno text;
// descriptors are created non-blocking and close-on-exec. Thread-compatible (no shared state).
#ifndef GRADLANE_TRANSPORT_TCP_SOCKET_UTIL_H_
#define GRADLANE_TRANSPORT_TCP_SOCKET_UTIL_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace gradlane::transport::tcp {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  std::string text;  // "1.2.3.4:5" or "[::1]:5", for messages
};

// "1.2.3.4:5000" or "[::1]:5000".
absl::StatusOr<SockAddr> ParseHostPort(std::string_view host_port);
// A numeric IPv4/IPv6 host and a port.
absl::StatusOr<SockAddr> MakeSockAddr(std::string_view host, uint16_t port);

// A bound, listening, non-blocking socket. A port in use is FailedPrecondition with a message
// that says so (the usual cause: another daemon already runs there).
absl::StatusOr<int> OpenListener(const SockAddr& addr, int backlog);

// Starts a non-blocking connect. Returns the descriptor; the outcome arrives as writability
// (then ConnectResult). Immediate failures (e.g. no route) are an error status.
absl::StatusOr<int> StartConnect(const SockAddr& addr);
// 0 when a non-blocking connect succeeded, otherwise its errno.
int ConnectResult(int fd);

// TCP_NODELAY (frames are latency-sensitive and already batched by writev), optional buffer
// sizes, keep-alive and TCP_USER_TIMEOUT derived from the peer timeout so a silently vanished
// host is also noticed by the kernel.
void TunePeerSocket(int fd, const TransportOptions& options);

uint16_t LocalPort(int fd);
std::string ErrnoText(int err);

}  // namespace gradlane::transport::tcp

#endif  // GRADLANE_TRANSPORT_TCP_SOCKET_UTIL_H_
