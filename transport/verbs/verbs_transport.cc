#include "transport/verbs/verbs_transport.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/verbs/verbs_describe.h"

namespace gradlane::transport::verbs {

struct VerbsTransport::Conn {
  PeerHandle handle = kNoPeer;
  PeerInfo info;
  bool outbound = false;
  uint16_t local_rank = 0;
  uint64_t job_id = 0;
  bool up_reported = false;
  bool tearing_down = false;
  uint32_t setup_slot = 0;
  std::unique_ptr<IbvQueuePair> qp;
  // Sender (the dialer's end).
  std::vector<uint8_t> reply_region, headers;
  std::unique_ptr<IbvMemory> reply_mr, headers_mr;
  std::unique_ptr<SenderSink> sender_sink;
  std::unique_ptr<VerbsSender> sender;
  std::vector<SendCompletion> sends;  // by the channel's cookie (a ring of reply_entries)
  uint64_t send_index = 0;
  std::vector<SendSpec> early;  // posted before the queue pair was up, in order
  // Liveness (the TCP connection sees no data, so its peer_timeout never fires): the sender's
  // progress mark when it last moved, and when.
  uint64_t progress_mark = 0;
  TimeNs last_progress = 0;
  // Receiver (the acceptor's end).
  std::vector<uint8_t> slots, staging;
  std::unique_ptr<IbvMemory> slots_mr, staging_mr;
  std::unique_ptr<ReceiverSink> receiver_sink;
  std::unique_ptr<VerbsReceiver> receiver;
  std::vector<RecvTarget> targets;  // the engine's answer for segment seq, at seq % entries
};

class VerbsTransport::SenderSink final : public SenderEvents {
 public:
  SenderSink(VerbsTransport& t, Conn& c) : t_(t), c_(c) {}
  void OnSendAcked_st(uint64_t cookie) override {
    t_.handler_->OnSendAcked_st(c_.sends[cookie], t_.now_);
  }
  void OnSendFailed_st(uint64_t cookie, const absl::Status& why) override {
    t_.handler_->OnSendFailed_st(c_.sends[cookie], why);
  }
  void OnChannelDown_st(const absl::Status&) override {
    if (!c_.tearing_down) t_.failed_.push_back(&c_);
  }

 private:
  VerbsTransport& t_;
  Conn& c_;
};

class VerbsTransport::ReceiverSink final : public ReceiverEvents {
 public:
  ReceiverSink(VerbsTransport& t, Conn& c) : t_(t), c_(c) {}
  SegmentTarget ResolveSegment_st(const FrameHeader& h) override {
    RecvTarget target = t_.handler_->ResolveRecv_st(c_.info, h);
    const std::optional<uint8_t*> at = t_.regions_.ResolveRecv(target, h.length);
    const RegionMemory* m = at.has_value() ? &t_.region_keys_[target.region] : nullptr;
    if (m == nullptr || (h.length > 0 && !m->registered && m->device_mr == nullptr)) {
      return SegmentTarget{};
    }
    target.by_piece = false;  // this backend places whole payloads
    c_.targets[h.seq & (c_.targets.size() - 1)] = target;
    SegmentTarget s;
    s.accept = true;
    s.local = *at;
    s.remote_addr = reinterpret_cast<uint64_t>(*at);
    s.rkey = h.length > 0 ? m->keys.rkey : 0;
    s.cookie = h.seq;
    s.cpu_writable = m->device_mr == nullptr;
    return s;
  }
  void OnSegmentPlaced_st(const FrameHeader& h, const SegmentTarget&) override {
    t_.handler_->OnRecvDone_st(c_.info, h, c_.targets[h.seq & (c_.targets.size() - 1)], t_.now_);
  }
  void OnChannelDown_st(const absl::Status&) override {
    if (!c_.tearing_down) t_.failed_.push_back(&c_);
  }

