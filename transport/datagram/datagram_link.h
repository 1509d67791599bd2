// transport/datagram/datagram_link.h — the unreliable link under the reliable datagram protocol,
// and where it hands received datagrams.
//
// The protocol (datagram_transport.h) sees the network only through this interface, so the same
// code runs over a NIC port (transport/dpdk/), over an in-memory lossy pipe on virtual time in
// the unit tests, and under a fault-injecting wrapper (faulty_link.h). A link may lose, reorder
// or duplicate datagrams; it must not corrupt or cut them.
//
// Thread rules: every `_st` method on the engine thread that owns the protocol; the sink is
// called on that thread, from inside Poll_st.
#ifndef GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_LINK_H_
#define GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_LINK_H_

#include <cstdint>
#include <span>

#include "sched/types.h"
#include "transport/datagram/ipv4_udp.h"

namespace gradlane::transport::datagram {

using sched::TimeNs;

// Where received datagrams go.
class DatagramSink {
 public:
  virtual ~DatagramSink() = default;
  // `bytes` is valid during the call only (it lies in the port's receive buffer).
  virtual void OnDatagram_st(const Ipv4Endpoint& from, std::span<const uint8_t> bytes,
                             TimeNs now) = 0;
};

// The unreliable link under the protocol: the DPDK port in production, a lossy pipe in tests.
class DatagramLink {
 public:
  virtual ~DatagramLink() = default;
  // Largest datagram (UDP payload) one send may carry; at least kMinDatagramBytes.
  virtual uint32_t max_datagram_bytes() const = 0;
  // This end's address (the port is what Listen_st reports).
  virtual Ipv4Endpoint local_endpoint() const = 0;
  // Queues one datagram of head + body. `head` is copied; `body` may be referenced instead
  // (zero-copy): it stays valid until the send it belongs to is acknowledged or failed. False:
  // no room right now (nothing was queued; try again on a later step).
  virtual bool Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
                       std::span<const uint8_t> body) = 0;
  // Puts queued datagrams on the wire.
  virtual void Flush_st() = 0;
  // Hands received datagrams to `sink`. With none ready and wait > 0, waits for one up to
  // `wait` (backing off, so an idle daemon does not hold a core). Returns datagrams handed over.
  virtual int Poll_st(DatagramSink* sink, TimeNs now, TimeNs wait) = 0;
  // Datagrams the port holds for us between two polls before it drops (a NIC's RX descriptors,
  // an af_packet ring's frames); 0: unknown.
  virtual uint32_t rx_capacity_packets() const { return 0; }
};

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_LINK_H_
