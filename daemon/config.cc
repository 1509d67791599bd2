#include "daemon/config.h"

#include <unistd.h>

#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "sched/policy.h"
#include "shm/abi.h"

ABSL_FLAG(std::string, socket, GL_DEFAULT_SOCKET_PATH, "client Unix socket path");
ABSL_FLAG(std::string, listen, "0.0.0.0:7610",
          "peer address HOST:PORT to accept other daemons on (port 0: pick a free one)");
ABSL_FLAG(absl::Duration, peer_timeout, absl::Seconds(10),
          "a peer that makes no progress for this long while work is pending is down");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(60),
          "how long a job keeps dialing peers that are not up (or do not know the job) yet");
ABSL_FLAG(std::string, default_policy, "gradlane",
          "scheduling policy for jobs that name none: fifo, p3, bytescheduler, prophet, "
          "gradlane (times its rules, those four and its rules with half and twice their window on "
          "the job and keeps the fastest; docs/daemon.md), gradlane-rules");
ABSL_FLAG(std::string, reduce, "sum", "reduction of the W contributions: sum or mean");
ABSL_FLAG(std::string, allreduce_fusion, "off",
          "all-reduce jobs: off (every partition its own ring; results reproducible bit for bit "
          "from run to run), pace (fuse small tensors into ring buckets by PACE's balanced fusion, "
          "planned once from the measured ready times and link cost) or greedy (fuse every run of "
          "small tensors up to one partition, like a fusion buffer); every daemon of a job must "
          "agree");
ABSL_FLAG(std::string, allowed_uids, "",
          "comma-separated uids allowed to connect (empty with --allowed_gids empty: the "
          "daemon's own uid, plus root)");
ABSL_FLAG(std::string, allowed_gids, "", "comma-separated primary gids allowed to connect");
ABSL_FLAG(uint64_t, arena_bytes, 0, "default shared-memory arena per client session (0: 64 MiB)");
ABSL_FLAG(uint64_t, max_arena_bytes, uint64_t{1} << 30, "largest arena a client may ask for");
ABSL_FLAG(uint64_t, partition_bytes, 0, "partition size δ in bytes (0: each policy's default)");
ABSL_FLAG(uint64_t, credit_bytes, 0, "credit window in bytes (0: each policy's default)");
ABSL_FLAG(uint32_t, max_sessions, 256, "client sessions this daemon serves at once");
ABSL_FLAG(uint32_t, max_sessions_per_uid, 64, "client sessions one local uid may hold at once");
ABSL_FLAG(uint32_t, max_pending_connections, 64,
          "client connections that have not yet sent their hello (more are refused: busy)");
ABSL_FLAG(uint32_t, max_pending_per_uid, 16,
          "client connections one local uid may have waiting to send their hello");
ABSL_FLAG(uint32_t, max_peer_connections, 1024,
          "peer connections, inbound and outbound (a job of W ranks needs 2(W-1))");
ABSL_FLAG(uint32_t, max_unauthenticated_peers, 32,
          "accepted peer connections that have not yet presented a job token");
ABSL_FLAG(bool, autotune, false,
          "bytescheduler: tune the credit window online with Bayesian optimisation");
ABSL_FLAG(std::string, transport, "tcp",
          "peer transport: tcp (kernel sockets), dpdk (kernel bypass) or verbs (RDMA)");
ABSL_FLAG(std::string, verbs_device, "", "--transport=verbs: RDMA device (empty: the first)");
ABSL_FLAG(int, verbs_port, 1, "--transport=verbs: the device's port");
ABSL_FLAG(uint32_t, verbs_recv_slots, 64,
          "--transport=verbs: receives each connection keeps posted (the sender's credits)");
ABSL_FLAG(uint32_t, verbs_eager_bytes, 8192,
          "--transport=verbs: largest segment sent with its header (eager); larger ones are "
          "written by RDMA into the receiver's target");
ABSL_FLAG(int, verbs_gid_index, 1,
          "--transport=verbs: GID table index (soft-RoCE on IPv4: 1; show_gids lists a NIC's)");
ABSL_FLAG(std::string, dpdk_eal_args, "",
          "dpdk: verbatim EAL arguments (space-separated); overrides the other --dpdk_ EAL flags");
