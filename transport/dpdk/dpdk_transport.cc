#include "transport/dpdk/dpdk_transport.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <rte_arp.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_kvargs.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "transport/datagram/ipv4_udp.h"

namespace gradlane::transport::dpdk {

using datagram::DatagramOptions;
using datagram::DatagramSink;
using datagram::DatagramStats;
using datagram::DatagramTransport;
using datagram::FormatEndpoint;
using datagram::Ipv4Endpoint;
using datagram::kMinDatagramBytes;
using datagram::ParseIpv4;

namespace {

constexpr uint16_t kDefaultUdpPort = 7610;
constexpr size_t kHdrBytes = datagram::kUdpFrameHeaderBytes;
static_assert(kHdrBytes == sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr));
constexpr int kBurst = 32;
// Bodies below this are copied even in zero-copy mode: an extra mbuf costs more than the copy.
constexpr size_t kZeroCopyMinBytes = 512;
constexpr TimeNs kArpRetry = 20 * sched::kMillisecond;

std::atomic<bool> g_eal_started{false};

TimeNs MonoNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<TimeNs>(ts.tv_sec) * sched::kSecond + ts.tv_nsec;
}

absl::StatusOr<rte_ether_addr> ParseMac(absl::string_view s) {
  std::vector<absl::string_view> parts = absl::StrSplit(s, ':');
  rte_ether_addr a{};
  if (parts.size() != 6)
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a MAC address"));
  for (int i = 0; i < 6; ++i) {
    uint32_t v = 0;
    if (parts[i].size() != 2 || !absl::SimpleHexAtoi(parts[i], &v)) {
      return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a MAC address"));
    }
    a.addr_bytes[i] = static_cast<uint8_t>(v);
  }
  return a;
}

std::string MacText(const rte_ether_addr& a) {
  return absl::StrFormat("%02x:%02x:%02x:%02x:%02x:%02x", a.addr_bytes[0], a.addr_bytes[1],
                         a.addr_bytes[2], a.addr_bytes[3], a.addr_bytes[4], a.addr_bytes[5]);
}

absl::StatusOr<std::vector<std::pair<uint32_t, rte_ether_addr>>> ParseArpList(
    std::string_view spec_sv) {
  std::vector<std::pair<uint32_t, rte_ether_addr>> out;
  const absl::string_view spec(spec_sv.data(), spec_sv.size());
  for (absl::string_view e : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const size_t eq = e.find('=');
    if (eq == absl::string_view::npos)
      return absl::InvalidArgumentError(absl::StrCat("static ARP entry '", e, "' is not IP=MAC"));
    auto ip = ParseIpv4(std::string_view(e.data(), eq));
    if (!ip.ok()) return ip.status();
    auto mac = ParseMac(e.substr(eq + 1));
    if (!mac.ok()) return mac.status();
    out.emplace_back(*ip, *mac);
  }
  return out;
}

// Another DPDK primary holds a write lock on <runtime dir>/config; EAL's own error for that is
// a generic "Cannot init config", so look first and say what is wrong.
bool PrefixBusy(const std::string& prefix) {
  const char* base = getuid() == 0 ? "/var/run/dpdk" : nullptr;
  std::string dir;
  if (base != nullptr) {
    dir = base;
  } else if (const char* x = getenv("XDG_RUNTIME_DIR"); x != nullptr) {
    dir = absl::StrCat(x, "/dpdk");
  } else {
    dir = "/tmp/dpdk";
  }
  const std::string path = absl::StrCat(dir, "/", prefix, "/config");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock lk {};
  lk.l_type = F_WRLCK;
  lk.l_whence = SEEK_SET;
  const bool busy = fcntl(fd, F_GETLK, &lk) == 0 && lk.l_type != F_UNLCK;
  close(fd);
  return busy;
}

void NoopFree(void*, void*) {}

// Deletes the files EAL made in its runtime directory, then the directory if that left it empty.
void RemoveRuntimeDir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "config" || name == "mp_socket" || name.rfind("fbarray_", 0) == 0 ||
        name.rfind("mp_socket_", 0) == 0 || name.rfind("dpdk_telemetry", 0) == 0) {
      std::filesystem::remove(e.path(), ec);
    }
  }
  std::filesystem::remove(dir, ec);  // only if now empty
}

}  // namespace

absl::Status ParseStaticArp(std::string_view spec) { return ParseArpList(spec).status(); }

