// transport/verbs/verbs_transport.h — the RDMA verbs backend: segments move by RDMA between
// registered memory (the protocol of verbs_channel.h on libibverbs queue pairs), while a kernel
// TCP connection per peer carries what RDMA cannot: the hello with the job's token and its
// refusals, the verbs set-up fields, goodbye, and liveness.
//
// Why TCP underneath: connect retry and back-off, the token check and its reject codes, the
// job table and the peer-down rules already exist and are tested in tcp::TcpTransport; this
// backend owns one and is its handler. Once the TCP hello is done the dialer sends its
// VerbsHello (queue pair number, PSN, GID, MTU, reply region address and rkey) as a set-up frame
// on that connection; the acceptor creates its queue pair, posts its receives, answers with its
// own VerbsHello, and both move their queue pairs to ready-to-send. Only then is the peer up for
// the engine. Each connection is one direction of segments, as on TCP: the dialer's queue pair
// sends (VerbsSender), the acceptor's receives (VerbsReceiver). The TCP connection going down
// (reset, goodbye, peer_timeout) takes the queue pair with it, and an error completion on the
// queue pair closes the TCP connection: either way pending sends fail in order, then one
// OnPeerDown_st. Liveness: the segments never touch the TCP connection, so its peer_timeout
// cannot see a peer whose daemon stopped (its kernel still answers TCP, its NIC still acks);
// a sender with sends pending and neither a reply nor a completion for peer_timeout fails the
// same way.
//
// Memory: every region the engine registers is registered with the device as well (local write
// and remote write: a region is a send source and a receive target alike; docs/verbs.md says what
// an rkey lets a peer do). Receive targets must lie in registered regions, as on every backend.
// Registrations are shared by range and counted (registration_cache.h): registrar() lets the
// session server register a client's arena on its own thread when the session is set up, and
// RegisterRegion_st of that range on the engine thread is then a lookup. The data path reads the
// keys from the engine thread's own table (region_keys_), never the shared cache.
// Completions: one completion queue for every queue pair, polled in Progress_st; its completion
// channel and the TCP transport's descriptor are both in this backend's wait_fd (an epoll set).
// While a sender waits for replies (memory the peer writes, which raises no event), Progress_st
// does not sleep and HasDeferredWork_st is true.
// Counters: the channels count the data path into this transport's VerbsCounters and the device
// its registrations (verbs_counters.h); Stats() adds the data path to the totals every backend
// reports, and DescribeBackend() lists them all with the device's port counters (sysfs). Each
// channel also counts its connection's bytes, frames, acks and failed sends (PeerSlot), which
// PeerStatsOf adds to the TCP connection's own.
// Thread rules: as every transport (transport/transport.h): `_st` on the engine thread.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_TRANSPORT_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "transport/common/region_table.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#include "transport/verbs/ibv_device.h"
#include "transport/verbs/registration_cache.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_options.h"

namespace gradlane::transport::verbs {

// The key of a set-up frame on the TCP connection: above any engine key (tensor ids are 32-bit).
inline constexpr sched::SegmentKey kVerbsSetupKey = ~sched::SegmentKey{0};

class VerbsTransport final : public Transport, private TransportHandler {
 public:
  // Opens the device (NotFound with a how-to when there is none) and the TCP transport.
  static absl::StatusOr<std::unique_ptr<VerbsTransport>> Create(const TransportOptions& options,
                                                                const VerbsOptions& verbs,
                                                                TransportHandler* handler);
  ~VerbsTransport() override;

  TransportCapabilities capabilities() const override;
  std::string_view backend_name() const override { return "verbs"; }
  absl::StatusOr<uint16_t> Listen_st() override { return tcp_->Listen_st(); }
  absl::Status AddJob_st(const JobCredentials& job) override { return tcp_->AddJob_st(job); }
  absl::Status RemoveJob_st(uint64_t job_id) override;
  absl::StatusOr<PeerHandle> Connect_st(const JobCredentials& job, std::string_view address,
                                        TimeNs now) override;
  void Disconnect_st(PeerHandle peer, TimeNs now) override;
  absl::StatusOr<RegionId> RegisterRegion_st(void* base, uint64_t bytes) override;
  absl::Status UnregisterRegion_st(RegionId region) override;
  // ibv_reg_dmabuf_mr on this thread: GPU memory is pinned by its own driver already, so this
  // is no page walk of host memory (the cost that moved arena registration off this thread).
  absl::StatusOr<RegionId> RegisterDeviceRegion_st(int dmabuf_fd, uint64_t bytes,
                                                   uint64_t iova) override;
  absl::Status PostSend_st(PeerHandle peer, const SendSpec& spec) override;
  int Progress_st(TimeNs now, int wait_ms) override;
  bool HasDeferredWork_st() const override;
  // The TCP connections' counters (hellos, set-up frames), plus the RDMA data path in the totals.
  TransportStats Stats() const override;
  // The connection's TCP frames plus its RDMA data path (its channel's bytes, frames,
  // acknowledgements and failed sends). Any thread.
  PeerStats PeerStatsOf(PeerHandle peer) const override;
  MemoryRegistrar* registrar() override { return &registrar_; }