ABSL_FLAG(std::string, dpdk_vdev, "",
          "dpdk: virtual device, e.g. net_af_packet0,iface=eth0,qdisc_bypass=0,blocksz=16384,"
          "framesz=16384,framecnt=512");
ABSL_FLAG(std::string, dpdk_pci, "", "dpdk: PCI address of the NIC port to use");
ABSL_FLAG(int32_t, dpdk_lcore, 0, "dpdk: EAL lcore (-l)");
ABSL_FLAG(bool, dpdk_no_huge, true, "dpdk: run without hugepages (--no-huge)");
ABSL_FLAG(uint32_t, dpdk_memory_mb, 512, "dpdk: EAL memory with --no-huge (-m)");
ABSL_FLAG(std::string, dpdk_file_prefix, "", "dpdk: EAL file prefix (default gradlane-<pid>)");
ABSL_FLAG(bool, dpdk_in_memory, false,
          "dpdk: --in-memory instead of a file prefix (needs hugepages)");
ABSL_FLAG(std::string, dpdk_ip, "",
          "dpdk: our IPv4 address on the port (default: the --listen host)");
ABSL_FLAG(uint32_t, dpdk_mtu, 0,
          "dpdk: port MTU to set, e.g. 9000 for jumbo frames (0: keep the port's)");
ABSL_FLAG(std::string, dpdk_static_arp, "", "dpdk: static neighbours IP=MAC,... (others by ARP)");
ABSL_FLAG(std::string, dpdk_zero_copy, "auto",
          "dpdk: transmit from the arena without a copy: auto, on, off");
ABSL_FLAG(uint32_t, dpdk_window, 256,
          "dpdk: packets in flight per connection (and credit offered), 1..256");
ABSL_FLAG(
    uint32_t, dpdk_rx_budget, 0,
    "dpdk: packets the port holds between polls, split into the credit offered to the peers that "
    "send to us (0: 3/4 of the port's RX ring, e.g. af_packet's framecnt)");
ABSL_FLAG(uint32_t, dpdk_drop_every, 0,
          "dpdk fault injection: drop every Nth datagram sent (0: off)");
ABSL_FLAG(double, dpdk_drop_probability, 0,
          "dpdk fault injection: drop each datagram with this probability");
ABSL_FLAG(double, dpdk_reorder_probability, 0,
          "dpdk fault injection: reorder with this probability");
ABSL_FLAG(double, dpdk_duplicate_probability, 0,
          "dpdk fault injection: duplicate with this probability");
ABSL_FLAG(uint64_t, dpdk_fault_seed, 1, "dpdk fault injection: random seed");

namespace gradlane::daemon {
namespace {

template <typename Id>
absl::StatusOr<std::vector<Id>> ParseIds(absl::string_view flag, const std::string& list) {
  std::vector<Id> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not a number"));
    }
    out.push_back(static_cast<Id>(v));
  }
  return out;
}

absl::StatusOr<sched::TimeNs> PositiveNs(absl::string_view flag, absl::Duration d) {
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be positive"));
  }
  return absl::ToInt64Nanoseconds(d);
}

}  // namespace

absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(absl::string_view s) {
  absl::string_view host, port;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == absl::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not [ADDRESS]:PORT"));
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not HOST:PORT"));
    }
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  uint32_t p = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &p) || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not HOST:PORT (port 0..65535)"));
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(p));
}