struct DpdkPort::Impl {
  uint16_t port = 0;
  rte_mempool* rx_pool = nullptr;
  rte_mempool* tx_pool = nullptr;   // whole frames (copy mode), and header mbufs
  rte_mempool* ext_pool = nullptr;  // empty mbufs that point into the arena (zero-copy)
  rte_mbuf_ext_shared_info shinfo{};
  bool zero_copy = false;
  bool iova_va = false;
  rte_ether_addr mac{};
  Ipv4Endpoint self;
  uint32_t mtu = 1500;
  uint32_t max_dgram = 0;
  uint32_t rx_capacity = 0;
  std::string driver;
  rte_mbuf* tx[kBurst];
  int tx_n = 0;
  uint16_t ip_id = 0;
  bool thread_registered = false;
  std::string runtime_dir;  // EAL's directory for our file prefix ("" with --in-memory)
  struct Neighbour {
    uint32_t ip;
    rte_ether_addr mac;
    bool known;
    TimeNs asked_at;
  };
  std::vector<Neighbour> neighbours;
  uint64_t tx_dropped = 0;

  Neighbour* Find(uint32_t ip) {
    for (Neighbour& n : neighbours) {
      if (n.ip == ip) return &n;
    }
    return nullptr;
  }
  void Learn(uint32_t ip, const rte_ether_addr& mac) {
    Neighbour* n = Find(ip);
    if (n == nullptr) {
      if (neighbours.size() >= 4096) return;  // bounded: a flood of sources cannot grow it
      neighbours.push_back(Neighbour{ip, mac, true, 0});
      return;
    }
    n->mac = mac;
    n->known = true;
  }
  void SendArp(uint16_t op, const rte_ether_addr& dst_mac, uint32_t tip,
               const rte_ether_addr& tha) {
    rte_mbuf* m = rte_pktmbuf_alloc(tx_pool);
    if (m == nullptr) return;
    auto* eth = reinterpret_cast<rte_ether_hdr*>(
        rte_pktmbuf_append(m, sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr)));
    eth->dst_addr = dst_mac;
    eth->src_addr = mac;
    eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
    auto* arp = reinterpret_cast<rte_arp_hdr*>(eth + 1);
    arp->arp_hardware = rte_cpu_to_be_16(RTE_ARP_HRD_ETHER);
    arp->arp_protocol = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
    arp->arp_hlen = RTE_ETHER_ADDR_LEN;
    arp->arp_plen = 4;
    arp->arp_opcode = rte_cpu_to_be_16(op);
    arp->arp_data.arp_sha = mac;
    arp->arp_data.arp_sip = rte_cpu_to_be_32(self.ip);
    arp->arp_data.arp_tha = tha;
    arp->arp_data.arp_tip = rte_cpu_to_be_32(tip);
    Queue(m);
  }
  void Queue(rte_mbuf* m) {
    if (tx_n == kBurst) Flush();
    tx[tx_n++] = m;
  }
  void Flush() {
    int sent = 0;
    // A PMD may take part of a burst; a few more tries, then what is left is lost like on a
    // wire (the protocol retransmits).
    for (int tries = 0; sent < tx_n && tries < 4; ++tries) {
      sent += rte_eth_tx_burst(port, 0, tx + sent, static_cast<uint16_t>(tx_n - sent));
    }
    for (int i = sent; i < tx_n; ++i) rte_pktmbuf_free(tx[i]);
    tx_dropped += static_cast<uint64_t>(tx_n - sent);
    tx_n = 0;
  }
  void OnArp(rte_mbuf* m, TimeNs) {
    if (rte_pktmbuf_data_len(m) < sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr)) return;
    const auto* arp = rte_pktmbuf_mtod_offset(m, const rte_arp_hdr*, sizeof(rte_ether_hdr));
    if (arp->arp_hardware != rte_cpu_to_be_16(RTE_ARP_HRD_ETHER) ||
        arp->arp_protocol != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4)) {
      return;
    }
    const uint32_t sip = rte_be_to_cpu_32(arp->arp_data.arp_sip);
    const uint32_t tip = rte_be_to_cpu_32(arp->arp_data.arp_tip);
    const uint16_t op = rte_be_to_cpu_16(arp->arp_opcode);
    if (tip == self.ip || Find(sip) != nullptr) Learn(sip, arp->arp_data.arp_sha);
    if (op == RTE_ARP_OP_REQUEST && tip == self.ip) {
      SendArp(RTE_ARP_OP_REPLY, arp->arp_data.arp_sha, sip, arp->arp_data.arp_sha);
    }
  }
  void EnsureThread() {
    // The engine thread is not an EAL lcore; registering it gives it mempool caches.
    if (thread_registered) return;
    thread_registered = true;
    if (rte_lcore_id() == LCORE_ID_ANY) (void)rte_thread_register();
  }
};

