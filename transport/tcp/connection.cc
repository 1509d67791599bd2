#include "transport/tcp/connection.h"

#include <bit>
#include <cstring>

namespace gradlane::transport::tcp {

void Connection::Init(uint32_t pending_capacity) {
  const uint64_t cap = std::bit_ceil<uint64_t>(pending_capacity == 0 ? 1 : pending_capacity);
  ring.assign(cap, PendingSend{});
  mask = cap - 1;
  ctrl.assign(cap * kFrameHeaderBytes + kCtrlSlackBytes, 0);
}

void Connection::InitHandshake() {
  ring.assign(1, PendingSend{});
  mask = 0;
  ctrl.assign(kCtrlSlackBytes, 0);
}

void Connection::GrowForData(uint32_t pending_capacity) {
  const uint64_t cap = std::bit_ceil<uint64_t>(pending_capacity == 0 ? 1 : pending_capacity);
  if (ring.size() < cap) {
    // Nothing is posted before the peer is up (the engine has no handle until OnPeerUp_st).
    ring.assign(cap, PendingSend{});
    mask = cap - 1;
  }
  const size_t want = cap * kFrameHeaderBytes + kCtrlSlackBytes;
  if (ctrl.size() < want) {
    // Unsent control bytes sit in [ctrl_off, ctrl_len): move them to the front, then grow.
    std::memmove(ctrl.data(), ctrl.data() + ctrl_off, ctrl_len - ctrl_off);
    ctrl_len -= ctrl_off;
    ctrl_off = 0;
    ctrl.resize(want, 0);
  }
}

void Connection::ReleaseStorage() {
  std::vector<PendingSend>().swap(ring);
  std::vector<uint8_t>().swap(ctrl);
  mask = 0;
}

void Connection::ResetForUse() {
  state = ConnState::kFree;
  fd = -1;
  inbound = false;
  epollout_armed = false;
  in_dirty_list = false;
  restart_progress_timer = false;
  known = false;
  job_index = -1;
  peer_rank = 0;
  addr = SockAddr{};
  attempt_deadline = retry_at = give_up_at = backoff = last_progress = 0;
  last_error = absl::OkStatus();
  ack_idx = write_idx = post_idx = 0;
  write_off = 0;
  ctrl_off = ctrl_len = 0;
  ctrl_in_iov = false;
  rx_state = RxState::kHeader;
  rx_got = 0;
  rx_dst = nullptr;
  rx_target = RecvTarget{};
  counters.Reset_st();
}

bool Connection::AppendCtrl(const FrameHeader& header, const void* body, size_t body_bytes) {
  const size_t need = sizeof(header) + body_bytes;
  if (ctrl.size() - ctrl_len < need) {
    if (CtrlFree() < need) return false;
    // Compact: control frames are small and rare next to data, so a memmove here is cheap.
    std::memmove(ctrl.data(), ctrl.data() + ctrl_off, ctrl_len - ctrl_off);
    ctrl_len -= ctrl_off;
    ctrl_off = 0;
  }
  std::memcpy(ctrl.data() + ctrl_len, &header, sizeof(header));
  if (body_bytes > 0) std::memcpy(ctrl.data() + ctrl_len + sizeof(header), body, body_bytes);
  ctrl_len += need;
  return true;
}

size_t Connection::BuildIov(iovec* iov, bool with_data) {
  size_t n = 0;
  ctrl_in_iov = false;
  if (write_off == 0 && ctrl_off != ctrl_len) {
    iov[n++] = iovec{ctrl.data() + ctrl_off, ctrl_len - ctrl_off};
    ctrl_in_iov = true;
  }
  if (!with_data) return n;
  uint64_t off = write_off;
  for (uint64_t i = write_idx; i != post_idx && n + 2 <= kMaxIov; ++i) {
    PendingSend& s = Slot(i);
    if (off < kFrameHeaderBytes) {
      iov[n++] = iovec{reinterpret_cast<uint8_t*>(&s.header) + off, kFrameHeaderBytes - off};
      off = kFrameHeaderBytes;
    }
    const uint64_t done = off - kFrameHeaderBytes;
    if (s.header.length > done) {
      // The payload goes from the registered region to the kernel; const_cast only because
      // iovec is not const-correct — writev never writes through it.
      iov[n++] = iovec{const_cast<uint8_t*>(s.payload) + done, s.header.length - done};
    }
    off = 0;
  }
  return n;
}

void Connection::Consume(size_t n) {
  if (ctrl_in_iov) {
    const size_t c = std::min(n, ctrl_len - ctrl_off);
    ctrl_off += c;
    n -= c;
    if (ctrl_off == ctrl_len) ctrl_off = ctrl_len = 0;
    ctrl_in_iov = false;
  }
  while (n > 0 && write_idx != post_idx) {
    const uint64_t frame = kFrameHeaderBytes + Slot(write_idx).header.length;
    const uint64_t left = frame - write_off;
    if (n >= left) {
      n -= left;
      write_off = 0;
      ++write_idx;
    } else {
      write_off += n;
      n = 0;
    }
  }
}

}  // namespace gradlane::transport::tcp
