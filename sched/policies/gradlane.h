// sched/policies/gradlane.h — gradlane's own rules (policy name "gradlane-rules"): priority order
// as in ByteScheduler, but the message size, the fusion of small tensors and the credit window
// are derived from what the host measures (link rate B, round-trip time, per-message cost θ,
// bytes per iteration) instead of fixed byte counts, so that one policy fits every model and
// link. The `gradlane` policy (policies/gradlane_selector.h) runs these rules as its first
// candidate and keeps them unless one of the papers' schedules times faster on the job.
//
// The ideal bound assumes preemption at every byte and no per-message cost. A real schedule
// loses to it in two ways, and every rule here trades one against the other:
//   overhead  every message holds the sender's link for θ on top of its bytes;
//   blocking  an urgent gradient that becomes ready waits behind what is already committed
//             (the credit window) and the message on the wire.
//
// Rule 1, message time (GradlaneMessageNs). With N = the host's egress bytes per iteration / B
//   and messages of τ seconds of link time, an iteration pays (N / τ)·θ of overhead, and the one
//   gradient that gates the next forward pass (the last one to become ready) waits behind the
//   window, 2(P + 1)·τ (rule 4). Their sum is smallest at τ = sqrt(N·θ / (2(P + 1))): the
//   overhead share falls as the model grows while the blocking grows only with its square
//   root. τ is kept within [θ, N]. The message size is δ = B·τ (GradlaneMessageBytes), at
//   least a page (kGradlaneMinMessageBytes says why).
// Rule 2, slicing. A ready range is cut into the daemon's key partitions (configured δ_key,
//   default 4 MiB, the same keys as bytescheduler so that the shard map is unchanged) and each
//   partition piece into equal slices of about δ (GradlaneSliceCount): the slice is the
//   preemption granularity. As many slices as round(piece / δ), not ceil: every slice pays θ,
//   and a piece just over δ cut at δ went as a message and a sliver (the balance rule's
//   64 KiB keys at δ ≈ 61 kB: shufflenet_v2 at 10 Gbit/s, W = 8, ρ = 1, 510 messages per host
//   and iteration against 355 in equal slices, 1.172x the bound against 1.134x). Slice j
//   of a partition gets round j of its group (Segment::round, below), so within one priority the
//   queue serves slice j of the group's partitions and of every pulling peer before slice j + 1
//   of any: a big tensor's slices go
//   round-robin over the shard owners (pushes) and over the workers (a shard's pull responses)
//   instead of one owner's partition at a time. Every host follows the same priority order, so
//   front-to-back slices made all W − 1 senders push to the same owner at once: that owner's
//   downlink was shared W − 1 ways while the others idled (vgg16, 1 Gbit/s, W = 8, ρ = 1:
//   1.14x the bound with partitions in key order, 1.05x round-robin). The round-robin runs over
//   groups of P + 1 partitions (GradlaneSliceRound), one group after the other: the daemon
//   reduces a partition and starts its pulls once all of it has arrived, so slices spread over
//   all of a 400 MB tensor's partitions completed none before the whole tensor was through
//   (vgg16, ρ = 1, W = 3 through real daemons, time scale 16: 1.35x the bound; in groups 1.05x,
//   bytescheduler 1.04x). The simulator reduces byte ranges as they arrive, where the groups
//   cost up to 1.6% (alexnet; vgg16 1.3%). The forward pass needs the whole tensor, so the order
//   inside it costs nothing else.
//   Ring hops (ReadyRange::ring_hop, all-reduce) are the exception: within a priority they go
//   in the order they arrived. Each chunk of a tensor is a chain of 2(W − 1) hops around the
//   ring, each waiting for the one before, and all of a host's hops go to one neighbour, so
//   there is nothing to spread; what the order decides is which chain waits. By offset, every
//   host serves the same chunks first whatever their chains' progress, and the ring has a
//   second steady state, each host up to ~1 ms behind its left neighbour, that it never
//   leaves (tiny, 3 Gbit/s, W = 8, ρ = 1: 66.5 ms per iteration from an in-step start, 76–78
//   ms from any other or after three iterations of another schedule; squeezenet1_1 at
//   1 Gbit/s 83 against 95–100 ms). In arrival order each host forwards the chains as the
//   classic ring does, and the ring falls into step from any start (66.5–67.2 and 83.3 ms).
//   docs/simulator.md, "ring hops in arrival order".
// Rule 3, fusion (GradlaneTakeBlock). A dispatch is one message: the most urgent queued slice
//   and, behind it, the next slices *for the same peer in priority order* while the block stays
//   within δ (2δ in the blocks variant, rule 5). Slices for other peers that are passed over stay
//   queued, in order, and go in the next dispatch: each peer's stream keeps the priority order (a
//   block is a prefix of it), so consecutive small tensors of adjacent priority share one θ
//   (Prophet's blocks, PACE's fusion of small tensors) while a big tensor's slices are messages of
//   their own. Nothing is held back to wait for a tensor to fuse with: a backlog forms exactly when
//   the link is busy (the window below is full), and then the queued slices are fused; when the
//   link is idle a lone slice goes at once. This is how the observed ready pattern decides fusion:
//   tensors that arrive faster than the link drains them are fused, tensors that arrive slowly are
//   not.
// Rule 4, window (GradlaneCreditBytes). The window counts link time, not bytes: a dispatch is
//   charged its bytes + θ·B, so a window full of tiny messages is as full as one of big ones
//   (a byte window admits hundreds of tiny messages whose θ then queues in the transport's
//   FIFO, out of the scheduler's reach). Capacity = B·rtt_min (an ack takes one RTT) +
//   2(P + 1) messages, P = the distinct peers this host sends to: a message reaches a receiver
//   whose downlink the other senders share, so it waits there behind messages of each of them
//   before its ack can start back; with fewer in flight the uplink idles while the receivers
//   drain. Measured on vgg16 at 1 Gbit/s, W = 3, ρ = 1: 2 messages 1.22x the bound (uplink
//   idle 18%), P + 1 = 3 messages 1.13x, 2(P + 1) = 6 1.09x; a fixed 8 MiB 1.02x (these with
//   slices in key order). At W = 8 the first version measured 1.31x, not because 2(P + 1) is
//   short but because its floor restarted from the smoothed RTT whenever the rate estimate
//   swung by 2x, which it does under incast: windows of 15–55 MB. With the floor below and
//   round-robin slices (rule 2) it is 1.05x (a fixed 16 MiB: 1.03x; 4(P + 1) messages: 1.05x).
//   rtt_min is the smallest RTT reported in the job's life: every sample includes
//   serialization and this host's and the receivers' queues, which would inflate the window it
//   sizes, so no sample is trusted to replace a smaller floor. A floor expiring after 10 s
//   (BBR's RTprop window) gave way to such samples within one vgg16 iteration at 1 Gbit/s
//   (1.08x instead of 1.05x). The price: after a route change to a longer path the window is
//   short by B·(new RTT − old), which the 2(P + 1) messages absorb while that is less than
//   2(P + 1)·τ; the daemon builds a new policy per job.
//   Run term: + δ_key·(P − 1)/P. Every host follows the same priority order and a key
//   partition (δ_key) has one owner, so all P senders of a receiver send it their run of up to
//   δ_key at once, and it drains each run at B/P: when this host has sent its run, (P − 1)/P of
//   it is still queued there. Without room for that besides the 2(P + 1) messages for the other
//   receivers, the uplink idles until the run drains. The messages alone shrink with θ (δ ∝
//   sqrt θ) and the run does not: at the measured θ = 3 µs, resnet50 at 1 Gbit/s, W = 8, ρ = 1
//   was 1.63x the bound without the term, 1.28x with it (bytescheduler's 16 MiB: 1.25x); at
//   W = 3 1.18x → 1.04x. With one peer there is no other sender and no term.
//   Admission (WindowAdmitsBlock): a dispatch waits until the window has room for a whole
//   message, min(δ, queued bytes), not merely for the head segment: otherwise every ack's
//   refund is spent at once on a block of that size, and a backlog of small tensors goes as
//   many small messages, each paying θ.
// Rule 5, adaptation. Every OnLinkEstimate and every completed iteration re-derives δ and the
//   window: a bandwidth change reshapes both within one estimate. The outer loop is not the
//   BO tuner (bo_tuner.h: tens of trials over continuous knobs) but gradlane_selector.h: one
//   trial each of a handful of whole schedules, because where these rules lose it is mostly to
//   a different kind of schedule (prophet's blocks, fifo's whole tensors). Two of those
//   schedules are these rules with half and twice rule 4's window (GradlaneVariant): what
//   rule 4 cannot see is how deep the receivers' queues run — how many senders reach a receiver
//   at once and how long their runs to it are, which the keys' sizes and the ready pattern
//   decide — and the best window is up to 2x either side of it. Measured at θ = 3 µs, ρ = 1
//   (rules alone, window x1/2, x1, x2): efficientnet_b0 1 Gbit/s W 3 1.155, 1.204, 1.336 the
//   bound; densenet121 there 1.100, 1.147, 1.251; vit_b_16 3 Gbit/s W 8 1.264, 1.191, 1.091;
//   bert-base ρ 2 1 Gbit/s W 8 1.263, 1.169, 1.074. Neither a run term sized from the
//   partitions actually in flight (1.16 and 1.33 on efficientnet_b0 and resnet50 at W 8,
//   against 1.20 and 1.28) nor any one factor fits both kinds; a trial of each does.
//   A third is these rules with blocks (rule 3) of up to 2δ, slices and window unchanged
//   (GradlaneVariant::kDoubleBlocks): rule 1 charges every message the blocking of the one
//   gradient that gates the next forward pass, but a block fused from a backlog delays only
//   what becomes ready while it is on the wire, and how much does is the ready pattern's and
//   the incast's. At W = 8 on squeezenet1_1 (10 Gbit/s, ρ 1; 268 messages per host and
//   iteration, 10% of it θ) blocks of 2δ are 1.08x the bound against the rules' 1.12x; of 60
//   sample rows they are faster on 7 and up to 8% slower on 25 (resnet152 at 10 Gbit/s, W 8:
//   1.16x against 1.08x).
//
// The figures above are the simulator's at θ = 50 µs (its default before tests/bench/theta.sh
// measured 3 µs) unless they say otherwise; docs/simulator.md has every row at both.
//
// θ is PolicyConfig::per_message_overhead_ns (the daemon's measured per-message cost; the
// simulator passes its own θ). Its absence (0) makes the rules degenerate to τ = 0: use 1 µs.
//
// Thread rules and allocation: as Policy. No allocation in OnReady/NextDispatch/OnAcked once
// the queue, the passed-over stash and the in-flight list have grown to their working size.
#ifndef GRADLANE_SCHED_POLICIES_GRADLANE_H_
#define GRADLANE_SCHED_POLICIES_GRADLANE_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "sched/policy.h"
#include "sched/ready_queue.h"

