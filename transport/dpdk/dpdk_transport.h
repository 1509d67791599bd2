// transport/dpdk/dpdk_transport.h — the kernel-bypass backend: gradlane's reliable datagram
// protocol (transport/datagram/datagram_transport.h) over a DPDK Ethernet port.
//
// What this layer adds to the protocol logic: EAL start-up from the daemon's configuration (a
// port's PCI address or a virtual device, the lcore, hugepages or --no-huge, a unique file prefix
// or --in-memory; or a verbatim EAL argument string), one port with one RX and one TX queue,
// mempools sized for the window, Ethernet + IPv4/UDP framing (transport/datagram/ipv4_udp.h
// builds and checks the headers), peer MAC resolution by ARP (we answer for our address and ask for
// peers', learn senders' MACs, or take static entries), TX and RX bursts, zero-copy transmission
// from the registered arena through external mbufs where the PMD takes chained mbufs (a copy into
// one mbuf otherwise), and an idle back-off: with nothing arriving, Progress_st(now, wait_ms)
// sleeps in growing steps instead of spinning, so an idle daemon does not hold a core.
//
// Errors are statuses, never aborts: no port ("no DPDK port: ..."), EAL refusal (its message),
// a file prefix another DPDK process holds ("file prefix ... is in use"), a second EAL in one
// process. The kernel still sees every frame on a shared interface (net_af_packet): use an IPv4
// address the kernel does not own for --dpdk_ip, so the kernel drops our UDP instead of answering
// it with ICMP, and our ARP answers for it.
//
// This header includes no DPDK header (its -march flags must not reach the engine or nvcc-built
// code): the port lives behind a pointer to a type defined in dpdk_transport.cc.
// Thread rules: as TcpTransport — `_st` on the engine thread, Stats() anywhere. One per process
// (the EAL is process-wide).
#ifndef GRADLANE_TRANSPORT_DPDK_DPDK_TRANSPORT_H_
#define GRADLANE_TRANSPORT_DPDK_DPDK_TRANSPORT_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/datagram/datagram_transport.h"
#include "transport/transport.h"

namespace gradlane::transport::dpdk {

// The daemon's flag checks name the protocol's window bound as the DPDK backend's.
using datagram::kMaxWindow;

struct DpdkOptions {
  // Verbatim EAL arguments (space-separated); when set, the discrete fields below are ignored.
  std::string eal_args;
  // A virtual device, e.g.
  // "net_af_packet0,iface=eth0,qdisc_bypass=0,blocksz=16384,framesz=16384,framecnt=512".
  std::string vdev;
  // A PCI address to use (allow-list); empty with a vdev: --no-pci.
  std::string pci;
  int lcore = 0;
  bool no_huge = true;
  uint32_t memory_mb = 512;  // -m with --no-huge
  std::string file_prefix;   // empty: "gradlane-<pid>" (unique per process)
  bool in_memory = false;    // --in-memory instead of a file prefix (not with --no-huge)
  // Our IPv4 address on the port (empty: TransportOptions::listen_address); the UDP port is
  // TransportOptions::listen_port (0: 7610).
  std::string ip;
  // Port MTU to set (IP packet bytes; 9000 for jumbo frames); 0 keeps the port's. With
  // net_af_packet this is the interface's MTU and must fit the vdev's framesz.
  uint32_t mtu = 0;
  // Static neighbours "ip=aa:bb:cc:dd:ee:ff,..." (skip ARP for them).
  std::string static_arp;
  // "auto" (zero-copy where the PMD takes chained mbufs and reads virtual addresses), "on", "off".
  std::string zero_copy = "auto";
  // The protocol's options (window, receive budget, faults). The name predates the move of the
  // protocol to transport/datagram/; daemon/config.cc fills it.
  datagram::DatagramOptions reliable;
};

// "ip=mac,..." is well formed; InvalidArgument naming the bad entry. (Defined only in DPDK builds.)
absl::Status ParseStaticArp(std::string_view spec);

// One DPDK port as a DatagramLink: EAL, mempools, framing, ARP, bursts, idle back-off. Also
// used directly by the raw-rate benchmark (tests/bench/dpdk_raw.cc), so the daemon and the
// baseline share every byte of framing. The implementation's DPDK types stay in the .cc.
class DpdkPort final : public datagram::DatagramLink {
 public:
  // Starts the EAL and the port. `udp_port` 0 means 7610; `default_ip` is used when dpdk.ip is
  // empty. Pools are sized for `window` packets on each of `connections` connections.
  static absl::StatusOr<std::unique_ptr<DpdkPort>> Open(const DpdkOptions& dpdk,
                                                        const std::string& default_ip,
                                                        uint16_t udp_port, uint32_t window,
                                                        uint32_t connections);
  ~DpdkPort() override;