DpdkPort::DpdkPort(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DpdkPort::~DpdkPort() {
  if (impl_ == nullptr) return;
  impl_->Flush();
  rte_eth_dev_stop(impl_->port);
  rte_eth_dev_close(impl_->port);
  rte_mempool_free(impl_->ext_pool);
  rte_mempool_free(impl_->tx_pool);
  rte_mempool_free(impl_->rx_pool);
  // The EAL leaves its runtime directory (a few MB of tmpfs under /var/run/dpdk/PREFIX) behind;
  // a daemon started per test or job would pile them up. Remove ours — only a directory named
  // after the prefix this process chose, holding the files EAL makes — then stop the EAL (it
  // cannot start again in this process).
  rte_eal_cleanup();
  RemoveRuntimeDir(impl_->runtime_dir);
}

uint32_t DpdkPort::max_datagram_bytes() const { return impl_->max_dgram; }
Ipv4Endpoint DpdkPort::local_endpoint() const { return impl_->self; }

uint32_t DpdkPort::rx_capacity_packets() const { return impl_->rx_capacity; }

std::string DpdkPort::Describe() const {
  const Impl& p = *impl_;
  return absl::StrFormat(
      "dpdk port %d driver %s mac %s ip %s mtu %d datagram %d zero-copy %s rx-capacity %d", p.port,
      p.driver, MacText(p.mac), FormatEndpoint(p.self), p.mtu, p.max_dgram,
      p.zero_copy ? "on" : "off", p.rx_capacity);
}

absl::StatusOr<std::unique_ptr<DpdkPort>> DpdkPort::Open(const DpdkOptions& o,
                                                         const std::string& default_ip,
                                                         uint16_t udp_port, uint32_t window,
                                                         uint32_t connections) {
  auto impl = std::make_unique<Impl>();
  auto ip = ParseIpv4(o.ip.empty() ? default_ip : o.ip);
  if (!ip.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("DPDK needs an IPv4 address: ", ip.status().message()));
  if (*ip == 0)
    return absl::InvalidArgumentError(
        "DPDK needs a concrete IPv4 address (--dpdk_ip), not 0.0.0.0");
  impl->self = Ipv4Endpoint{*ip, udp_port == 0 ? kDefaultUdpPort : udp_port};
  auto arp = ParseArpList(o.static_arp);
  if (!arp.ok()) return arp.status();
  if (o.zero_copy != "auto" && o.zero_copy != "on" && o.zero_copy != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("zero_copy '", o.zero_copy, "' (expected auto, on or off)"));
  }

  // ---- EAL
  if (g_eal_started.exchange(true)) {
    return absl::FailedPreconditionError(
        "the DPDK EAL is already running in this process (one DPDK transport per process)");
  }
  std::vector<std::string> args = {"gradlaned"};
  if (!o.eal_args.empty()) {
    for (absl::string_view a : absl::StrSplit(o.eal_args, ' ', absl::SkipWhitespace()))
      args.emplace_back(a);
  } else {
    if (o.in_memory && o.no_huge) {
      g_eal_started = false;
      return absl::InvalidArgumentError(
          "--in-memory does not work with --no-huge here: use a unique file prefix");
    }
    args.push_back(absl::StrCat("-l", o.lcore));
    if (o.no_huge) {
      args.push_back("--no-huge");
      args.push_back(absl::StrCat("-m", o.memory_mb));
    }
    if (o.pci.empty()) {
      args.push_back("--no-pci");
    } else {
      args.push_back(absl::StrCat("--allow=", o.pci));
    }
    if (!o.vdev.empty()) args.push_back(absl::StrCat("--vdev=", o.vdev));
    if (o.in_memory) {
      args.push_back("--in-memory");
    } else {
      const std::string prefix =
          o.file_prefix.empty() ? absl::StrCat("gradlane-", getpid()) : o.file_prefix;
      if (PrefixBusy(prefix)) {
        g_eal_started = false;
        return absl::FailedPreconditionError(absl::StrCat(
            "DPDK file prefix '", prefix,
            "' is in use by another DPDK process (choose another --dpdk_file_prefix)"));
      }
      args.push_back(absl::StrCat("--file-prefix=", prefix));
    }
    args.push_back("--log-level=*:warning");
  }
  for (const std::string& a : args) {
    if (a.rfind("--file-prefix=", 0) == 0 && PrefixBusy(a.substr(14))) {
      g_eal_started = false;
      return absl::FailedPreconditionError(
          absl::StrCat("DPDK file prefix '", a.substr(14), "' is in use by another DPDK process"));
    }
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  rte_openlog_stream(stderr);  // EAL logs to stdout by default; stdout carries our ready line
  if (rte_eal_init(static_cast<int>(args.size()), argv.data()) < 0) {
    return absl::UnavailableError(absl::StrCat("DPDK EAL failed to start (",
                                               rte_strerror(rte_errno),
                                               ") with: ", absl::StrJoin(args, " ")));
  }
  {
    // Remember the runtime directory only when it is named after a prefix given here.
    std::string prefix;
    for (const std::string& x : args) {
      if (x.rfind("--file-prefix=", 0) == 0) prefix = x.substr(14);
    }
    const std::string dir = rte_eal_get_runtime_dir();
    if (!prefix.empty() && dir.size() > prefix.size() + 1 &&
        dir.compare(dir.size() - prefix.size() - 1, std::string::npos, "/" + prefix) == 0) {
      impl->runtime_dir = dir;
    }
  }
  // Past this point a failed start also stops the EAL and removes its runtime directory.
  struct EalGuard {
    Impl* impl;
    bool armed = true;
    ~EalGuard() {
      if (!armed) return;
      rte_eal_cleanup();
      RemoveRuntimeDir(impl->runtime_dir);
    }
  } guard{impl.get()};

  // ---- port
  uint16_t port = RTE_MAX_ETHPORTS;
  uint16_t pid = 0;
  RTE_ETH_FOREACH_DEV(pid) {
    port = pid;
    break;
  }
  if (port == RTE_MAX_ETHPORTS) {
    return absl::NotFoundError(absl::StrCat(
        "no DPDK port: give a virtual device (--dpdk_vdev) or a PCI address ",
        "(--dpdk_pci) of a NIC bound to a DPDK driver; EAL args: ", absl::StrJoin(args, " ")));
  }
  impl->port = port;
  rte_eth_dev_info info;
  if (int rc = rte_eth_dev_info_get(port, &info); rc != 0) {
    return absl::InternalError(absl::StrCat("rte_eth_dev_info_get: ", rte_strerror(-rc)));
  }
  impl->driver = info.driver_name != nullptr ? info.driver_name : "?";
  // net_af_packet reports a 1518-byte frame limit to ethdev, yet carries frames up to its
  // framesz both ways, bounded by the interface's MTU: for it, --dpdk_mtu states that MTU.
  const bool af_packet = impl->driver == "net_af_packet";
  uint16_t port_mtu = 1500;
  (void)rte_eth_dev_get_mtu(port, &port_mtu);
  uint32_t frame;
  if (o.mtu != 0) {
    if (o.mtu > 65000 || (!af_packet && (o.mtu < info.min_mtu || o.mtu > info.max_mtu))) {
      return absl::InvalidArgumentError(absl::StrCat("MTU ", o.mtu, " outside the port's range [",
                                                     info.min_mtu, ", ", info.max_mtu, "]"));
    }
    frame = o.mtu + RTE_ETHER_HDR_LEN;
  } else {
    frame = std::min<uint32_t>(port_mtu + RTE_ETHER_HDR_LEN,
                               std::max<uint32_t>(info.max_rx_pktlen, 1514));
  }
  impl->mtu = frame - RTE_ETHER_HDR_LEN;
  impl->max_dgram = impl->mtu - static_cast<uint32_t>(sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr));
  if (impl->max_dgram < kMinDatagramBytes) {
    return absl::FailedPreconditionError(absl::StrCat("port MTU ", impl->mtu, " is too small"));
  }
  const bool multi_seg = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
  impl->iova_va = rte_eal_iova_mode() == RTE_IOVA_VA;
  // Virtual devices that copy from the mbuf's virtual address need no DMA mapping. A NIC would
  // DMA from the arena, which is not registered with the EAL (rte_extmem_register +
  // rte_dev_dma_map are not done yet), so "auto" copies there; "on" is the operator's call.
  const bool reads_va = impl->driver == "net_af_packet" || impl->driver == "net_memif" ||
                        impl->driver == "net_ring" || impl->driver == "net_null";
  impl->zero_copy = o.zero_copy == "on" || (o.zero_copy == "auto" && multi_seg && reads_va);
  if (o.zero_copy == "on" && !multi_seg) {
    return absl::FailedPreconditionError(
        absl::StrCat("driver ", impl->driver, " cannot send chained mbufs: no zero-copy"));
  }

  rte_eth_conf conf{};
  if (!af_packet) conf.rxmode.mtu = impl->mtu;
  if (impl->zero_copy) conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  if (int rc = rte_eth_dev_configure(port, 1, 1, &conf); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("rte_eth_dev_configure(port ", port, "): ", rte_strerror(-rc)));
  }
  uint16_t nb_rx = 1024, nb_tx = 1024;
  (void)rte_eth_dev_adjust_nb_rx_tx_desc(port, &nb_rx, &nb_tx);
  // What arrives while we are not polling waits in the RX descriptors — or, for af_packet, in
  // its kernel ring (the PMD ignores nb_rx): `framecnt` frames, 512 unless the devargs say.
  impl->rx_capacity = nb_rx;
  if (af_packet) {
    impl->rx_capacity = 512;
    const rte_devargs* da = info.device != nullptr ? rte_dev_devargs(info.device) : nullptr;
    if (rte_kvargs* kv =
            da != nullptr && da->args != nullptr ? rte_kvargs_parse(da->args, nullptr) : nullptr) {
      uint32_t frames = 0;
      const char* v = rte_kvargs_get(kv, "framecnt");
      if (v != nullptr && absl::SimpleAtoi(v, &frames) && frames > 0) impl->rx_capacity = frames;
      rte_kvargs_free(kv);
    }
  }
  const int socket = rte_eth_dev_socket_id(port) < 0 ? 0 : rte_eth_dev_socket_id(port);
  // af_packet copies a whole ring frame into one mbuf, so the data room must hold its frame size
  // (16 KiB with the recommended devargs); other PMDs need the MTU.
  const uint32_t room =
      std::min<uint32_t>(RTE_PKTMBUF_HEADROOM + std::max<uint32_t>(16384, frame + 64), 65535);
  const uint32_t rx_n = std::max<uint32_t>(2 * nb_rx + 2 * kBurst, 1023);
  // Unacknowledged packets live in the arena (retransmissions re-read it), so mbufs are only
  // needed for what the TX ring holds, plus one window of packets being built.
  (void)connections;
  const uint32_t tx_n = std::max<uint32_t>(2 * nb_tx + window + 2 * kBurst, 1023);
  const uint32_t tx_room = std::min<uint32_t>(RTE_PKTMBUF_HEADROOM + frame + 64, 65535);
  const std::string tag = absl::StrCat(getpid());
  impl->rx_pool =
      rte_pktmbuf_pool_create(absl::StrCat("glrx", tag).c_str(), rx_n, 64, 0, room, socket);
  impl->tx_pool =
      rte_pktmbuf_pool_create(absl::StrCat("gltx", tag).c_str(), tx_n, 64, 0, tx_room, socket);
  if (impl->zero_copy) {
    impl->ext_pool =
        rte_pktmbuf_pool_create(absl::StrCat("glext", tag).c_str(), tx_n, 64, 0, 0, socket);
  }
  if (impl->rx_pool == nullptr || impl->tx_pool == nullptr ||
      (impl->zero_copy && impl->ext_pool == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("DPDK mempools (", rx_n, "+", tx_n, " mbufs of ", room,
                     " bytes): ", rte_strerror(rte_errno),
                     " — raise -m / --dpdk_memory_mb or reserve hugepages"));
  }
  impl->shinfo.free_cb = NoopFree;
  impl->shinfo.fcb_opaque = nullptr;
  // Never reaches zero: the arena is not ours to free; each attached mbuf adds one.
  rte_mbuf_ext_refcnt_set(&impl->shinfo, 1);
  if (int rc = rte_eth_rx_queue_setup(port, 0, nb_rx, socket, nullptr, impl->rx_pool); rc != 0) {
    return absl::UnavailableError(absl::StrCat("rx queue setup: ", rte_strerror(-rc)));
  }
  if (int rc = rte_eth_tx_queue_setup(port, 0, nb_tx, socket, nullptr); rc != 0) {
    return absl::UnavailableError(absl::StrCat("tx queue setup: ", rte_strerror(-rc)));
  }
  if (int rc = rte_eth_dev_start(port); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("rte_eth_dev_start(port ", port, "): ", rte_strerror(-rc)));
  }
  (void)rte_eth_promiscuous_enable(port);  // a vdev may not filter by MAC anyway; we do
  if (int rc = rte_eth_macaddr_get(port, &impl->mac); rc != 0) {
    return absl::InternalError(absl::StrCat("rte_eth_macaddr_get: ", rte_strerror(-rc)));
  }
  for (const auto& [aip, amac] : *arp)
    impl->neighbours.push_back(Impl::Neighbour{aip, amac, true, 0});
  guard.armed = false;
  return std::unique_ptr<DpdkPort>(new DpdkPort(std::move(impl)));
}