namespace gradlane::sched {

inline constexpr uint64_t kGradlaneDefaultKeyPartitionBytes = 4ull << 20;
// Slices are cut at multiples of this so that every dtype's elements stay whole.
inline constexpr uint64_t kGradlaneSliceAlignBytes = 8;
// How many passed-over slices (other peers) one fusion scan may look past.
inline constexpr size_t kGradlaneMaxPassedOver = 256;
// The smallest message rule 1 makes: one page. δ follows the *measured* rate, and δ ∝ sqrt(B)
// (τ grows as N = bytes/B does), so an estimate taken while a peer is not yet draining (a job
// whose daemons start seconds apart on a loaded host: a first sample of a few kB/s) asked for
// messages of ~150 B. Their per-message cost then holds the measured rate down and the estimate
// never recovers: one rank of a verbs job sent 57,000 segments for what 5,000 carry and crawled
// for 30 s. Below a page every transport here pays its fixed per-message cost (a system call
// or a work request, a completion, a header) for almost nothing; a page is 33 µs of a 1 Gbit/s
// link, so as a floor it never costs a preemption that matters. In the simulator (six
// small-tensor and mid-size profiles × 1/10 Gbit/s × W 3/8) it changed 1 of 24 runs at θ = 3 µs
// (by 0.001%) and 4 of 24 at θ = 1 µs (−0.5% to +0.7%): only the first, low estimates of a
// run ask for less.
inline constexpr uint64_t kGradlaneMinMessageBytes = 4096;

// Rule 1: link time of one message, sqrt(N·θ / (2(P + 1))) within [θ, max(θ, N)], P = peers.
TimeNs GradlaneMessageNs(TimeNs comm_per_iteration_ns, TimeNs per_message_ns, uint32_t peers);
// δ = B·τ, aligned down to kGradlaneSliceAlignBytes, at least kGradlaneMinMessageBytes.
uint64_t GradlaneMessageBytes(double bytes_per_s, TimeNs message_ns);
// Rule 4: capacity in charged bytes = B·rtt_min + 2(P + 1)·(δ + θ·B) + run·(P − 1)/P,
// P = peers, run = the most this host sends one receiver back to back (a key partition).
uint64_t GradlaneCreditBytes(double bytes_per_s, TimeNs rtt_min, uint64_t message_bytes,
                             TimeNs per_message_ns, uint32_t peers, uint64_t run_bytes);
// What a dispatch of `bytes` costs the window: its bytes plus θ·B.
uint64_t GradlaneChargeBytes(uint64_t bytes, double bytes_per_s, TimeNs per_message_ns);

// Rule 2: how many slices a key piece of `piece_bytes` is cut into: round(piece / δ), at least
// 1. Every slice is one more θ, so a piece under 1½δ goes whole rather than as δ and a sliver,
// and a longer one goes in slices of ¾δ to 1¼δ.
uint64_t GradlaneSliceCount(uint64_t piece_bytes, uint64_t message_bytes);
// Where slice k of `count` starts within a piece of `piece_bytes`: k·piece / count rounded down to
// kGradlaneSliceAlignBytes (piece_bytes for k >= count). The slices' lengths differ by less
// than twice the alignment, so no slice is a sliver.
uint64_t GradlaneSliceStart(uint64_t piece_bytes, uint64_t count, uint64_t k);

// Rule 2: Segment::round of slice `slice` of key partition `partition`: partitions go in groups
// of `group` (P + 1), and within a group slice j of every partition before slice j + 1 of any.
uint32_t GradlaneSliceRound(uint32_t partition, uint64_t slice, uint32_t group);

// Rule 3: pops from `queue` the most urgent segment and, behind it, the following segments for
// the same peer and iteration while the block's bytes stay <= block_bytes; segments for other
// peers that were passed over are pushed back. `passed_over` is scratch storage (cleared; reused).
// Requires a non-empty queue. Returns the block's bytes.
uint64_t GradlaneTakeBlock(ReadyQueue& queue, uint64_t block_bytes,
                           std::vector<Segment>& passed_over, std::vector<Segment>& block);

// The rules as derived, and the outer loop's variants of them (rule 5): half or twice rule 4's
// window, or blocks (rule 3) of up to twice δ.
enum class GradlaneVariant : uint8_t { kRules, kHalfWindow, kDoubleWindow, kDoubleBlocks };

// The policy's name for each variant: "gradlane-rules", "gradlane-rules-window/2",
// "gradlane-rules-window*2", "gradlane-rules-blocks*2" (the outer loop's candidate names).
constexpr std::string_view GradlaneRulesName(GradlaneVariant variant) {
  switch (variant) {
    case GradlaneVariant::kHalfWindow:
      return "gradlane-rules-window/2";
    case GradlaneVariant::kDoubleWindow:
      return "gradlane-rules-window*2";
    case GradlaneVariant::kDoubleBlocks:
      return "gradlane-rules-blocks*2";
    case GradlaneVariant::kRules:
      break;
  }
  return "gradlane-rules";
}

class GradlanePolicy final : public Policy {
 public:
  // config is already validated by MakePolicy. A fixed config.credit_bytes is not scaled.
  static std::unique_ptr<GradlanePolicy> Create(const PolicyConfig& config,
                                                GradlaneVariant variant = GradlaneVariant::kRules);