 private:
  VerbsTransport& t_;
  Conn& c_;
};

VerbsTransport::VerbsTransport(const TransportOptions& options, const VerbsOptions& verbs,
                               TransportHandler* handler)
    : options_(options), verbs_(verbs), handler_(handler), regions_(options.max_regions) {}

VerbsTransport::~VerbsTransport() {
  for (auto& [handle, c] : conns_) c->tearing_down = true;
  conns_.clear();  // queue pairs and their memory before the device
  graveyard_.clear();
  cache_.reset();  // registrations before the device
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

absl::StatusOr<std::unique_ptr<VerbsTransport>> VerbsTransport::Create(
    const TransportOptions& options, const VerbsOptions& verbs, TransportHandler* handler) {
  if (absl::Status s = verbs.limits.Validate(); !s.ok()) return s;
  std::unique_ptr<VerbsTransport> t(new VerbsTransport(options, verbs, handler));
  auto device = IbvDevice::Open(verbs.device, verbs.port, verbs.gid_index);
  if (!device.ok()) return device.status();
  t->device_ = std::move(*device);
  const IbvDevice* dev = t->device_.get();
  t->cache_ = std::make_unique<RegistrationCache>(
      [dev](void* base, uint64_t bytes) -> absl::StatusOr<std::unique_ptr<MemoryRegistration>> {
        auto mr = dev->Register(base, bytes, /*remote_write=*/true);
        if (!mr.ok()) return mr.status();
        return std::unique_ptr<MemoryRegistration>(std::move(*mr));
      });
  auto tcp = tcp::TcpTransport::Create(options, t.get());
  if (!tcp.ok()) return tcp.status();
  t->tcp_ = std::move(*tcp);
  t->setup_.assign(size_t{options.max_connections} * 2, VerbsHello{});
  auto setup = t->tcp_->RegisterRegion_st(t->setup_.data(), t->setup_.size() * sizeof(VerbsHello));
  if (!setup.ok()) return setup.status();
  t->setup_region_ = *setup;
  for (uint32_t i = options.max_connections; i > 0; --i) t->free_setup_slots_.push_back(i - 1);
  t->region_keys_.resize(options.max_regions);
  t->peer_slots_ = std::make_unique<PeerSlot[]>(options.max_connections);
  t->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (t->epoll_fd_ < 0) return absl::InternalError("epoll_create1 failed");
  for (int fd : {t->tcp_->capabilities().wait_fd, t->device_->completion_fd()}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(t->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl: ", std::strerror(errno)));
    }
  }
  if (absl::Status s = t->device_->ArmCompletionEvent(); !s.ok()) return s;
  return t;
}

TransportCapabilities VerbsTransport::capabilities() const {
  TransportCapabilities c;
  c.hands_over_pieces = false;
  c.wait_fd = epoll_fd_;
  c.device_memory = true;
  return c;
}

absl::Status VerbsTransport::RemoveJob_st(uint64_t job_id) { return tcp_->RemoveJob_st(job_id); }

absl::StatusOr<PeerHandle> VerbsTransport::Connect_st(const JobCredentials& job,
                                                      std::string_view address, TimeNs now) {
  if (free_setup_slots_.empty()) return absl::ResourceExhaustedError("no connection slot");
  absl::StatusOr<PeerHandle> h = tcp_->Connect_st(job, address, now);
  if (!h.ok()) return h;
  auto c = std::make_unique<Conn>();
  c->handle = *h;
  c->outbound = true;
  c->local_rank = job.local_rank;
  c->job_id = job.job_id;
  c->setup_slot = free_setup_slots_.back();
  free_setup_slots_.pop_back();
  conns_[*h] = std::move(c);
  return h;
}

void VerbsTransport::Disconnect_st(PeerHandle peer, TimeNs now) {
  now_ = now;
  tcp_->Disconnect_st(peer, now);  // reports the peer down to us synchronously
}

absl::StatusOr<RegionId> VerbsTransport::RegisterRegion_st(void* base, uint64_t bytes) {
  absl::StatusOr<RegionId> id = regions_.Register(base, bytes);
  if (!id.ok()) return id;
  RegionMemory m{base, bytes, RegionKeys{}, false};
  if (bytes > 0) {
    // A client arena was pinned by the session server (a lookup here); daemon-owned buffers
    // (shard slab, ring staging, fusion buckets) are registered now, on this thread: they are
    // sized by the job's plan, made when its first post activates it on this thread
    // (daemon/job_runtime.cc says why they are not moved).
    absl::StatusOr<RegionKeys> keys = cache_->Acquire(base, bytes);
    if (!keys.ok()) {
      (void)regions_.Unregister(*id);
      return keys.status();
    }
    m.keys = *keys;
    m.registered = true;
  }
  region_keys_[*id] = std::move(m);
  return id;
}

absl::Status VerbsTransport::UnregisterRegion_st(RegionId region) {
  if (absl::Status s = regions_.Unregister(region); !s.ok()) return s;
  RegionMemory& m = region_keys_[region];
  // The engine unregisters a region only once no send from it is pending and its job's queue
  // pairs are torn down, so no posted work request names these keys any more.
  if (m.registered) (void)cache_->Release(m.base, m.bytes);
  m = RegionMemory{};  // a device region's registration goes with it
  return absl::OkStatus();
}

absl::StatusOr<RegionId> VerbsTransport::RegisterDeviceRegion_st(int dmabuf_fd, uint64_t bytes,
                                                                 uint64_t iova) {
  if (bytes == 0 || iova == 0) return absl::InvalidArgumentError("an empty or unplaced dma-buf");
  absl::StatusOr<std::unique_ptr<IbvMemory>> mr = device_->RegisterDmabuf(dmabuf_fd, bytes, iova);
  if (!mr.ok()) return mr.status();
  // The table only bounds-checks and adds offsets: the "pointer" is the NIC's address, the iova.
  absl::StatusOr<RegionId> id = regions_.Register(reinterpret_cast<void*>(iova), bytes);
  if (!id.ok()) return id;
  RegionMemory& m = region_keys_[*id];
  m = RegionMemory{reinterpret_cast<void*>(iova), bytes, RegionKeys{(*mr)->lkey(), (*mr)->rkey()},
                   false, std::move(*mr)};
  return id;
}

absl::Status VerbsTransport::PostSend_st(PeerHandle peer, const SendSpec& spec) {
  auto it = conns_.find(peer);
  if (it == conns_.end() || !it->second->outbound) {
    return absl::NotFoundError("peer handle is not connected");
  }
  Conn& c = *it->second;
  absl::StatusOr<const uint8_t*> payload = regions_.ResolveSend(spec, options_.max_segment_bytes);
  if (!payload.ok()) return payload.status();
  if (c.sender == nullptr) {  // the queue pair is still being set up
    if (c.early.size() >= options_.max_pending_sends_per_peer) {
      return absl::ResourceExhaustedError("peer send queue full");
    }
    c.early.push_back(spec);
    return absl::OkStatus();
  }
  if (c.sender->failed()) return absl::NotFoundError("peer handle is not connected");
  const RegionMemory& m = region_keys_[spec.region];
  OutgoingSegment s;
  s.header = MakeDataHeader(c.job_id, c.local_rank, spec);
  s.payload_addr = reinterpret_cast<uint64_t>(*payload);
  s.payload_lkey = m.registered || m.device_mr != nullptr ? m.keys.lkey : 0;
  const uint64_t slot = c.send_index & (c.sends.size() - 1);
  s.cookie = slot;
  if (absl::Status st = c.sender->Post(s); !st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      return absl::ResourceExhaustedError("peer send queue full");
    }
    return st;
  }
  // Filled after Post accepted it: Post may complete earlier sends synchronously, never this one.
  c.sends[slot] =
      SendCompletion{peer, spec.cookie, spec.key, spec.iteration, spec.offset, spec.length};
  ++c.send_index;
  return absl::OkStatus();
}

void VerbsTransport::OnPeerUp_st(const PeerInfo& peer) {
  auto it = conns_.find(peer.handle);
  if (it == conns_.end()) {  // an inbound connection: it waits for the dialer's VerbsHello
    if (free_setup_slots_.empty()) {
      tcp_->Disconnect_st(peer.handle, now_);
      return;
    }
    auto c = std::make_unique<Conn>();
    c->handle = peer.handle;
    c->setup_slot = free_setup_slots_.back();
    free_setup_slots_.pop_back();
    it = conns_.emplace(peer.handle, std::move(c)).first;
  }
  Conn& c = *it->second;
  c.info = peer;
  if (!c.outbound) return;
  if (absl::Status s = StartSender_st(c); !s.ok()) {
    failed_.push_back(&c);
    return;
  }
  if (absl::Status s = SendSetup_st(c); !s.ok()) failed_.push_back(&c);
}

absl::Status VerbsTransport::StartSender_st(Conn& c) {
  const ChannelLimits& l = verbs_.limits;
  auto qp = device_->CreateQueuePair(l.send_queue_depth, 1);
  if (!qp.ok()) return qp.status();
  c.qp = std::move(*qp);
  c.reply_region.assign(ReplyRegionBytes(l.reply_entries), 0);
  c.headers.assign(size_t{l.reply_entries} * kFrameHeaderBytes, 0);
  auto reply = device_->Register(c.reply_region.data(), c.reply_region.size(), true);
  if (!reply.ok()) return reply.status();
  c.reply_mr = std::move(*reply);
  auto headers = device_->Register(c.headers.data(), c.headers.size(), false);
  if (!headers.ok()) return headers.status();
  c.headers_mr = std::move(*headers);
  c.sends.assign(l.reply_entries, SendCompletion{});
  VerbsHello& out = setup_[size_t{c.setup_slot} * 2];
  out = c.qp->LocalHello();
  out.reply_addr = reinterpret_cast<uint64_t>(c.reply_region.data());
  out.reply_rkey = c.reply_mr->rkey();
  out.reply_entries = l.reply_entries;
  by_qp_[c.qp->qp_num()] = &c;
  return absl::OkStatus();
}

absl::Status VerbsTransport::StartReceiver_st(Conn& c) {
  const VerbsHello& peer = setup_[size_t{c.setup_slot} * 2 + 1];
  if (peer.reply_entries == 0 || !std::has_single_bit(peer.reply_entries) ||
      peer.reply_entries > (1u << 16) || peer.reply_addr == 0) {
    return absl::InvalidArgumentError("verbs hello: bad reply ring");
  }
  ChannelLimits l = verbs_.limits;
  l.reply_entries = peer.reply_entries;
  auto qp = device_->CreateQueuePair(l.send_queue_depth, l.recv_slots);
  if (!qp.ok()) return qp.status();
  c.qp = std::move(*qp);
  if (absl::Status s = c.qp->Connect(peer); !s.ok()) return s;
  c.slots.assign(size_t{l.recv_slots} * l.slot_bytes, 0);
  c.staging.assign(size_t{l.send_queue_depth} * kReplyEntryBytes, 0);
  auto slots = device_->Register(c.slots.data(), c.slots.size(), false);
  if (!slots.ok()) return slots.status();
  c.slots_mr = std::move(*slots);
  auto staging = device_->Register(c.staging.data(), c.staging.size(), false);
  if (!staging.ok()) return staging.status();
  c.staging_mr = std::move(*staging);
  c.targets.assign(l.reply_entries, RecvTarget{});
  c.receiver_sink = std::make_unique<ReceiverSink>(*this, c);
  c.receiver = std::make_unique<VerbsReceiver>(
      *c.qp, l,
      ReceiverMemory{c.slots.data(), c.slots_mr->lkey(), c.staging.data(), c.staging_mr->lkey(),
                     peer.reply_addr, peer.reply_rkey},
      *c.receiver_sink, &counters_, ClaimPeerCounters_st(c));
  by_qp_[c.qp->qp_num()] = &c;
  VerbsHello& out = setup_[size_t{c.setup_slot} * 2];
  out = c.qp->LocalHello();
  out.recv_slots = static_cast<uint16_t>(l.recv_slots);
  out.slot_bytes = l.slot_bytes;
  // Receives are posted before the dialer learns our queue pair: nothing it sends can find none.
  // Writes (the first credit word) wait until the dialer's queue pair can take them: it moves
  // to ready-to-receive only when our answer reaches it, and what arrives before is dropped.
  // RC retries a dropped write for retry_cnt × timeout (about 0.5 s) and then fails the
  // connection, so an engine thread that takes longer to get there (a loaded host) must not be
  // written to yet. OnSendAcked_st releases them.
  return c.receiver->Start_st(/*hold_writes=*/true);
}

void VerbsTransport::OnSendAcked_st(const SendCompletion& send, TimeNs now) {
  now_ = now;
  auto it = conns_.find(send.peer);
  if (it == conns_.end() || send.key != kVerbsSetupKey) return;
  Conn& c = *it->second;
  // The acceptor's answer acknowledged: the dialer acknowledges a frame only after handling it
  // (OnRecvDone_st), and handling it moved its queue pair to ready-to-send.
  if (!c.outbound && c.receiver != nullptr) c.receiver->PeerReady_st();
}

void VerbsTransport::OnSendFailed_st(const SendCompletion& send, const absl::Status&) {
  auto it = conns_.find(send.peer);
  if (it == conns_.end() || send.key != kVerbsSetupKey) return;
  // The peer refused our set-up frame (it was not waiting for one) or the TCP connection is
  // going down (its peer-down follows and tears the connection down first). Either way no
  // queue pair will come up on it: close it rather than leave its sends waiting.
  Conn& c = *it->second;
  if (!c.tearing_down) failed_.push_back(&c);
}

absl::Status VerbsTransport::SendSetup_st(Conn& c) {
  SendSpec spec;
  spec.key = kVerbsSetupKey;
  spec.length = sizeof(VerbsHello);
  spec.dtype = sched::DType::kF32;
  spec.region = setup_region_;
  spec.region_offset = uint64_t{c.setup_slot} * 2 * sizeof(VerbsHello);
  return tcp_->PostSend_st(c.handle, spec);
}

RecvTarget VerbsTransport::ResolveRecv_st(const PeerInfo& peer, const FrameHeader& header) {
  auto it = conns_.find(peer.handle);
  if (it == conns_.end() || header.key != kVerbsSetupKey || header.length != sizeof(VerbsHello)) {
    return RecvTarget::Reject();  // data never travels over the TCP connection
  }
  const Conn& c = *it->second;
  const bool awaited = c.outbound ? (c.qp != nullptr && c.sender == nullptr) : c.qp == nullptr;
  if (!awaited) return RecvTarget::Reject();
  return RecvTarget::Into(setup_region_, (uint64_t{c.setup_slot} * 2 + 1) * sizeof(VerbsHello));
}

void VerbsTransport::OnRecvDone_st(const PeerInfo& peer, const FrameHeader&, const RecvTarget&,
                                   TimeNs now) {
  now_ = now;
  auto it = conns_.find(peer.handle);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (!c.outbound) {
    absl::Status s = StartReceiver_st(c);
    if (s.ok()) s = SendSetup_st(c);
    if (!s.ok()) {
      failed_.push_back(&c);
      return;
    }
    c.up_reported = true;
    handler_->OnPeerUp_st(c.info);
    return;
  }
  const VerbsHello& hello = setup_[size_t{c.setup_slot} * 2 + 1];
  ChannelLimits l = verbs_.limits;
  l.recv_slots = hello.recv_slots;
  l.slot_bytes = hello.slot_bytes;
  absl::Status s = l.Validate();
  if (s.ok()) s = c.qp->Connect(hello);
  if (!s.ok()) {
    failed_.push_back(&c);
    return;
  }
  c.sender_sink = std::make_unique<SenderSink>(*this, c);
  c.sender = std::make_unique<VerbsSender>(
      *c.qp, l, SenderMemory{c.reply_region.data(), c.headers.data(), c.headers_mr->lkey()},
      *c.sender_sink, &counters_, ClaimPeerCounters_st(c));
  // Sends posted during the set-up go first, in their order, then the engine hears the peer
  // is up (and may post more behind them).
  std::vector<SendSpec> early;
  early.swap(c.early);
  const PeerHandle handle = c.handle;
  for (const SendSpec& spec : early) {
    if (absl::Status st = PostSend_st(handle, spec); !st.ok()) {
      handler_->OnSendFailed_st(SendCompletion{handle, spec.cookie, spec.key, spec.iteration,
                                               spec.offset, spec.length},
                                st);
    }
  }
  auto again = conns_.find(handle);
  if (again == conns_.end()) return;
  again->second->up_reported = true;
  handler_->OnPeerUp_st(again->second->info);
}

void VerbsTransport::OnPeerDown_st(const PeerInfo& peer, const absl::Status& why) {
  auto it = conns_.find(peer.handle);
  if (it == conns_.end()) {
    handler_->OnPeerDown_st(peer, why);
    return;
  }
  std::unique_ptr<Conn> c = std::move(it->second);
  conns_.erase(it);
  Teardown_st(*c, why);
  const bool report = c->outbound || c->up_reported;
  const PeerInfo info = c->up_reported ? c->info : peer;
  // Freed at the end of Progress_st: this may run inside one of the connection's own channel
  // callbacks (the engine disconnecting a peer from OnSendFailed_st, say).
  graveyard_.push_back(std::move(c));
  if (report) handler_->OnPeerDown_st(info, why);
}

void VerbsTransport::Teardown_st(Conn& c, const absl::Status& why) {
  c.tearing_down = true;
  for (size_t i = 0; i < failed_.size();) {
    if (failed_[i] == &c) {
      failed_.erase(failed_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (c.sender != nullptr) c.sender->Abort_st(why);
  for (const SendSpec& spec : c.early) {
    handler_->OnSendFailed_st(SendCompletion{c.handle, spec.cookie, spec.key, spec.iteration,
                                             spec.offset, spec.length},
                              why);
  }
  c.early.clear();
  if (c.receiver != nullptr) c.receiver->Abort_st(why);
  if (c.qp != nullptr) by_qp_.erase(c.qp->qp_num());
  free_setup_slots_.push_back(c.setup_slot);
}

void VerbsTransport::PollCompletions_st() {
  RoutedCompletion wc[64];
  for (;;) {
    absl::StatusOr<size_t> n = device_->Poll(wc);
    if (!n.ok() || *n == 0) return;
    for (size_t i = 0; i < *n; ++i) {
      auto it = by_qp_.find(wc[i].qp_num);
      if (it == by_qp_.end()) {  // a queue pair already torn down (its flushes)
        CountCompletion(counters_, wc[i].completion);
        continue;
      }
      Conn& c = *it->second;
      if (c.sender != nullptr) {
        c.sender->OnCompletion_st(wc[i].completion);  // counts it
      } else if (c.receiver != nullptr) {
        c.receiver->OnCompletion_st(wc[i].completion);
      } else {
        CountCompletion(counters_, wc[i].completion);
      }
    }
  }
}

int VerbsTransport::Progress_st(TimeNs now, int wait_ms) {
  now_ = now;
  if (wait_ms > 0 && !HasDeferredWork_st()) {
    epoll_event ev[4];
    (void)epoll_wait(epoll_fd_, ev, 4, wait_ms);
  }
  int handled = tcp_->Progress_st(now, 0);
  // Completions, then re-arm and look once more, so one that raced the arming is not missed
  // until the next event.
  PollCompletions_st();
  device_->AckCompletionEvents();
  (void)device_->ArmCompletionEvent();
  PollCompletions_st();
  // The engine's callbacks may disconnect peers (erasing connections) while this runs: walk a
  // snapshot of the handles and look each up again.
  round_.clear();
  for (const auto& [handle, c] : conns_) round_.push_back(handle);
  for (PeerHandle handle : round_) {
    auto it = conns_.find(handle);
    if (it == conns_.end()) continue;
    if (it->second->receiver != nullptr) handled += it->second->receiver->Flush_st();
    it = conns_.find(handle);
    if (it == conns_.end()) continue;
    if (it->second->sender != nullptr) {
      handled += it->second->sender->Progress_st();
      CheckLiveness_st(*it->second, now);
    }
  }
  while (!failed_.empty()) {
    Conn* c = failed_.back();
    failed_.pop_back();
    tcp_->Disconnect_st(c->handle, now);  // tears it down through OnPeerDown_st
  }
  // A torn-down connection's figures stay readable for the round it went down in (the engine's
  // peer-down handling), then go with it, as the TCP connection's do once its slot is released.
  for (const std::unique_ptr<Conn>& c : graveyard_) {
    PeerSlot& slot = peer_slots_[HandleIndex(c->handle)];
    if (slot.handle.load(std::memory_order_relaxed) == c->handle) {
      slot.handle.store(kNoPeer, std::memory_order_relaxed);
    }
  }
  graveyard_.clear();
  return handled;
}

void VerbsTransport::CheckLiveness_st(Conn& c, TimeNs now) {
  VerbsSender& sender = *c.sender;
  if (!sender.AwaitingPeer() || sender.WriteOutstanding() ||
      sender.progress_mark() != c.progress_mark || c.last_progress == 0) {
    c.progress_mark = sender.progress_mark();
    c.last_progress = now;
    return;
  }
  if (now - c.last_progress <= options_.peer_timeout) return;
  peer_timeouts_.Add_st(1);
  // Fails the pending sends in order with this reason; the channel's going down (SenderSink)
  // then queues the TCP connection's closing (failed_), which reports the peer down.
  sender.Abort_st(absl::DeadlineExceededError(absl::StrFormat(
      "peer rank %d made no progress for %d ms with %d sends pending (verbs: no reply and no "
      "completion)",
      c.info.rank, options_.peer_timeout / sched::kMillisecond, sender.pending())));
}

bool VerbsTransport::HasDeferredWork_st() const {
  if (tcp_->HasDeferredWork_st() || !failed_.empty()) return true;
  for (const auto& [handle, c] : conns_) {
    if (c->sender != nullptr && c->sender->AwaitingPeer()) return true;
  }
  return false;
}

}  // namespace gradlane::transport::verbs

namespace gradlane::transport::verbs {

VerbsStats VerbsTransport::VerbsStatsNow() const {
  VerbsStats v;
  counters_.SnapshotInto(v);
  device_->registrations().SnapshotInto(v);
  return v;
}

namespace {
void AddPeerStats(PeerStats& to, const PeerStats& more) {
  for (const CounterInfo<PeerStats>& c : kPeerCounters) to.*c.field += more.*c.field;
}
}  // namespace

PeerCounters* VerbsTransport::ClaimPeerCounters_st(const Conn& c) {
  // The handle is the TCP transport's, whose slots number max_connections. A slot's previous
  // connection counts nothing more: its channels were aborted when it was torn down, before the
  // TCP transport could hand its slot to another connection.
  PeerSlot& slot = peer_slots_[HandleIndex(c.handle)];
  slot.handle.store(kNoPeer, std::memory_order_relaxed);
  slot.counters.Reset_st();
  slot.handle.store(c.handle, std::memory_order_release);
  return &slot.counters;
}

PeerStats VerbsTransport::PeerStatsOf(PeerHandle peer) const {
  PeerStats s = tcp_->PeerStatsOf(peer);
  if (peer == kNoPeer || HandleIndex(peer) >= options_.max_connections) return s;
  const PeerSlot& slot = peer_slots_[HandleIndex(peer)];
  // A slot reset for a new connection between the check and the reads yields its fresh
  // counters, as the TCP transport's own slots do.
  if (slot.handle.load(std::memory_order_acquire) != peer) return s;
  AddPeerStats(s, slot.counters.Snapshot());
  return s;
}

TransportStats VerbsTransport::Stats() const {
  TransportStats s = tcp_->Stats();
  // The segments themselves never touch the TCP connections: their bytes and frames are the
  // channels'. A rendezvous segment's frame is its header; its acknowledgement the write's own
  // completion. acks_sent stays the TCP connections' (a receiver writes no ack for a rendezvous
  // segment).
  VerbsStats v;
  counters_.SnapshotInto(v);
  AddPeerStats(s.total, DataPathPeerStats(v));
  s.peer_timeouts += peer_timeouts_.Get();
  return s;
}

BackendDescription VerbsTransport::DescribeBackend() const {
  BackendDescription d;
  d.backend = std::string(backend_name());
  d.info = {{"device", device_->name()},
            {"port", absl::StrCat(device_->port())},
            {"gid_index", absl::StrCat(device_->gid_index())}};
  AppendVerbsCounters(VerbsStatsNow(), d.counters);
  AppendPortCounters(kSysfsInfiniband, device_->name(), device_->port(), d.counters);
  return d;
}

}  // namespace gradlane::transport::verbs
