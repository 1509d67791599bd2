#include "transport/tcp/socket_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradlane::transport::tcp {

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer (maybe not buf).
  const char* s = strerror_r(err, buf, sizeof(buf));
  return std::string(s);
}

absl::StatusOr<SockAddr> MakeSockAddr(std::string_view host, uint16_t port) {
  SockAddr out;
  const std::string h(host);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    out.len = sizeof(sockaddr_in);
    out.text = absl::StrCat(h, ":", port);
    return out;
  }
  out.storage = {};
  if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    out.len = sizeof(sockaddr_in6);
    out.text = absl::StrCat("[", h, "]:", port);
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", std::string(host), "' is not a numeric IPv4 or IPv6 address"));
}

absl::StatusOr<SockAddr> ParseHostPort(std::string_view host_port) {
  std::string_view host;
  std::string_view port_text;
  if (!host_port.empty() && host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == std::string_view::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", std::string(host_port), "' (want [v6]:port)"));
    }
    host = host_port.substr(1, close - 1);
    port_text = host_port.substr(close + 2);
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string_view::npos || host_port.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", std::string(host_port), "' (want host:port or [v6]:port)"));
    }
    host = host_port.substr(0, colon);
    port_text = host_port.substr(colon + 1);
  }
  unsigned port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad port in address '", std::string(host_port), "'"));
  }
  return MakeSockAddr(host, static_cast<uint16_t>(port));
}

absl::StatusOr<int> OpenListener(const SockAddr& addr, int backlog) {
  const int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket(): ", ErrnoText(errno)));
  const int one = 1;
  // Lets a restarted daemon bind while old connections sit in TIME_WAIT; a live listener on
  // the port still makes bind() fail with EADDRINUSE on Linux.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    const int err = errno;
    close(fd);
    if (err == EADDRINUSE) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot listen on ", addr.text,
                       ": address already in use (is another gradlaned running?)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot bind ", addr.text, ": ", ErrnoText(err)));
  }
  if (listen(fd, backlog) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", addr.text, ": ", ErrnoText(err)));
  }
  return fd;
}

absl::StatusOr<int> StartConnect(const SockAddr& addr) {
  const int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket(): ", ErrnoText(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0 &&
      errno != EINPROGRESS) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to ", addr.text, ": ", ErrnoText(err)));
  }
  return fd;
}

int ConnectResult(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

void TunePeerSocket(int fd, const TransportOptions& options) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (options.socket_buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &options.socket_buffer_bytes, sizeof(int));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &options.socket_buffer_bytes, sizeof(int));
  }
  // The engine's own watchdog fails a peer at exactly peer_timeout when sends are pending; the
  // kernel's user timeout is only a backstop (2x), so the two never race to report one event.
  const int64_t timeout_ms = std::max<int64_t>(1, options.peer_timeout / sched::kMillisecond);
  const unsigned user_timeout = static_cast<unsigned>(std::min<int64_t>(2 * timeout_ms, 1 << 30));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  // Keep-alive covers the idle case the watchdog cannot see (nothing pending, waiting on the
  // peer): idle T/2, then 3 probes T/6 apart, so a dead host is reset within about T.
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  const int64_t timeout_s = timeout_ms / 1000;
  const int idle_s = static_cast<int>(std::clamp<int64_t>(timeout_s / 2, 1, 3600));
  const int interval_s = static_cast<int>(std::clamp<int64_t>(timeout_s / 6, 1, 3600));
  const int count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

uint16_t LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

}  // namespace gradlane::transport::tcp