  std::string_view name() const override { return GradlaneRulesName(variant_); }
  void RegisterTensor(const TensorSpec& tensor) override;
  void OnReady(const ReadyRange& range, TimeNs now) override;
  void OnObservedReady(const ReadyRange& range, TimeNs now) override;
  bool NextDispatch(TimeNs now, Dispatch& out) override;
  void OnAcked(uint64_t bytes, TimeNs now) override;
  TimeNs NextWakeup(TimeNs now) const override;
  void OnLinkEstimate(double bytes_per_s, TimeNs rtt) override;
  size_t queued_segments() const override { return queue_.size(); }
  // Bytes committed and not yet acknowledged (the contract's unit); the window itself counts
  // charged bytes: charged_in_use().
  uint64_t credit_in_use() const override { return bytes_in_flight_; }
  uint64_t charged_in_use() const { return in_use_; }

  // Introspection (metrics, tests).
  uint64_t message_bytes() const { return message_bytes_; }
  // The window in charged bytes (rule 4); its admission rule is CreditWindow's: a dispatch is
  // admitted if nothing is in flight or it fits. (CreditWindow itself has a fixed capacity.)
  uint64_t credit_capacity() const { return capacity_; }
  TimeNs rtt_min() const { return rtt_min_; }
  double bandwidth_bytes_per_s() const { return bandwidth_; }
  uint64_t iteration_bytes() const { return iteration_bytes_; }
  uint32_t peers() const { return peers_; }

