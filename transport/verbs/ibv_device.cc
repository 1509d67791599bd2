#include "transport/verbs/ibv_device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace gradlane::transport::verbs {
namespace {

absl::Status Errno(int err, std::string_view what) {
  return absl::UnavailableError(
      absl::StrCat(absl::string_view(what.data(), what.size()), ": ", std::strerror(err)));
}

CompletionStatus StatusOf(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return CompletionStatus::kSuccess;
    case IBV_WC_WR_FLUSH_ERR:
      return CompletionStatus::kFlushed;
    case IBV_WC_REM_ACCESS_ERR:
      return CompletionStatus::kRemoteAccessError;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return CompletionStatus::kReceiverNotReady;
    case IBV_WC_RETRY_EXC_ERR:
      return CompletionStatus::kRetryExceeded;
    default:
      return CompletionStatus::kLocalError;
  }
}

}  // namespace

IbvMemory::~IbvMemory() {
  counters_.registrations.Sub(1);
  counters_.registered_bytes.Sub(mr_->length);
  ibv_dereg_mr(mr_);
}

IbvQueuePair::~IbvQueuePair() { ibv_destroy_qp(qp_); }

absl::Status IbvQueuePair::PostSend(const SendWork& work) {
  ibv_sge sge[2];
  for (int i = 0; i < work.num_sge; ++i) {
    sge[i] = {work.sge[i].addr, work.sge[i].length, work.sge[i].lkey};
  }
  ibv_send_wr wr{};
  wr.wr_id = work.wr_id;
  wr.sg_list = sge;
  wr.num_sge = work.num_sge;
  wr.send_flags = work.signaled ? IBV_SEND_SIGNALED : 0;
  switch (work.op) {
    case WorkOp::kSend:
      wr.opcode = IBV_WR_SEND;
      break;
    case WorkOp::kWrite:
      wr.opcode = IBV_WR_RDMA_WRITE;
      break;
    case WorkOp::kWriteWithImm:
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(work.imm);
      break;
  }
  wr.wr.rdma.remote_addr = work.remote_addr;
  wr.wr.rdma.rkey = work.rkey;
  ibv_send_wr* bad = nullptr;
  if (int err = ibv_post_send(qp_, &wr, &bad); err != 0) return Errno(err, "ibv_post_send");
  return absl::OkStatus();
}

absl::Status IbvQueuePair::PostRecv(const RecvWork& work) {
  ibv_sge sge{work.sge.addr, work.sge.length, work.sge.lkey};
  ibv_recv_wr wr{};
  wr.wr_id = work.wr_id;
  wr.sg_list = work.sge.length > 0 ? &sge : nullptr;
  wr.num_sge = work.sge.length > 0 ? 1 : 0;
  ibv_recv_wr* bad = nullptr;
  if (int err = ibv_post_recv(qp_, &wr, &bad); err != 0) return Errno(err, "ibv_post_recv");
  return absl::OkStatus();
}

VerbsHello IbvQueuePair::LocalHello() const {
  VerbsHello h{};
  h.qp_num = qp_->qp_num;
  h.psn = psn_;
  std::memcpy(h.gid, device_.gid().raw, sizeof(h.gid));
  h.gid_index = static_cast<uint8_t>(device_.gid_index());
  h.mtu = static_cast<uint8_t>(device_.active_mtu());
  return h;
}