bool DpdkPort::Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
                       std::span<const uint8_t> body) {
  Impl& p = *impl_;
  p.EnsureThread();
  Impl::Neighbour* n = p.Find(to.ip);
  if (n == nullptr || !n->known) {
    const TimeNs now = MonoNow();
    if (n == nullptr) {
      if (p.neighbours.size() >= 4096) return false;
      p.neighbours.push_back(Impl::Neighbour{to.ip, {}, false, 0});
      n = &p.neighbours.back();
    }
    if (now - n->asked_at >= kArpRetry) {
      n->asked_at = now;
      rte_ether_addr bcast;
      std::memset(bcast.addr_bytes, 0xFF, sizeof(bcast.addr_bytes));
      rte_ether_addr zero{};
      p.SendArp(RTE_ARP_OP_REQUEST, bcast, to.ip, zero);
      p.Flush();
    }
    return false;  // retried by the protocol once the neighbour answers
  }
  const size_t dgram = head.size() + body.size();
  if (dgram > p.max_dgram) return false;
  rte_mbuf* m = rte_pktmbuf_alloc(p.tx_pool);
  if (m == nullptr) return false;
  const bool zc = p.zero_copy && body.size() >= kZeroCopyMinBytes;
  const size_t inline_bytes = kHdrBytes + head.size() + (zc ? 0 : body.size());
  auto* frame =
      reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(inline_bytes)));
  if (frame == nullptr) {
    rte_pktmbuf_free(m);
    return false;
  }
  if (zc) {
    rte_mbuf* ext = rte_pktmbuf_alloc(p.ext_pool);
    if (ext == nullptr) {
      rte_pktmbuf_free(m);
      return false;
    }
    void* addr = const_cast<uint8_t*>(body.data());
    rte_mbuf_ext_refcnt_update(&p.shinfo, 1);
    rte_pktmbuf_attach_extbuf(ext, addr,
                              p.iova_va ? reinterpret_cast<rte_iova_t>(addr) : RTE_BAD_IOVA,
                              static_cast<uint16_t>(body.size()), &p.shinfo);
    ext->data_len = static_cast<uint16_t>(body.size());
    ext->pkt_len = static_cast<uint32_t>(body.size());
    if (rte_pktmbuf_chain(m, ext) != 0) {
      rte_pktmbuf_free(ext);
      rte_pktmbuf_free(m);
      return false;
    }
  }
  datagram::WriteUdpFrameHeader(std::span<uint8_t, datagram::kUdpFrameHeaderBytes>(frame,
                                                                                   kHdrBytes),
                                n->mac.addr_bytes, p.mac.addr_bytes, p.self, to, p.ip_id++, dgram);
  uint8_t* out = frame + kHdrBytes;
  std::memcpy(out, head.data(), head.size());
  if (!zc && !body.empty()) std::memcpy(out + head.size(), body.data(), body.size());
  p.Queue(m);
  return true;
}