absl::StatusOr<TransportChoice> TransportFromFlags() {
  TransportChoice t;
  t.name = absl::GetFlag(FLAGS_transport);
  if (t.name != "tcp" && t.name != "dpdk" && t.name != "verbs") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport: '", t.name, "' (expected tcp, dpdk or verbs)"));
  }
  t.verbs.device = absl::GetFlag(FLAGS_verbs_device);
  const int verbs_port = absl::GetFlag(FLAGS_verbs_port);
  t.verbs.gid_index = absl::GetFlag(FLAGS_verbs_gid_index);
  if (t.name == "verbs") {
    if (verbs_port < 1 || verbs_port > 255) {
      return absl::InvalidArgumentError("--verbs_port must be in [1, 255]");
    }
    if (t.verbs.gid_index < 0 || t.verbs.gid_index > 255) {
      return absl::InvalidArgumentError("--verbs_gid_index must be in [0, 255]");
    }
    t.verbs.port = static_cast<uint8_t>(verbs_port);
    const uint32_t slots = absl::GetFlag(FLAGS_verbs_recv_slots);
    const uint32_t eager = absl::GetFlag(FLAGS_verbs_eager_bytes);
    if (slots < 2 || slots > 4096) {
      return absl::InvalidArgumentError("--verbs_recv_slots must be in [2, 4096]");
    }
    // Control frames (the manifest, a departure) must go eagerly: the engine resolves a
    // connection's later frames only once they are in.
    if (eager < 256 || eager > (1u << 20)) {
      return absl::InvalidArgumentError("--verbs_eager_bytes must be in [256, 1 MiB]");
    }
    t.verbs.limits.recv_slots = slots;
    t.verbs.limits.slot_bytes = static_cast<uint32_t>(transport::kFrameHeaderBytes) + eager;
    return t;
  }
  transport::dpdk::DpdkOptions& d = t.dpdk;
  d.eal_args = absl::GetFlag(FLAGS_dpdk_eal_args);
  d.vdev = absl::GetFlag(FLAGS_dpdk_vdev);
  d.pci = absl::GetFlag(FLAGS_dpdk_pci);
  d.lcore = absl::GetFlag(FLAGS_dpdk_lcore);
  d.no_huge = absl::GetFlag(FLAGS_dpdk_no_huge);
  d.memory_mb = absl::GetFlag(FLAGS_dpdk_memory_mb);
  d.file_prefix = absl::GetFlag(FLAGS_dpdk_file_prefix);
  d.in_memory = absl::GetFlag(FLAGS_dpdk_in_memory);
  d.ip = absl::GetFlag(FLAGS_dpdk_ip);
  d.static_arp = absl::GetFlag(FLAGS_dpdk_static_arp);
  d.mtu = absl::GetFlag(FLAGS_dpdk_mtu);
  d.zero_copy = absl::GetFlag(FLAGS_dpdk_zero_copy);
  d.reliable.window_packets = absl::GetFlag(FLAGS_dpdk_window);
  d.reliable.rx_budget_packets = absl::GetFlag(FLAGS_dpdk_rx_budget);
  d.reliable.faults.drop_every = absl::GetFlag(FLAGS_dpdk_drop_every);
  d.reliable.faults.drop_probability = absl::GetFlag(FLAGS_dpdk_drop_probability);
  d.reliable.faults.reorder_probability = absl::GetFlag(FLAGS_dpdk_reorder_probability);
  d.reliable.faults.duplicate_probability = absl::GetFlag(FLAGS_dpdk_duplicate_probability);
  d.reliable.faults.seed = absl::GetFlag(FLAGS_dpdk_fault_seed);
  if (t.name != "dpdk") return t;
  if (d.lcore < 0) return absl::InvalidArgumentError("--dpdk_lcore must be >= 0");
  if (d.reliable.window_packets == 0 || d.reliable.window_packets > transport::dpdk::kMaxWindow) {
    return absl::InvalidArgumentError("--dpdk_window must be in [1, 256]");
  }
  if (d.zero_copy != "auto" && d.zero_copy != "on" && d.zero_copy != "off") {
    return absl::InvalidArgumentError("--dpdk_zero_copy must be auto, on or off");
  }
  for (double p : {d.reliable.faults.drop_probability, d.reliable.faults.reorder_probability,
                   d.reliable.faults.duplicate_probability}) {
    if (!(p >= 0 && p < 1))
      return absl::InvalidArgumentError("--dpdk_*_probability must be in [0, 1)");
  }
  if (d.reliable.faults.drop_every == 1)
    return absl::InvalidArgumentError("--dpdk_drop_every=1 drops everything");
#ifdef GRADLANE_HAVE_DPDK
  if (absl::Status s = transport::dpdk::ParseStaticArp(d.static_arp); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--dpdk_static_arp: ", s.message()));
  }
#endif
  if (d.eal_args.empty() && d.vdev.empty() && d.pci.empty()) {
    return absl::InvalidArgumentError(
        "--transport=dpdk needs a port: --dpdk_vdev, --dpdk_pci or --dpdk_eal_args");
  }
  return t;
}