  uint32_t max_datagram_bytes() const override;
  datagram::Ipv4Endpoint local_endpoint() const override;
  bool Send_st(const datagram::Ipv4Endpoint& to, std::span<const uint8_t> head,
               std::span<const uint8_t> body) override;
  void Flush_st() override;
  int Poll_st(datagram::DatagramSink* sink, TimeNs now, TimeNs wait) override;
  uint32_t rx_capacity_packets() const override;
  std::string Describe() const;

  struct Impl;

 private:
  explicit DpdkPort(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class DpdkTransport final : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<DpdkTransport>> Create(const TransportOptions& options,
                                                               const DpdkOptions& dpdk,
                                                               TransportHandler* handler);
  ~DpdkTransport();
  DpdkTransport(const DpdkTransport&) = delete;
  DpdkTransport& operator=(const DpdkTransport&) = delete;

  // Packets arrive in DPDK's buffers: a by_piece target gets each packet's bytes handed over.
  // The port is polled, so there is nothing to sleep on.
  TransportCapabilities capabilities() const override { return {true, -1}; }
  std::string_view backend_name() const override { return "dpdk"; }
  absl::StatusOr<uint16_t> Listen_st() override { return datagram_->Listen_st(); }
  absl::Status AddJob_st(const JobCredentials& job) override { return datagram_->AddJob_st(job); }
  absl::Status RemoveJob_st(uint64_t job_id) override { return datagram_->RemoveJob_st(job_id); }
  absl::StatusOr<PeerHandle> Connect_st(const JobCredentials& job, std::string_view address,
                                        TimeNs now) override {
    return datagram_->Connect_st(job, address, now);
  }
  void Disconnect_st(PeerHandle peer, TimeNs now) override { datagram_->Disconnect_st(peer, now); }
  absl::StatusOr<RegionId> RegisterRegion_st(void* base, uint64_t bytes) override {
    return datagram_->RegisterRegion_st(base, bytes);
  }
  absl::Status UnregisterRegion_st(RegionId region) override {
    return datagram_->UnregisterRegion_st(region);
  }
  absl::Status PostSend_st(PeerHandle peer, const SendSpec& spec) override {
    return datagram_->PostSend_st(peer, spec);
  }
  int Progress_st(TimeNs now, int wait_ms) override { return datagram_->Progress_st(now, wait_ms); }

  uint16_t listen_port() const { return datagram_->listen_port(); }
  TransportStats Stats() const override { return datagram_->Stats(); }
  PeerStats PeerStatsOf(PeerHandle peer) const override { return datagram_->PeerStatsOf(peer); }
  datagram::DatagramStats DatagramStatsNow() const { return datagram_->DatagramStatsNow(); }
  // One line for the log: port, driver, MAC, IP, MTU, zero-copy or not.
  std::string Describe() const;

 private:
  DpdkTransport() = default;
  std::unique_ptr<DpdkPort> port_;
  std::unique_ptr<datagram::DatagramTransport> datagram_;
};

}  // namespace gradlane::transport::dpdk

#endif  // GRADLANE_TRANSPORT_DPDK_DPDK_TRANSPORT_H_