void DpdkPort::Flush_st() {
  if (impl_->tx_n > 0) impl_->Flush();
}

int DpdkPort::Poll_st(DatagramSink* sink, TimeNs now, TimeNs wait) {
  Impl& p = *impl_;
  p.EnsureThread();
  rte_mbuf* rx[kBurst];
  const TimeNs deadline = wait > 0 ? MonoNow() + wait : 0;
  TimeNs nap = 10 * sched::kMicrosecond;
  int spins = 0;
  for (;;) {
    const uint16_t n = rte_eth_rx_burst(p.port, 0, rx, kBurst);
    int delivered = 0;
    for (uint16_t i = 0; i < n; ++i) {
      rte_mbuf* m = rx[i];
      const uint32_t len = rte_pktmbuf_data_len(m);
      if (m->nb_segs != 1 || len < sizeof(rte_ether_hdr)) {
        rte_pktmbuf_free(m);
        continue;
      }
      const std::span<const uint8_t> bytes(rte_pktmbuf_mtod(m, const uint8_t*), len);
      if (datagram::EtherTypeOf(bytes) == datagram::kEtherTypeArp) {
        p.OnArp(m, now);
        rte_pktmbuf_free(m);
        continue;
      }
      // Only well-formed IPv4/UDP to our address and port, unfragmented, without options.
      const std::optional<datagram::UdpFrame> f = datagram::ParseUdpFrame(bytes, p.self);
      if (!f) {
        rte_pktmbuf_free(m);
        continue;
      }
      Impl::Neighbour* nb = p.Find(f->from.ip);
      if (nb == nullptr || !nb->known) {
        rte_ether_addr src;
        std::memcpy(src.addr_bytes, f->src_mac.data(), sizeof(src.addr_bytes));
        p.Learn(f->from.ip, src);
      }
      sink->OnDatagram_st(f->from, f->datagram, now);
      rte_pktmbuf_free(m);
      ++delivered;
    }
    if (delivered > 0 || wait <= 0) return delivered;
    // Idle back-off: spin a little (a reply is often microseconds away), then sleep in growing
    // naps up to 250 µs, so an idle daemon makes a few thousand polls a second, not millions.
    const TimeNs t = MonoNow();
    if (t >= deadline) return 0;
    if (++spins < 16) continue;
    timespec ts{0, static_cast<long>(std::min(nap, deadline - t))};
    nanosleep(&ts, nullptr);
    nap = std::min<TimeNs>(nap * 2, 250 * sched::kMicrosecond);
  }
}

