// sched/sim/simulator.h — a deterministic discrete-event simulator of data-parallel training in
// co-located parameter-server mode or ring all-reduce mode, driving the very same Policy code
// the daemon runs.
//
// What is modelled (docs/simulator.md has the long form):
//  * W hosts; each is a worker (one GPU) and a parameter-server shard. Gradient bytes are cut
//    into shard partitions (SimConfig::shard_partition_bytes, finer where the balance rule of
//    sched/shard_balance.h says so: ShardUnitBytes) assigned to shards by bytes (largest first
//    onto the least-loaded shard), once, identically for every policy.
//  * Each host has a full-duplex link: an uplink and a downlink of `bandwidth` each. A message
//    of m bytes holds the sender's uplink for overhead + m/B (FIFO, in commit order). Its first
//    bit reaches the receiver overhead + latency after the uplink started it; the receiver's
//    downlink carries it cut-through, FIFO in arrival order, for m/B (the switch buffers what
//    waits). The message is delivered when its last byte leaves the downlink; the ack reaches
//    the sender `latency` later and returns the policy's credit.
//  * One Policy per host is the egress scheduler for its pushes and for its shard's pull
//    responses. Segments of one Dispatch for the same peer travel as one message. Policies get
//    link estimates as in the daemon (SimConfig::live_link_estimates).
//  * The local shard's contribution and result need no network. A shard aggregates a byte range
//    of a key once all W contributions of it arrived, on one summing engine per shard at
//    `aggregation_bytes_per_s` over the W·m input bytes (0: instantaneous), and then hands the
//    result to its policy for every remote worker.
//  * Compute per worker, from the profile: forward layer by layer, where layer i of iteration
//    k+1 waits for layer i's pulled result of iteration k (ByteScheduler §3.4: the barrier is
//    gone, dependencies are per layer); then backward, gradients posted at their ready times.
//    The GPU runs one thing at a time.
//
// The ideal bound (SimulateIdeal) is the largest of 2W single-port relaxations and the laggard
// chain (below). Relaxation p
// keeps everything of a policy run — workers, profile, key → shard assignment, latency — except
// that (1) every port but p (one host's uplink or downlink) has infinite bandwidth, (2) there is
// no per-message overhead, no aggregation time and no credit window, and (3) port p carries
// bytes as a fluid (tiny pieces, SimConfig::ideal_granularity_bytes), preempting at every piece,
// earliest due date first: older iteration first, then by when the next forward needs the byte
// (Σ fwd of the layers before its layer) minus what it still travels after p (a push one
// latency more than a pull). SimConfig::priorities does not enter: those are a policy input.
// Why it is a lower bound:
//  * any policy run is a feasible schedule of relaxation p (it only ever waits longer), so the
//    optimum of relaxation p is ≤ the policy's iteration time;
//  * relaxation p has one constrained resource. The forward pass reaches layer i no earlier than
//    every byte it needs has crossed p and travelled on, so the forward's delay is the maximum
//    lateness of those bytes against their due dates; with release times (gradients ready) and
//    preemption, earliest-due-date first minimises maximum lateness (Horn's rule for
//    1|r_j,pmtn|Lmax, the exchange argument behind ByteScheduler Thm 1), and earlier
//    completions only move later releases earlier: it is the optimum of relaxation p;
//  * hence max_p T(p) ≤ every policy — exactly for the time from a cold start to the end of
//    any iteration (SimResult::total_ns); a windowed mean only once the window is long enough
//    for the steady state. The pieces make it an approximation of the fluid limit, off by at
//    most one piece time at p per preemption (≤ 20 µs at ≥ 6.5 Gbit/s): well below the θ every
//    policy pays per message. A randomised test checks the bound against every policy on
//    hundreds of small models and configs.
// The laggard chain (ps mode) is the other half of the bound, for what no single port sees: with
// every other port free, relaxation p lets its own host run ahead and send the others' pulls during
// its next iteration's compute, so hosts drift apart in a way no real network allows (one 2 MiB
// layer on W = 2 at 1 Gbit/s: the relaxations give 16.8 ms, every schedule takes 19.8). Let G(k) be
// the latest start, over the workers, of the last layer's forward in iteration k, and λ a worker
// that starts it then. Every pull of iteration k needs λ's gradient, ready fc + r_l after G(k) (fc:
// the last layer's forward, r_l: the layer's ready time), and λ's own pushes need it too; a pull of
// layer l must reach its worker before that worker's forward of l, which is at least tail_l = Σ fwd
// of layers l..n−2 before G(k + 1), so λ's uplink sends it by G(k + 1) − tail_l − latency, and a
// push by G(k + 1) − tail_l − 2·latency (it crosses to the shard and comes back). On one port with
// releases, deadlines and preemption the work inside every window [α, D − β] must fit (Horn), so
// G(k + 1) − G(k) ≥ D = max over α, β of α + β + the work released at or after α and due at or
// before D − β, and ≥ C. Which worker lags is the schedule's choice: the chain takes the worker
// whose D is least. From a cold start, T(K) ≥ (W − 1)·start skew + C + (K − 1)·D. Each message's
// wire time is rounded to the nearest ns, so the work counts 1 ns per 4 KiB short (enough with θ ≥
// 1 ns, where none is needed, and with θ = 0 for messages of 4 KiB on average). The bound's
// iteration_ns are D each, a steady-state figure: over m measured iterations a policy's mean is at
// least ((m − 1)·D + C)/m, since iterations are measured from start to start and the chain steps G.
// SimulateFluid, for reference only, constrains every port at once with the same fluid priority
// schedule: closer to what a perfect scheduler could achieve, but greedy priority is not optimal
// on a network of ports, so it is NOT a bound (a policy can beat it when the shards are
// unevenly loaded and the links are the bottleneck).
//
// All-reduce mode (SimConfig::mode = SimMode::kAllReduce) replaces the parameter server by ring
// all-reduce among the W hosts; links, θ, latency, acks, credit, compute and the metrics are as
// above. Every tensor is cut into partitions of SimConfig::shard_partition_bytes (the unit of
// preemption), each partition into W chunks at 4-byte (f32 element) boundaries, chunk c of a
// partition holding elements [⌊e·c/W⌋, ⌊e·(c+1)/W⌋) of its e (the last chunk also takes any
// bytes past the last whole element; empty chunks are skipped). Chunk c's ring is 2(W−1) hops,
// hop j going from host c+j to host c+j+1 (mod W): hops 0..W−2 are the reduce-scatter (in step
// s host r sends chunk r−s to r+1), hops W−1..2W−3 the all-gather. Each hop is one ReadyRange
// fed to the sender's Policy (kPush for reduce-scatter, kPull for all-gather, peer = the right
// neighbour, the tensor's priority, ring_hop set), which cuts and orders it as it does pushes
// and pulls. A
// host sends its reduce-scatter hop of a chunk once its own gradient is ready and (hop ≥ 1) the
// whole chunk from the left arrived and was summed with its contribution (2·chunk input bytes on
// the host's summing engine at aggregation_bytes_per_s); the host where the reduce-scatter ends
// (c−1) owns the sum and starts the all-gather; the others forward the whole chunk once it
// arrived. A tensor's result is complete on a host when it holds the final value of every
// chunk; layer i of the next forward waits for that, as in ps mode. Every host's uplink carries
// 2(W−1)/W of every tensor's bytes (up to element rounding), so ρ means the same in both modes.
//
// The all-reduce bound (SimulateIdeal in all-reduce mode) is one run of a relaxation R that keeps
// the workers, their compute and the chunk layout and replaces the network by two necessary
// conditions on when worker w may have tensor i's result of iteration k:
//  (a) the ring chain: every hop of a chunk starts no earlier than the previous hop arrived and
//      (reduce-scatter and the owner's first all-gather hop) the sender's gradient is ready, and
//      arrives no earlier than chunk bytes/B + latency after it started (less 1 ns per 4 KiB,
//      so that a policy's segment times, rounded to whole ns, cannot undercut it): R runs the
//      ring with every hop taking exactly that, with no contention, no θ, no summing time;
//  (b) the uplink of the left neighbour h = w−1: every byte h sends of tensor i in the ring is
//      needed by w's result (all-gather hops directly, reduce-scatter hops through the owner's
//      sum), and none can leave before h's own gradient of i is ready (all-gather hops carry
//      sums that include it). R gives each uplink a fluid port (pieces as in the ps bound) that
//      carries, per tensor and iteration, the bytes its host sends of it, released when the
//      host's gradient is ready, preemptive, earliest due date first: older iteration first,
//      then Σ fwd of the layers before the tensor's layer (also 1 ns per 4 KiB faster than the
//      link, as in (a)); w gets the result one latency after h's port finished it, and only once
//      (a) holds too.
// Why it is a lower bound: in any policy run both conditions hold (a message holds the uplink for
// θ + m/B and is delivered ≥ latency after its last byte left; a chunk hop can only be forwarded
// whole), so every run is a feasible schedule of R, and R's ports are independent of each
// other (each only feeds its right neighbour). Given the ready times, worker w's backward start
// of iteration k+1 is Σfwd + max(its previous backward end, max_i (result_i − Σ fwd before i))
// and its next start is max(previous backward end, result_0): with (a) fixed by the ready times,
// they are minimised by the schedule of port w−1 that minimises the maximum lateness of
// iteration k's jobs against Σ fwd before their layer and layer 0's completion — earliest due
// date first (Horn's rule for 1|r_j,pmtn|Lmax; layer 0 has the earliest due date), after the
// older iterations, which never hurts (w can use iteration k+1's results only after a backward
// that needs every result of iteration k). Induction over iterations: every ready time and start
// of R is ≤ that of any run, so T_R ≤ the policy's total_ns, for every prefix of iterations. The
// latency counted is only what every schedule pays: one per hop of the chain, one after h's
// last byte. With one tensor and no compute overlap the bound is C + 2(W−1)·(chunk/B +
// latency): the ring time of a policy run less its θ and summing time. A randomised test checks
// it against every policy on many small models and configs.
//
// Metrics (per measured iteration, averaged):
//  * Iteration k starts when worker w starts iteration k's first forward layer: S(k,w).
//    T(k) = max_w S(k+1,w) − max_w S(k,w). iteration_ns is the mean over measured iterations.
//  * C = ModelProfile::ComputeNs() (forward + backward). gpu_idle_share = (T − C) / T.
//  * N (communication time) = the busiest link direction's bytes per iteration / B: the time the
//    network needs with no overlap, the same for every policy on a profile and config.
//  * α (TicTac §3.2 overlap coefficient) = (N + C − T) / min(N, C). 1: the shorter of
//    communication and compute is hidden completely; 0: no overlap; negative: slower than
//    running them back to back (overheads, latency chains). NaN if N = 0.
//  * ρ (docs/design.md §5) = (2(W−1)/W · model bytes / B) / C.
//
// Guarantees: deterministic (no clock, no randomness; ties between simultaneous events are
// broken by a sequence number in insertion order; containers iterated are ordered). No I/O.
// Errors, not crashes: an invalid config, a policy that cannot be built, a policy that breaks
// the Policy contract or stalls with data queued are returned as a Status.
#ifndef GRADLANE_SCHED_SIM_SIMULATOR_H_
#define GRADLANE_SCHED_SIM_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sched/model_profile.h"
#include "sched/policy.h"
#include "sched/types.h"