 private:
  GradlanePolicy(uint64_t key_partition_bytes, uint64_t fixed_credit_bytes, TimeNs overhead,
                 double bandwidth, GradlaneVariant variant);

  // Re-derives δ and the window from the current estimates (rules 1 and 4).
  void Resize();
  // Rule 4's admission: nothing in flight, or room for the head's block at its full size
  // (min(δ, queued bytes), at least the head segment).
  bool WindowAdmitsBlock() const;
  void CountBytes(const ReadyRange& range);

  uint64_t key_partition_bytes_;
  uint64_t fixed_credit_bytes_;  // PolicyConfig::credit_bytes; 0 = rule 4
  GradlaneVariant variant_;
  TimeNs overhead_;   // θ
  double bandwidth_;  // B, bytes/s
  TimeNs rtt_min_ = kNever;

  // Egress bytes per iteration: the latest iteration's running count and the previous one's.
  bool has_iteration_ = false;
  int64_t iteration_ = 0;
  uint64_t current_bytes_ = 0;
  uint64_t previous_bytes_ = 0;
  uint64_t iteration_bytes_ = 0;  // max(previous, current): N·B

  uint64_t message_bytes_ = 0;   // δ
  std::vector<bool> peer_seen_;  // by peer rank (16 bits)
  uint32_t peers_ = 0;           // P: distinct peers this host has sent to
  // Rule 2's ring hops: the next one's Segment::round, restarted whenever the queue is empty,
  // so it only wraps with 2^32 hops queued at once (then newer hops would overtake older ones
  // of their priority: order only, nothing lost).
  uint32_t ring_arrival_ = 0;
  uint64_t capacity_ = 0;
  uint64_t in_use_ = 0;  // charged bytes in flight
  uint64_t bytes_in_flight_ = 0;
  ReadyQueue queue_;
  std::vector<Segment> passed_over_;
  struct InFlight {
    uint64_t bytes;
    uint64_t charge;
  };
  std::vector<InFlight> in_flight_;  // committed, oldest first from in_flight_head_
  size_t in_flight_head_ = 0;
  uint64_t acked_unmatched_ = 0;  // acked bytes not yet covering the oldest dispatch
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICIES_GRADLANE_H_
