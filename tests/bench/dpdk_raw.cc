// dpdk_raw — the raw rate of a DPDK port: a plain sender/receiver of full-size UDP datagrams
// through the same DpdkPort (EAL, framing, ARP, bursts) as the daemon's DPDK transport, without
// the reliable protocol, the engine or shared memory. tests/bench/dpdk_goodput.sh runs it beside
// the daemons' measurement, the baseline of the same vdev in the same run: a sender on one host
// and a receiver on the other (one way), and one --mode=both per host (both ways at once, one
// polling process per host as with the daemons).
//
//   dpdk_raw --vdev=net_af_packet0,iface=eth0,... --ip=A --peer=B --mode=send|recv|both
//            [--seconds=4] [--mtu=9000] [--file_prefix=P] [--lcore=0] [--port=7620]
// Prints one line: "dpdk_raw mode=... rx_gbps=X tx_gbps=Y" — rates of UDP payload bytes: a
// receiver over `seconds` − 1 s from half a second after its first datagram, a sender over its
// run less the first and last half second.
#include <time.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "transport/dpdk/dpdk_transport.h"

ABSL_FLAG(std::string, vdev, "", "DPDK virtual device");
ABSL_FLAG(std::string, eal_args, "", "verbatim EAL arguments (instead of --vdev etc.)");
ABSL_FLAG(std::string, ip, "", "our IPv4 address");
ABSL_FLAG(std::string, peer, "", "peer IPv4 address");
ABSL_FLAG(std::string, mode, "both", "send, recv or both");
ABSL_FLAG(double, seconds, 4, "how long to send / receive");
ABSL_FLAG(uint32_t, mtu, 0, "port MTU (0: the port's)");
ABSL_FLAG(std::string, file_prefix, "", "EAL file prefix");
ABSL_FLAG(int32_t, lcore, 0, "EAL lcore");
ABSL_FLAG(uint32_t, port, 7620, "UDP port (both ends)");

namespace {

using gradlane::sched::TimeNs;
namespace dp = gradlane::transport::dpdk;
namespace dg = gradlane::transport::datagram;

TimeNs sched_second() { return gradlane::sched::kSecond; }

TimeNs Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<TimeNs>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Receivers measure from half a second after the first datagram, for `window`, so a sender
// started a little later (another process, another host) is measured at full speed only.
struct Counter final : dg::DatagramSink {
  bool counting = true;
  TimeNs window = 0;
  TimeNs from = 0, to = 0;
  uint64_t bytes = 0;
  void OnDatagram_st(const dg::Ipv4Endpoint&, std::span<const uint8_t> b, TimeNs now) override {
    if (!counting) return;
    if (from == 0) {
      from = now + 500 * gradlane::sched::kMillisecond;
      to = from + window;
    }
    if (now >= from && now < to) bytes += b.size();
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const bool send = mode == "send" || mode == "both";
  const bool recv = mode == "recv" || mode == "both";
  if (!send && !recv) {
    std::fprintf(stderr, "dpdk_raw: --mode must be send, recv or both\n");
    return 2;
  }
  dp::DpdkOptions o;
  o.vdev = absl::GetFlag(FLAGS_vdev);
  o.eal_args = absl::GetFlag(FLAGS_eal_args);
  o.ip = absl::GetFlag(FLAGS_ip);
  o.mtu = absl::GetFlag(FLAGS_mtu);
  o.file_prefix = absl::GetFlag(FLAGS_file_prefix);
  o.lcore = absl::GetFlag(FLAGS_lcore);
  o.memory_mb = 256;
  auto port = dp::DpdkPort::Open(o, o.ip, static_cast<uint16_t>(absl::GetFlag(FLAGS_port)), 256, 1);
  if (!port.ok()) {
    std::fprintf(stderr, "dpdk_raw: %s\n", std::string(port.status().message()).c_str());
    return 1;
  }
  auto peer_ip = dg::ParseIpv4(absl::GetFlag(FLAGS_peer));
  if (send && !peer_ip.ok()) {
    std::fprintf(stderr, "dpdk_raw: --peer: %s\n", std::string(peer_ip.status().message()).c_str());
    return 2;
  }
  const dg::Ipv4Endpoint to{peer_ip.ok() ? *peer_ip : 0,
                            static_cast<uint16_t>(absl::GetFlag(FLAGS_port))};
  std::fprintf(stderr, "dpdk_raw: %s\n", (*port)->Describe().c_str());
  const uint32_t dgram = (*port)->max_datagram_bytes();
  std::vector<uint8_t> payload(dgram, 0x5A);
  const std::span<const uint8_t> head(payload.data(), 64);
  const std::span<const uint8_t> body(payload.data() + 64, dgram - 64);

  const TimeNs secs = static_cast<TimeNs>(absl::GetFlag(FLAGS_seconds) * 1e9);
  const TimeNs start = Now();
  const TimeNs end = start + secs;
  Counter rx;
  rx.counting = recv;
  rx.window = secs - sched_second();
  const TimeNs tx_from = start + 500 * gradlane::sched::kMillisecond,
               tx_to = end - 500 * gradlane::sched::kMillisecond;
  uint64_t tx_bytes = 0;
  // A receiver runs until its window (which starts with the first datagram) is over, at most
  // `seconds` + 10 s; a sender stops at `end`.
  for (TimeNs now = start;; now = Now()) {
    if (recv && (rx.to != 0 ? now >= rx.to : now >= end + 10 * gradlane::sched::kSecond)) break;
    if (!recv && now >= end) break;
    (void)(*port)->Poll_st(&rx, now, 0);  // also answers and learns ARP
    if (send && now < end) {
      for (int i = 0; i < 32; ++i) {
        if (!(*port)->Send_st(to, head, body)) break;
        if (now >= tx_from && now < tx_to) tx_bytes += dgram;
      }
      (*port)->Flush_st();
    }
  }
  const double window = static_cast<double>(recv ? rx.window : tx_to - tx_from) / 1e9;
  std::printf("dpdk_raw mode=%s datagram=%u rx_gbps=%.3f tx_gbps=%.3f\n", mode.c_str(), dgram,
              static_cast<double>(rx.bytes) * 8 / window / 1e9,
              static_cast<double>(tx_bytes) * 8 / window / 1e9);
  return 0;
}
