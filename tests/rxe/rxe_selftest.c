// tests/rxe/rxe_selftest.c — checks, on a real verbs device (soft-RoCE in the rxe-guest.sh
// guest), what a verbs transport over shared memory relies on: ibv_reg_mr on a memfd mapping,
// and an RDMA WRITE_WITH_IMM between two RC QPs of the same device (connected to each other
// over RoCEv2) landing in that memory with its immediate value.
//
//   rxe_selftest [DEVICE [GID_INDEX]]    default: the first device, GID index 1
//                                        (::ffff:127.0.0.1 on rxe over lo)
//   tests/rxe/rxe-guest.sh --selftest    builds this with gcc and runs it in the guest
//
// Prints each step; exits 0 only if every byte arrived (read back through a second mapping of
// the memfd too) and the immediate matched. Build: gcc -O2 -o rxe_selftest rxe_selftest.c -libverbs
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define REGION (1u << 20)  // the memfd: first half source, second half destination
#define HALF (REGION / 2)
#define IMM 0xC0FFEE42u

static int failures;
#define CHECK(cond, ...) \
  do { \
    if (cond) { \
      printf("ok    " __VA_ARGS__); \
    } else { \
      printf("FAIL  " __VA_ARGS__); \
      failures++; \
    } \
    printf("\n"); \
  } while (0)
#define DIE(...) \
  do { \
    printf("FAIL  " __VA_ARGS__); \
    printf(" (errno %d: %s)\n", errno, strerror(errno)); \
    exit(1); \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// One completion from cq, or exit after 10 s.
static struct ibv_wc poll_one(struct ibv_cq* cq, const char* what) {
  struct ibv_wc wc;
  double deadline = now() + 10;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) DIE("ibv_poll_cq (%s)", what);
    if (n == 1) return wc;
    if (now() > deadline) {
      errno = ETIMEDOUT;
      DIE("no %s completion within 10 s", what);
    }
  }
}

static void connect_qp(struct ibv_qp* qp, uint32_t remote_qpn, uint8_t port, int gid_index,
                       const union ibv_gid* gid, enum ibv_mtu mtu) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    DIE("QP %u -> INIT", qp->qp_num);

  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = remote_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;  // RoCE: addressed by GID
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = port;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    DIE("QP %u -> RTR", qp->qp_num);

  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    DIE("QP %u -> RTS", qp->qp_num);
}