absl::Status IbvQueuePair::Connect(const VerbsHello& peer) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = device_.port();
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int err = ibv_modify_qp(qp_, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      err != 0) {
    return Errno(err, "queue pair to INIT");
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(peer.mtu, device_.active_mtu()));
  a.dest_qp_num = peer.qp_num;
  a.rq_psn = peer.psn & 0xFFFFFF;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, sizeof(peer.gid));
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_.gid_index());
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = device_.port();
  if (int err = ibv_modify_qp(qp_, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      err != 0) {
    return Errno(err, "queue pair to RTR");
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;  // 4.096 µs · 2^14 ≈ 67 ms per try
  a.retry_cnt = 7;
  // No RNR retry: the protocol's credits are the posted receives, so an RNR is a bug to report,
  // not a condition to wait out.
  a.rnr_retry = 0;
  a.sq_psn = psn_;
  a.max_rd_atomic = 1;
  if (int err = ibv_modify_qp(qp_, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      err != 0) {
    return Errno(err, "queue pair to RTS");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IbvDevice>> IbvDevice::Open(std::string_view name, uint8_t port,
                                                           int gid_index, int cq_depth) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return absl::NotFoundError(
        "no RDMA device (for soft-RoCE on this host: modprobe rdma_rxe; rdma link add rxe0 type "
        "rxe netdev <interface>)");
  }
  ibv_device* chosen = nullptr;
  for (int i = 0; i < count; ++i) {
    if (name.empty() || name == ibv_get_device_name(list[i])) {
      chosen = list[i];
      break;
    }
  }
  if (chosen == nullptr) {
    ibv_free_device_list(list);
    return absl::NotFoundError(
        absl::StrCat("no RDMA device named ", absl::string_view(name.data(), name.size())));
  }
  std::unique_ptr<IbvDevice> d(new IbvDevice());
  d->context_ = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (d->context_ == nullptr) return Errno(errno, "ibv_open_device");
  d->port_ = port;
  d->gid_index_ = gid_index;
  ibv_port_attr pa{};
  if (int err = ibv_query_port(d->context_, port, &pa); err != 0) {
    return Errno(err, "ibv_query_port");
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    return absl::FailedPreconditionError(absl::StrCat("RDMA port ", port, " is not active"));
  }
  d->active_mtu_ = pa.active_mtu;
  if (int err = ibv_query_gid(d->context_, port, gid_index, &d->gid_); err != 0) {
    return Errno(err, absl::StrCat("ibv_query_gid index ", gid_index));
  }
  d->pd_ = ibv_alloc_pd(d->context_);
  if (d->pd_ == nullptr) return Errno(errno, "ibv_alloc_pd");
  d->channel_ = ibv_create_comp_channel(d->context_);
  if (d->channel_ == nullptr) return Errno(errno, "ibv_create_comp_channel");
  const int flags = fcntl(d->channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(d->channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Errno(errno, "completion channel O_NONBLOCK");
  }
  // Every queue pair's completions share this queue: size it for many peers, within what the
  // device allows (an overflow would put the queue, and every connection, in error).
  ibv_device_attr da{};
  if (int err = ibv_query_device(d->context_, &da); err != 0) {
    return Errno(err, "ibv_query_device");
  }
  d->cq_ = ibv_create_cq(d->context_, std::min(cq_depth, da.max_cqe), nullptr, d->channel_, 0);
  if (d->cq_ == nullptr) return Errno(errno, "ibv_create_cq");
  return d;
}

IbvDevice::~IbvDevice() {
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (context_ != nullptr) ibv_close_device(context_);
}

std::string IbvDevice::name() const { return ibv_get_device_name(context_->device); }

absl::StatusOr<std::unique_ptr<IbvMemory>> IbvDevice::Register(void* base, uint64_t bytes,
                                                               bool remote_write) const {
  const int access = IBV_ACCESS_LOCAL_WRITE | (remote_write ? IBV_ACCESS_REMOTE_WRITE : 0);
  ibv_mr* mr = ibv_reg_mr(pd_, base, bytes, access);
  if (mr == nullptr) {
    const int err = errno;
    registrations_.registration_failures.Add(1);
    rlimit limit{};
    const bool have_limit = ::getrlimit(RLIMIT_MEMLOCK, &limit) == 0;
    std::optional<uint64_t> memlock;
    if (have_limit && limit.rlim_cur != RLIM_INFINITY) memlock = limit.rlim_cur;
    return absl::UnavailableError(RegistrationErrorText(bytes, err, memlock));
  }
  registrations_.registrations.Add(1);
  registrations_.registered_bytes.Add(mr->length);
  return std::unique_ptr<IbvMemory>(new IbvMemory(mr, registrations_));
}

absl::StatusOr<std::unique_ptr<IbvMemory>> IbvDevice::RegisterDmabuf(int fd, uint64_t bytes,
                                                                     uint64_t iova) const {
  // Remote write: pulled results are written straight into it by the shard's NIC.
  ibv_mr* mr =
      ibv_reg_dmabuf_mr(pd_, 0, bytes, iova, fd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr == nullptr) {
    const int err = errno;
    registrations_.registration_failures.Add(1);
    return absl::UnavailableError(absl::StrCat("registering ", bytes,
                                               " bytes of GPU memory (dma-buf) with ", name(), ": ",
                                               std::strerror(err)));
  }
  registrations_.registrations.Add(1);
  registrations_.registered_bytes.Add(mr->length);
  return std::unique_ptr<IbvMemory>(new IbvMemory(mr, registrations_));
}

absl::StatusOr<std::unique_ptr<IbvQueuePair>> IbvDevice::CreateQueuePair(uint32_t send_depth,
                                                                         uint32_t recv_depth) {
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.cap.max_send_wr = send_depth;
  init.cap.max_recv_wr = recv_depth;
  init.cap.max_send_sge = 2;
  init.cap.max_recv_sge = 1;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  ibv_qp* qp = ibv_create_qp(pd_, &init);
  if (qp == nullptr) return Errno(errno, "ibv_create_qp");
  std::random_device rd;
  const uint32_t psn = rd() & 0xFFFFFF;
  return std::unique_ptr<IbvQueuePair>(new IbvQueuePair(qp, *this, psn));
}

absl::StatusOr<size_t> IbvDevice::Poll(std::span<RoutedCompletion> out) {
  ibv_wc wc[32];
  size_t got = 0;
  while (got < out.size()) {
    const int want = static_cast<int>(std::min<size_t>(32, out.size() - got));
    const int n = ibv_poll_cq(cq_, want, wc);
    if (n < 0) return absl::UnavailableError("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      RoutedCompletion& r = out[got++];
      r.qp_num = wc[i].qp_num;
      Completion& c = r.completion;
      c = Completion{};
      c.wr_id = wc[i].wr_id;
      c.status = StatusOf(wc[i].status);
      // An error completion's opcode is undefined; the channels fail on the status alone.
      if (c.status == CompletionStatus::kSuccess) {
        if (wc[i].opcode == IBV_WC_RECV) {
          c.kind = CompletionKind::kRecv;
        } else if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
          c.kind = CompletionKind::kRecvWithImm;
        }
        c.byte_len = wc[i].byte_len;
        if (wc[i].wc_flags & IBV_WC_WITH_IMM) c.imm = ntohl(wc[i].imm_data);
      }
    }
    if (n < want) break;
  }
  return got;
}

int IbvDevice::completion_fd() const { return channel_->fd; }

absl::Status IbvDevice::ArmCompletionEvent() {
  if (int err = ibv_req_notify_cq(cq_, 0); err != 0) return Errno(err, "ibv_req_notify_cq");
  return absl::OkStatus();
}

void IbvDevice::AckCompletionEvents() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  unsigned events = 0;
  while (ibv_get_cq_event(channel_, &cq, &context) == 0) ++events;
  if (events > 0) ibv_ack_cq_events(cq_, events);
}

}  // namespace gradlane::transport::verbs