namespace gradlane::sched::sim {

// How gradients are exchanged (see the header comment).
enum class SimMode : uint8_t {
  kParameterServer,  // co-located parameter servers, one shard per host (the default)
  kAllReduce,        // ring all-reduce: reduce-scatter then all-gather, per partition
};

// "ps" / "allreduce".
std::string_view SimModeName(SimMode mode);

struct SimConfig {
  SimMode mode = SimMode::kParameterServer;
  int workers = 3;
  // Per direction, per host.
  double bandwidth_bits_per_s = 10e9;
  // θ: the time the sender's link is busy per message besides the bytes (RPC framing, ack
  // handling, syscall). ByteScheduler measured ≈300 µs in its testbed; gradlaned's, measured by
  // tests/bench/theta.sh (docs/benchmarks.md, "Per-message cost θ"), is 2.4–3.8 µs over TCP
  // when the daemons' CPU is the bottleneck (≈0 when the link is): 3 µs, the mean of three runs.
  // Was 50 µs before that measurement.
  TimeNs overhead_ns = 3 * kMicrosecond;
  // One-way latency (propagation + switch), applied to every message and every ack.
  TimeNs latency_ns = 25 * kMicrosecond;
  // Summing rate of a shard over input bytes (W·m per m-byte range); 0 = instantaneous.
  // 50 GB/s is a few vectorised cores: fast next to any link modelled here.
  double aggregation_bytes_per_s = 50e9;
  // Granularity of the key → shard assignment (BytePS's 4 MB partitions). All-reduce mode: the
  // ring's partition size, each partition cut into W chunks.
  uint64_t shard_partition_bytes = 4ull << 20;
  // ps mode: cut the keys finer than shard_partition_bytes where the shards would otherwise be
  // unevenly loaded, by the daemon's rule (sched/shard_balance.h; ShardUnitBytes below). Off:
  // the plain shard_partition_bytes map (the daemon before the rule, BytePS's fixed keys).
  bool balance_shards = true;
  // Even and long enough that period-2 patterns (a policy alternating a long and a short
  // iteration) average out; the first iteration has no pull to wait for and is always short.
  int warmup_iterations = 3;
  // Host w starts its first iteration at w · start_skew_ns (0: every host at once). Daemons
  // never start in step; in all-reduce mode a schedule can have one steady state from an
  // in-step start and another from any other (docs/simulator.md, "ring hops in arrival order").
  TimeNs start_skew_ns = 0;
  int measured_iterations = 10;
  // Piece size of the ideal bound; 0 = auto: 20 µs of link time, clamped to [16 KiB, 1 MiB].
  uint64_t ideal_granularity_bytes = 0;
  // Each policy is first told the configured bandwidth and the round trip of a small message
  // (θ + 2·latency). With live estimates on, every acknowledged dispatch also feeds the host's
  // sched/bandwidth_estimator.h and the policy gets its estimate, as in the daemon.
  bool live_link_estimates = true;
  // Per-layer priorities (0 = most urgent); empty = layer index.
  std::vector<Priority> priorities;
  // Safety valve against a runaway policy (one that keeps waking up but never lets a layer's
  // compute finish): the run fails after this many events with no compute finishing on any
  // worker. Not a cap on the whole run: how many events a run needs grows with the bytes, W² and
  // the iterations (the fluid reference on vgg16 at 2 Gbit/s, W = 16 needs more than 400
  // million), and a fixed total failed such a run that was making progress.
  int64_t max_events_without_progress = 400'000'000;
};

// The key size of the key → shard assignment in ps mode: shard_partition_bytes, or the balance
// rule's finer size when balance_shards is on (sched::BalancedShardUnit). All-reduce mode:
// shard_partition_bytes.
uint64_t ShardUnitBytes(const ModelProfile& profile, const SimConfig& config);

// Builds one host's policy; called once per host per run.
using PolicyFactory = std::function<absl::StatusOr<std::unique_ptr<Policy>>()>;

// Traffic of one host, per measured iteration (averaged). In the ideal bound only the
// constrained port is ever busy (the others have infinite bandwidth), and `up_messages` counts
// fluid pieces.
struct LinkStats {
  double up_bytes = 0;
  double down_bytes = 0;
  double up_busy_ns = 0;  // includes θ per message
  double down_busy_ns = 0;
  double up_messages = 0;
};

// From `iteration` on, host 0 ran `schedule` (Policy::schedule(): gradlane's candidate).
struct ScheduleChange {
  int64_t iteration = 0;
  std::string schedule;
};

struct SimResult {
  std::string policy;
  std::string variant;  // the ideal bound: what gave it (a port's relaxation, the chain)
  std::vector<TimeNs> iteration_ns;  // T(k) for each measured iteration
  double mean_iteration_ns = 0;
  // The ideal bound in ps mode: the largest single-port relaxation's mean alone (the bound is
  // that or the laggard chain, whichever is larger). 0 otherwise.
  double single_port_mean_ns = 0;
  // From a cold start (t = 0, every worker beginning iteration 0) to max_w S(warmup+measured, w):
  // the time to run all simulated iterations. This, not the windowed mean, is what the ideal
  // bound bounds exactly: a short window can look faster than the steady state when a policy
  // carries a growing backlog past its end.
  TimeNs total_ns = 0;
  TimeNs compute_ns = 0;         // C
  double gpu_idle_share = 0;     // (T − C) / T
  double comm_ns = 0;            // N
  double alpha = 0;              // (N + C − T) / min(N, C)
  double rho = 0;                // (2(W−1)/W · bytes / B) / C
  std::vector<LinkStats> links;  // one per host
  // Host 0's schedule from iteration 0 on, one entry per change: gradlane's trials, runoff and
  // choice; one entry for a policy that is one schedule. Empty for the ideal bound and the
  // fluid reference.
  std::vector<ScheduleChange> schedules;
  int64_t events = 0;  // events processed (cost of the run)
};

// Checks a config against a profile (ranges, priorities' length); the simulators call it too.
absl::Status ValidateConfig(const ModelProfile& profile, const SimConfig& config);

// ρ of a profile under a config (docs/design.md §5).
double Rho(const ModelProfile& profile, const SimConfig& config);

// Scales every compute time of `profile` (fwd, bwd, ready) so that its ρ under `config` is
// `rho` (gradlane-sim's --rho). False, and nothing changed, if the profile has no compute time.
bool ScaleComputeToRho(ModelProfile& profile, const SimConfig& config, double rho);

// Runs warmup + measured iterations with one policy per host from `factory`. `label` names the
// result (usually the policy's name).
absl::StatusOr<SimResult> Simulate(const ModelProfile& profile, const SimConfig& config,
                                   const PolicyFactory& factory, std::string_view label);

// Runs the ideal bound (see the header comment). Its result is labelled "ideal"; `variant` names
// the port whose relaxation gave the bound (ps mode) or the all-reduce relaxation.
absl::StatusOr<SimResult> SimulateIdeal(const ModelProfile& profile, const SimConfig& config);

// Runs the all-ports fluid priority schedule (a reference, not a bound). Labelled "fluid". ps mode
// only (InvalidArgument in all-reduce mode).
absl::StatusOr<SimResult> SimulateFluid(const ModelProfile& profile, const SimConfig& config);

}  // namespace gradlane::sched::sim

#endif  // GRADLANE_SCHED_SIM_SIMULATOR_H_