  // "verbs", the device, port and GID index, every counter of verbs_counters.h and the port's
  // own counters (read from sysfs: a scrape's thread, never the engine's).
  BackendDescription DescribeBackend() const override;

  const IbvDevice& device() const { return *device_; }
  // Every counter of verbs_counters.h now: the data path's and the registrations' (any thread).
  VerbsStats VerbsStatsNow() const;
  // Any thread.
  RegistrationStats registration_stats() const { return cache_->Stats(); }

 private:
  struct Conn;
  class SenderSink;
  class ReceiverSink;
  // MemoryRegistrar on the cache: any thread.
  class Registrar final : public MemoryRegistrar {
   public:
    explicit Registrar(VerbsTransport& t) : t_(t) {}
    absl::Status Pin(void* base, uint64_t bytes) override {
      absl::StatusOr<RegionKeys> keys = t_.cache_->Acquire(base, bytes);
      return keys.ok() ? absl::OkStatus() : keys.status();
    }
    void Unpin(void* base, uint64_t bytes) override { (void)t_.cache_->Release(base, bytes); }

   private:
    VerbsTransport& t_;
  };
  // A connection's data-path counters, by the TCP connection's slot (HandleIndex of its handle,
  // below max_connections), so that PeerStatsOf finds them from any thread without the engine
  // thread's map: `handle` says whose they are now (kNoPeer while they are reset for a new one).
  struct PeerSlot {
    std::atomic<PeerHandle> handle{kNoPeer};
    PeerCounters counters;
  };
  // The engine thread's copy of a region's keys (`registered` false: a zero-length region).
  struct RegionMemory {
    void* base = nullptr;
    uint64_t bytes = 0;
    RegionKeys keys;
    bool registered = false;               // through the cache (host memory)
    std::unique_ptr<IbvMemory> device_mr;  // GPU memory: base is its iova, never dereferenced
  };

  VerbsTransport(const TransportOptions& options, const VerbsOptions& verbs,
                 TransportHandler* handler);

  // TransportHandler of the TCP transport underneath.
  void OnPeerUp_st(const PeerInfo& peer) override;
  void OnPeerDown_st(const PeerInfo& peer, const absl::Status& why) override;
  void OnSendDone_st(const SendCompletion&) override {}
  // Only set-up frames travel on the TCP connections: the dialer acknowledges the acceptor's
  // once its queue pair is ready (below); one that fails means the connection cannot come up.
  void OnSendAcked_st(const SendCompletion& send, TimeNs now) override;
  void OnSendFailed_st(const SendCompletion& send, const absl::Status& why) override;
  RecvTarget ResolveRecv_st(const PeerInfo& peer, const FrameHeader& header) override;
  void OnRecvDone_st(const PeerInfo& peer, const FrameHeader& header, const RecvTarget& target,
                     TimeNs now) override;

  // A new connection `c`: its channels' per-peer counters, reset, now answer for its handle.
  PeerCounters* ClaimPeerCounters_st(const Conn& c);
  absl::Status SendSetup_st(Conn& c);
  absl::Status StartSender_st(Conn& c);
  absl::Status StartReceiver_st(Conn& c);
  void Teardown_st(Conn& c, const absl::Status& why);
  void PollCompletions_st();
  // A sender awaiting its peer with no reply and no completion for peer_timeout: fails it.
  void CheckLiveness_st(Conn& c, TimeNs now);

  TransportOptions options_;
  VerbsOptions verbs_;
  TransportHandler* handler_;
  // Declared before the connections: their channels count into it until they are destroyed.
  VerbsCounters counters_;
  StatCounter peer_timeouts_;  // senders failed by CheckLiveness_st (gradlane_peer_down_total)
  std::unique_ptr<IbvDevice> device_;
  std::unique_ptr<tcp::TcpTransport> tcp_;
  RegionTable regions_;
  // Shared with the registrar's threads; destroyed before the device.
  std::unique_ptr<RegistrationCache> cache_;
  Registrar registrar_{*this};
  std::vector<RegionMemory> region_keys_;   // by RegionId; engine thread
  std::unique_ptr<PeerSlot[]> peer_slots_;  // max_connections of them; written by the engine
  // Set-up frames: one VerbsHello out and one in per connection slot, registered with tcp_.
  std::vector<VerbsHello> setup_;
  RegionId setup_region_ = kNoRegion;
  std::vector<uint32_t> free_setup_slots_;
  absl::flat_hash_map<PeerHandle, std::unique_ptr<Conn>> conns_;
  absl::flat_hash_map<uint32_t, Conn*> by_qp_;
  std::vector<PeerHandle> round_;  // Progress_st's snapshot of the connections
  std::vector<Conn*> failed_;
  std::vector<std::unique_ptr<Conn>>
      graveyard_;  // torn down, freed at the end of Progress_st  // channels that failed inside a
                   // callback: torn down after it
  int epoll_fd_ = -1;
  TimeNs now_ = 0;
};

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_TRANSPORT_H_