int main(int argc, char** argv) {
  const char* want = argc > 1 ? argv[1] : NULL;
  int gid_index = argc > 2 ? atoi(argv[2]) : 1;
  const uint8_t port = 1;
  setvbuf(stdout, NULL, _IOLBF, 0);

  int ndev = 0;
  struct ibv_device** devs = ibv_get_device_list(&ndev);
  if (!devs || ndev == 0) DIE("ibv_get_device_list: no verbs device (provider missing?)");
  struct ibv_device* dev = NULL;
  for (int i = 0; i < ndev && !dev; i++)
    if (!want || strcmp(ibv_get_device_name(devs[i]), want) == 0) dev = devs[i];
  if (!dev) DIE("no device named %s", want);
  struct ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) DIE("ibv_open_device %s", ibv_get_device_name(dev));
  printf("ok    opened %s (%d device(s))\n", ibv_get_device_name(dev), ndev);

  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, port, &pa)) DIE("ibv_query_port");
  union ibv_gid gid;
  if (ibv_query_gid(ctx, port, gid_index, &gid)) DIE("ibv_query_gid %d", gid_index);
  char gs[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, gid.raw, gs, sizeof gs);
  printf("ok    port %u %s, active MTU %d, GID[%d] %s\n", port,
         pa.state == IBV_PORT_ACTIVE ? "active" : "NOT active", 128 << pa.active_mtu, gid_index,
         gs);

  // The memory: a memfd, mapped shared (as memory shared between processes would be).
  int fd = memfd_create("rxe_selftest", MFD_CLOEXEC);
  if (fd < 0) DIE("memfd_create");
  if (ftruncate(fd, REGION)) DIE("ftruncate");
  uint8_t* buf = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  uint8_t* view = mmap(NULL, REGION, PROT_READ, MAP_SHARED, fd, 0);  // a second mapping
  if (buf == MAP_FAILED || view == MAP_FAILED) DIE("mmap memfd");
  for (uint32_t i = 0; i < HALF; i++) buf[i] = (uint8_t)(i * 7 + (i >> 11) + 1);
  memset(buf + HALF, 0, HALF);

  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  if (!pd) DIE("ibv_alloc_pd");
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, REGION, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr != NULL, "ibv_reg_mr on a 1 MiB memfd mapping (lkey 0x%x rkey 0x%x)", mr ? mr->lkey : 0,
        mr ? mr->rkey : 0);
  if (!mr) DIE("ibv_reg_mr");

  struct ibv_cq* scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  struct ibv_cq* rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  if (!scq || !rcq) DIE("ibv_create_cq");
  struct ibv_qp_init_attr qia;
  memset(&qia, 0, sizeof qia);
  qia.qp_type = IBV_QPT_RC;
  qia.cap.max_send_wr = 8;
  qia.cap.max_recv_wr = 8;
  qia.cap.max_send_sge = 1;
  qia.cap.max_recv_sge = 1;
  qia.send_cq = scq;
  qia.recv_cq = rcq;
  struct ibv_qp* a = ibv_create_qp(pd, &qia);
  struct ibv_qp* b = ibv_create_qp(pd, &qia);
  if (!a || !b) DIE("ibv_create_qp");
  connect_qp(a, b->qp_num, port, gid_index, &gid, pa.active_mtu);
  connect_qp(b, a->qp_num, port, gid_index, &gid, pa.active_mtu);
  printf("ok    RC QPs %u <-> %u connected (RTS)\n", a->qp_num, b->qp_num);

  // B: a receive for the immediate (no scatter entries: WRITE_WITH_IMM places no data there).
  struct ibv_recv_wr rwr = {.wr_id = 2, .sg_list = NULL, .num_sge = 0}, *bad_r;
  if (ibv_post_recv(b, &rwr, &bad_r)) DIE("ibv_post_recv");
  // A: write the first half into the second half, with the immediate.
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = HALF, .lkey = mr->lkey};
  struct ibv_send_wr swr, *bad_s;
  memset(&swr, 0, sizeof swr);
  swr.wr_id = 1;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.imm_data = htonl(IMM);
  swr.wr.rdma.remote_addr = (uintptr_t)(buf + HALF);
  swr.wr.rdma.rkey = mr->rkey;
  double t0 = now();
  if (ibv_post_send(a, &swr, &bad_s)) DIE("ibv_post_send");

  struct ibv_wc sw = poll_one(scq, "send");
  CHECK(sw.status == IBV_WC_SUCCESS && sw.opcode == IBV_WC_RDMA_WRITE,
        "send completion: %s, opcode %d", ibv_wc_status_str(sw.status), sw.opcode);
  struct ibv_wc rw = poll_one(rcq, "receive");
  double dt = now() - t0;
  CHECK(rw.status == IBV_WC_SUCCESS && rw.opcode == IBV_WC_RECV_RDMA_WITH_IMM,
        "receive completion: %s, opcode %d (RECV_RDMA_WITH_IMM is %d)",
        ibv_wc_status_str(rw.status), rw.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK((rw.wc_flags & IBV_WC_WITH_IMM) && ntohl(rw.imm_data) == IMM,
        "immediate 0x%08x (expected 0x%08x)", ntohl(rw.imm_data), IMM);
  CHECK(rw.byte_len == HALF, "byte_len %u (expected %u)", rw.byte_len, HALF);
  CHECK(rw.qp_num == b->qp_num, "completion on QP %u", rw.qp_num);
  size_t bad = 0, first_bad = 0;
  for (uint32_t i = 0; i < HALF; i++)
    if (view[HALF + i] != buf[i] && bad++ == 0) first_bad = i;
  CHECK(bad == 0,
        "%u bytes arrived, read back through a second mapping of the memfd "
        "(%zu differ, first at %zu); %.1f ms",
        HALF, bad, first_bad, dt * 1e3);

  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(rcq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(devs);
  printf(failures ? "rxe_selftest: %d check(s) FAILED\n" : "rxe_selftest: all checks passed\n",
         failures);
  return failures ? 1 : 0;
}