// ---- the transport ------------------------------------------------------------------------------

DpdkTransport::~DpdkTransport() {
  // One line for the operator (and the loss test): what the protocol had to repair.
  if (datagram_ != nullptr) {
    const DatagramStats r = datagram_->DatagramStatsNow();
    std::fprintf(
        stderr,
        "gradlaned: dpdk stats: datagrams_sent=%lu datagrams_received=%lu data_packets_sent=%lu "
        "retransmits=%lu timeouts=%lu duplicates=%lu out_of_order=%lu injected_drops=%lu "
        "injected_reorders=%lu injected_duplicates=%lu link_full=%lu stray=%lu "
        "replies_suppressed=%lu\n",
        r.datagrams_sent, r.datagrams_received, r.data_packets_sent, r.retransmits, r.timeouts,
        r.duplicates, r.out_of_order, r.injected_drops, r.injected_reorders, r.injected_duplicates,
        r.link_full, r.stray, r.replies_suppressed);
  }
  datagram_.reset();  // before the port it sends through
  port_.reset();
}

absl::StatusOr<std::unique_ptr<DpdkTransport>> DpdkTransport::Create(
    const TransportOptions& options, const DpdkOptions& dpdk, TransportHandler* handler) {
  if (handler == nullptr) return absl::InvalidArgumentError("null handler");
  auto port = DpdkPort::Open(dpdk, options.listen_address, options.listen_port,
                             dpdk.reliable.window_packets, options.max_connections);
  if (!port.ok()) return port.status();
  auto t = std::unique_ptr<DpdkTransport>(new DpdkTransport());
  t->port_ = std::move(*port);
  DatagramOptions protocol = dpdk.reliable;
  // A quarter of the port's room is left for acks, control and others' traffic.
  if (protocol.rx_budget_packets == 0)
    protocol.rx_budget_packets = t->port_->rx_capacity_packets() * 3 / 4;
  auto datagram = DatagramTransport::Create(options, protocol, t->port_.get(), handler);
  if (!datagram.ok()) return datagram.status();
  t->datagram_ = std::move(*datagram);
  return t;
}

std::string DpdkTransport::Describe() const { return port_->Describe(); }

}  // namespace gradlane::transport::dpdk