absl::StatusOr<EngineOptions> OptionsFromFlags() {
  EngineOptions o;
  o.sessions.socket_path = absl::GetFlag(FLAGS_socket);
  if (o.sessions.socket_path.empty()) return absl::InvalidArgumentError("--socket is empty");
  auto hp = ParseHostPort(absl::GetFlag(FLAGS_listen));
  if (!hp.ok())
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", hp.status().message()));
  o.transport.listen_address = hp->first;
  o.transport.listen_port = hp->second;
  auto pt = PositiveNs("peer_timeout", absl::GetFlag(FLAGS_peer_timeout));
  if (!pt.ok()) return pt.status();
  o.transport.peer_timeout = *pt;
  auto ct = PositiveNs("connect_timeout", absl::GetFlag(FLAGS_connect_timeout));
  if (!ct.ok()) return ct.status();
  o.transport.connect_deadline = *ct;
  o.default_policy = absl::GetFlag(FLAGS_default_policy);
  const std::string reduce = absl::GetFlag(FLAGS_reduce);
  if (reduce == "sum") {
    o.reduce = ps::ReduceOp::kSum;
  } else if (reduce == "mean") {
    o.reduce = ps::ReduceOp::kMean;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--reduce: '", reduce, "' (expected sum or mean)"));
  }
  const std::string fusion = absl::GetFlag(FLAGS_allreduce_fusion);
  if (fusion == "pace") {
    o.allreduce_fusion = EngineOptions::Fusion::kPace;
  } else if (fusion == "greedy") {
    o.allreduce_fusion = EngineOptions::Fusion::kGreedy;
  } else if (fusion == "off") {
    o.allreduce_fusion = EngineOptions::Fusion::kOff;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--allreduce_fusion: '", fusion, "' (expected pace, greedy or off)"));
  }
  auto uids = ParseIds<uid_t>("allowed_uids", absl::GetFlag(FLAGS_allowed_uids));
  if (!uids.ok()) return uids.status();
  auto gids = ParseIds<gid_t>("allowed_gids", absl::GetFlag(FLAGS_allowed_gids));
  if (!gids.ok()) return gids.status();
  o.sessions.policy.uids = *uids;
  o.sessions.policy.gids = *gids;
  o.sessions.policy.allow_same_uid = uids->empty() && gids->empty();
  o.sessions.policy.uids.push_back(0);  // root may always connect
  o.sessions.max_arena_bytes = absl::GetFlag(FLAGS_max_arena_bytes);
  if (const uint64_t a = absl::GetFlag(FLAGS_arena_bytes); a != 0)
    o.sessions.default_arena_bytes = a;
  if (o.sessions.default_arena_bytes > o.sessions.max_arena_bytes) {
    return absl::InvalidArgumentError("--arena_bytes is above --max_arena_bytes");
  }
  o.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.sessions.max_sessions_per_uid = absl::GetFlag(FLAGS_max_sessions_per_uid);
  o.sessions.max_pending = absl::GetFlag(FLAGS_max_pending_connections);
  o.sessions.max_pending_per_uid = absl::GetFlag(FLAGS_max_pending_per_uid);
  if (o.sessions.max_sessions == 0 || o.sessions.max_sessions_per_uid == 0 ||
      o.sessions.max_pending == 0 || o.sessions.max_pending_per_uid == 0) {
    return absl::InvalidArgumentError(
        "--max_sessions, --max_sessions_per_uid, --max_pending_connections and "
        "--max_pending_per_uid must be at least 1");
  }
  o.transport.max_connections = absl::GetFlag(FLAGS_max_peer_connections);
  o.transport.max_unauthenticated = absl::GetFlag(FLAGS_max_unauthenticated_peers);
  if (o.transport.max_connections < 2 || o.transport.max_connections > 4096) {
    return absl::InvalidArgumentError("--max_peer_connections must be in [2, 4096]");
  }
  if (o.transport.max_unauthenticated == 0 ||
      o.transport.max_unauthenticated > o.transport.max_connections) {
    return absl::InvalidArgumentError(
        "--max_unauthenticated_peers must be in [1, --max_peer_connections]");
  }
  o.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  o.credit_bytes = absl::GetFlag(FLAGS_credit_bytes);
  o.autotune = absl::GetFlag(FLAGS_autotune);
  sched::PolicyConfig pc;
  pc.name = o.default_policy;
  pc.partition_bytes = o.partition_bytes;
  pc.credit_bytes = o.credit_bytes;
  if (auto p = sched::MakePolicy(pc); !p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--default_policy: ", p.status().message()));
  }
  return o;
}

}  // namespace gradlane::daemon
