#include "sched/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sched/bandwidth_estimator.h"
#include "sched/partitioner.h"
#include "sched/shard_balance.h"

namespace gradlane::sched::sim {
namespace {

// A contiguous byte range of one tensor owned by one shard.
struct OwnedRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  int owner = 0;
};

// The key → shard assignment, shared by every run on a profile and config so that policies
// (and the ideal bound) move exactly the same bytes over the same paths.
std::vector<std::vector<OwnedRange>> AssignShards(const ModelProfile& profile, int workers,
                                                  uint64_t chunk_bytes) {
  struct Chunk {
    uint32_t tensor;
    uint64_t offset;
    uint64_t length;
  };
  std::vector<Chunk> chunks;
  for (uint32_t t = 0; t < profile.layers.size(); ++t) {
    const uint64_t bytes = profile.layers[t].param_bytes;
    for (uint64_t off = 0; off < bytes; off += chunk_bytes) {
      chunks.push_back({t, off, std::min(chunk_bytes, bytes - off)});
    }
  }
  // Largest first onto the least-loaded shard balances bytes within one chunk of optimal.
  std::stable_sort(chunks.begin(), chunks.end(),
                   [](const Chunk& a, const Chunk& b) { return a.length > b.length; });
  std::vector<uint64_t> load(workers, 0);
  std::vector<std::vector<OwnedRange>> owned(profile.layers.size());
  for (const Chunk& c : chunks) {
    const int shard = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[shard] += c.length;
    owned[c.tensor].push_back({c.offset, c.length, shard});
  }
  for (auto& ranges : owned) {
    std::sort(ranges.begin(), ranges.end(),
              [](const OwnedRange& a, const OwnedRange& b) { return a.offset < b.offset; });
    std::vector<OwnedRange> merged;
    for (const OwnedRange& r : ranges) {
      if (!merged.empty() && merged.back().owner == r.owner &&
          merged.back().offset + merged.back().length == r.offset) {
        merged.back().length += r.length;
      } else {
        merged.push_back(r);
      }
    }
    ranges = std::move(merged);
  }
  return owned;
}

// The shares that follow from T (mean_iteration_ns), C and N: the GPU's idle share (T − C) / T
// and the overlap α = (N + C − T) / min(N, C).
void DeriveShares(SimResult& r) {
  const double t = r.mean_iteration_ns;
  const double c = static_cast<double>(r.compute_ns);
  const double n = r.comm_ns;
  r.gpu_idle_share = t > 0 ? (t - c) / t : 0.0;
  r.alpha =
      n > 0 && c > 0 ? (n + c - t) / std::min(n, c) : std::numeric_limits<double>::quiet_NaN();
}

// The laggard chain (ps mode; simulator.h says why it bounds every schedule): the least time one
// iteration can add to the latest start of the last layer's forward, G(k) = max_w G(k, w), given
// that the host λ where G(k, λ) = G(k) carries all of its own uplink traffic of iteration k
// between then and G(k + 1). Measured from G(k, λ): λ's gradient of layer l is ready at fc + r_l
// (fc the last layer's forward, r_l the layer's ready time), and its push of l and its shard's
// pulls of l both need it; the pull of l to a worker arrives before that worker's forward of l,
// at most tail_l = Σ fwd of layers l..n−2 before G(k + 1), so it leaves λ L earlier and a push
// 2L earlier. A single port with release times and deadlines has room for them only if every
// window [α, D − β] holds the work released at or after α and due at or before D − β (Horn):
// D ≥ α + β + that work, for every α and β. Also D ≥ C (λ's own compute). Which host lags is
// the schedule's choice, so the chain uses the host for which D is least.
struct LaggardChain {
  TimeNs per_iteration_ns = 0;
  int host = 0;
};

LaggardChain LaggardChainBound(const ModelProfile& profile, const SimConfig& config,
                               const std::vector<std::vector<OwnedRange>>& owned) {
  const size_t n = profile.layers.size();
  const TimeNs fc = profile.layers[n - 1].fwd_ns;
  // tail[l] = Σ fwd of layers l..n−2: the forward the worker still runs after layer l's pull is
  // needed and before its last layer's forward starts.
  std::vector<TimeNs> tail(n, 0);
  for (size_t l = n - 1; l-- > 0;) tail[l] = tail[l + 1] + profile.layers[l].fwd_ns;
  const double ns_per_byte = 8e9 / config.bandwidth_bits_per_s;
  struct Job {
    TimeNs release;
    TimeNs tail;
    double work_ns;
  };
  LaggardChain best{std::numeric_limits<TimeNs>::max(), 0};
  std::vector<Job> jobs;
  std::vector<TimeNs> releases;
  for (int lag = 0; lag < config.workers; ++lag) {
    jobs.clear();
    for (size_t l = 0; l < n; ++l) {
      uint64_t own = 0;
      for (const OwnedRange& r : owned[l]) own += r.owner == lag ? r.length : 0;
      const uint64_t bytes = profile.layers[l].param_bytes;
      const TimeNs release = fc + profile.layers[l].ready_ns;
      // A policy's messages each round their wire time to the nearest ns (Engine::TxNs), so
      // the work is counted 1 ns per 4 KiB short, as in the all-reduce bound. (With θ ≥ 1 ns
      // no allowance is needed: θ + round(x) > x. With θ = 0 it assumes messages of 4 KiB on
      // average: a policy sending a few bytes per message could gain more from rounding.)
      auto work_ns = [&](uint64_t b) {
        return std::max(0.0, static_cast<double>(b) * ns_per_byte -
                                 static_cast<double>((b + 4095) / 4096));
      };
      if (bytes > own) {
        jobs.push_back({release, tail[l] + 2 * config.latency_ns, work_ns(bytes - own)});
      }
      if (own > 0 && config.workers > 1) {
        jobs.push_back({release, tail[l] + config.latency_ns,
                        work_ns(own * static_cast<uint64_t>(config.workers - 1))});
      }
    }
    // By deadline, latest first: the work due at or before D − β is then a prefix (of the jobs
    // released at or after α) for every β; each distinct release is one α.
    std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.tail > b.tail; });
    releases.clear();
    for (const Job& j : jobs) releases.push_back(j.release);
    std::sort(releases.begin(), releases.end());
    releases.erase(std::unique(releases.begin(), releases.end()), releases.end());
    double d = static_cast<double>(profile.ComputeNs());
    for (const TimeNs alpha : releases) {
      double work = 0;
      bool any = false;
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (jobs[i].release >= alpha) {
          work += jobs[i].work_ns;
          any = true;
        }
        if (!any || (i + 1 < jobs.size() && jobs[i + 1].tail == jobs[i].tail)) continue;
        d = std::max(d, static_cast<double>(alpha) + static_cast<double>(jobs[i].tail) + work);
      }
    }
    // Rounded down: the bound must not exceed what it bounds by a nanosecond of rounding.
    const auto lagging = static_cast<TimeNs>(std::floor(d));
    if (lagging < best.per_iteration_ns) best = {lagging, lag};
  }
  return best;
}

}  // namespace

uint64_t ShardUnitBytes(const ModelProfile& profile, const SimConfig& config) {
  if (config.mode != SimMode::kParameterServer || !config.balance_shards) {
    return config.shard_partition_bytes;
  }
  std::vector<uint64_t> sizes;
  sizes.reserve(profile.layers.size());
  for (const ModelLayer& l : profile.layers) sizes.push_back(l.param_bytes);
  return BalancedShardUnit(sizes, static_cast<uint32_t>(std::max(config.workers, 0)),
                           config.shard_partition_bytes);
}

namespace {

// Counts, per byte of one key at one shard, how many of the W contributions arrived. Each source
// sends each byte once per iteration, so a count of W means "ready to aggregate" whatever way
// the sources cut their segments. Completed pieces are dropped to keep the map small.
class Coverage {
 public:
  explicit Coverage(uint64_t bytes) { pieces_[0] = {bytes, 0}; }

  // Adds one contribution of [begin, end); appends the ranges that became complete.
  void Add(uint64_t begin, uint64_t end, int needed,
           std::vector<std::pair<uint64_t, uint64_t>>& completed) {
    Split(begin);
    Split(end);
    auto it = pieces_.lower_bound(begin);
    while (it != pieces_.end() && it->first < end) {
      if (++it->second.count >= needed) {
        if (!completed.empty() && completed.back().second == it->first) {
          completed.back().second = it->second.end;
        } else {
          completed.emplace_back(it->first, it->second.end);
        }
        it = pieces_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct Piece {
    uint64_t end;
    int count;
  };
  void Split(uint64_t at) {
    auto it = pieces_.upper_bound(at);
    if (it == pieces_.begin()) return;
    --it;
    if (it->first < at && at < it->second.end) {
      pieces_[at] = {it->second.end, it->second.count};
      it->second.end = at;
    }
  }
  std::map<uint64_t, Piece> pieces_;
};

enum class EventType : uint8_t {
  kComputeDone,
  kGradientsReady,
  kUplinkFree,
  kDeliver,
  kAck,
  kAggDone,
  kWakeup,
  kIdealUpFree,
  kIdealArrive,
  kIdealSchedule,
  kRingReduced,      // all-reduce: a host finished summing a chunk (a = ring job)
  kRingChainArrive,  // all-reduce bound: a chain hop arrived (a = message)
  kWorkerStart,      // a worker's first iteration, SimConfig::start_skew_ns after the previous
};

struct Event {
  TimeNs time;
  uint64_t seq;
  EventType type;
  int32_t host;
  int64_t a;
  int64_t b;
};

struct EventLater {
  bool operator()(const Event& x, const Event& y) const {
    return std::tie(x.time, x.seq) > std::tie(y.time, y.seq);
  }
};

struct Message {
  int src = 0;
  int dst = 0;
  int64_t dispatch = -1;  // -1: no credit to return (the ideal network)
  int64_t iteration = 0;  // for per-iteration accounting: the first segment's
  uint64_t bytes = 0;
  uint8_t decision = 0;  // the sender's Policy::Decision() when it committed the message
  std::vector<Segment> segments;
};

struct DispatchRecord {
  uint64_t bytes = 0;
  int pending_messages = 0;
  TimeNs sent_at = 0;
};

struct AggJob {
  int64_t iteration;
  uint32_t tensor;
  uint64_t offset;
  uint64_t length;
};

// All-reduce: one chunk's reduction on a host.
struct RingJob {
  int64_t iteration;
  uint32_t tensor;
  size_t chunk;
};

// All-reduce: one host's state of one (iteration, tensor), created on first touch and dropped
// when the host holds the whole result.
struct RingTensor {
  bool local_ready = false;
  std::vector<uint64_t> rs_in;  // per chunk: reduce-scatter bytes arrived from the left
  std::vector<uint64_t> ag_in;  // per chunk: all-gather bytes arrived from the left
};

// A pending range in an ideal uplink or downlink queue, most urgent first: older iterations first
// (their consumers come first), then by `rank` (see Engine::IdealRank), then stably by key and
// peer.
struct IdealItem {
  int64_t iteration;
  int64_t rank;
  uint32_t tensor;
  uint64_t offset;
  uint64_t end;
  Priority priority;
  Direction direction;
  int peer;     // the other end: destination in an uplink queue, source in a downlink queue
  int64_t seq;  // downlink queue only: arrival number, to keep entries distinct
  bool operator<(const IdealItem& o) const {
    return std::tie(iteration, rank, tensor, offset, peer, seq) <
           std::tie(o.iteration, o.rank, o.tensor, o.offset, o.peer, o.seq);
  }
};

// Which ports the ideal network constrains: one (the single-port relaxation, a lower bound) or
// all of them (the full fluid network, a reference schedule).
struct IdealPorts {
  bool all = false;
  int host = 0;
  bool uplink = true;
  bool all_uplinks = false;  // the all-reduce bound: every uplink, no downlink
};

struct Worker {
  int64_t iteration = 0;
  size_t layer = 0;  // 0..L-1: next forward layer; L: backward
  bool busy = false;
  bool done = false;
  std::vector<TimeNs> start;  // S(k, w) for k = 0..total
};

struct Host {
  std::unique_ptr<Policy> policy;
  // What the daemon would feed the policy: the host's live link estimate from its acks.
  BandwidthEstimator estimator;
  std::deque<int64_t> uplink_fifo;
  bool uplink_busy = false;
  TimeNs downlink_free = 0;
  TimeNs wakeup_at = kNever;
  TimeNs agg_free = 0;
  // Ideal network.
  bool ideal_up_busy = false;
  bool ideal_down_busy = false;
  std::set<IdealItem> ideal_up;    // ranges waiting for this uplink
  std::set<IdealItem> ideal_down;  // pieces whose first bit reached this downlink
  // Accounting over the measured iterations.
  LinkStats stats;
};

class Engine {
 public:
  Engine(const ModelProfile& profile, const SimConfig& config, bool ideal, IdealPorts ports = {})
      : profile_(profile),
        config_(config),
        ideal_(ideal),
        allreduce_(config.mode == SimMode::kAllReduce),
        ports_(ports),
        w_(config.workers) {}

  absl::StatusOr<SimResult> Run(const PolicyFactory* factory, std::string_view label);

 private:
  TimeNs TxNs(uint64_t bytes) const {
    const long double ns = static_cast<long double>(bytes) * 8e9L /
                           static_cast<long double>(config_.bandwidth_bits_per_s);
    return static_cast<TimeNs>(std::llround(ns));
  }
  // The all-reduce bound's allowance for rounding (see the header comment): 1 ns per 4 KiB.
  static TimeNs RoundingSlack(uint64_t bytes) { return static_cast<TimeNs>((bytes + 4095) / 4096); }
  bool Measured(int64_t iteration) const {
    return iteration >= config_.warmup_iterations && iteration < total_;
  }
  void Push(TimeNs t, EventType type, int host, int64_t a = 0, int64_t b = 0) {
    events_.push(Event{t, seq_++, type, host, a, b});
  }
  void Fail(absl::Status status) {
    if (error_.ok()) error_ = std::move(status);
  }

  void TryAdvance(int w, TimeNs now);
  void OnGradientsReady(int w, int64_t iteration, size_t group, TimeNs now);
  void ShardAdd(int shard, int64_t iteration, uint32_t tensor, uint64_t begin, uint64_t end,
                TimeNs now);
  void Aggregated(int shard, const AggJob& job, TimeNs now);
  void WorkerReceive(int w, int64_t iteration, uint32_t tensor, uint64_t bytes, TimeNs now);
  void Enqueue(int host, const ReadyRange& range, TimeNs now);
  // Records host 0's schedule where it changed (SimResult::schedules).
  void NoteSchedule(int host, int64_t iteration);
  // Whether worker w holds tensor t's result of an iteration (all-reduce bound: also port w−1).
  bool ResultReady(int w, int64_t iteration, uint32_t tensor) const;

  // All-reduce (see the header comment). Chunk g of tensor t is [ring_bounds_[t][g],
  // ring_bounds_[t][g+1]); its ring starts at host g mod W.
  void RingSetUp();
  RingTensor& RingState(int host, int64_t iteration, uint32_t tensor);
  void RingDropIfDone(int host, int64_t iteration, uint32_t tensor);
  void RingLocalReady(int host, int64_t iteration, uint32_t tensor, TimeNs now);
  void RingArrive(int host, int64_t iteration, uint32_t tensor, uint64_t begin, uint64_t end,
                  Direction direction, TimeNs now);
  void RingReduce(int host, int64_t iteration, uint32_t tensor, size_t chunk, TimeNs now);
  void RingReduced(int host, int64_t iteration, uint32_t tensor, size_t chunk, TimeNs now);
  void RingFinal(int host, int64_t iteration, uint32_t tensor, size_t chunk, TimeNs now);
  void RingSend(int host, int64_t iteration, uint32_t tensor, size_t chunk, Direction direction,
                TimeNs now);
  void PortArrive(int host, int64_t iteration, uint32_t tensor, uint64_t bytes, TimeNs now);
  // Distance of a host from where chunk g's ring starts: 0 starts it, W−1 owns its sum.
  int RingDistance(int host, size_t chunk) const {
    return static_cast<int>((host - static_cast<int64_t>(chunk % w_) + w_) % w_);
  }
  uint64_t ChunkBytes(uint32_t tensor, size_t chunk) const {
    return ring_bounds_[tensor][chunk + 1] - ring_bounds_[tensor][chunk];
  }

  // Policy network.
  void Pump(int host, TimeNs now);
  void Commit(int host, const Dispatch& d, TimeNs now);
  void StartUplink(int host, TimeNs now);
  void Deliver(int64_t msg_id, TimeNs now);
  void Ack(int64_t msg_id, TimeNs now);
  // Ideal network.
  void RequestIdealSchedule(TimeNs now);
  void IdealSchedule(TimeNs now);
  void IdealArrive(int64_t msg_id, TimeNs now);

  int64_t NewMessage();
  // Earliest due date first (Jackson's rule, optimal for one preemptive port): a byte of layer
  // i is due when the next forward reaches layer i (Σ fwd of layers < i), minus the time it
  // still travels after crossing the port. A push travels one latency more than a pull (to the
  // shard, then back as a pull), so it is due one latency earlier. Whatever priorities the
  // policies were given: those are a policy input, this is the optimum.
  int64_t IdealRank(uint32_t layer, Direction direction) const {
    return forward_before_[layer] - (direction == Direction::kPush ? config_.latency_ns : 0);
  }
  bool UpConstrained(int h) const {
    return ports_.all || ports_.all_uplinks || (ports_.uplink && ports_.host == h);
  }
  bool DownConstrained(int h) const {
    return ports_.all || (!ports_.all_uplinks && !ports_.uplink && ports_.host == h);
  }
  void FreeMessage(int64_t id) { free_messages_.push_back(id); }
  // The shard owning all of [offset, offset+length) of a tensor, or -1 if no single one does.
  int OwnerOf(uint32_t tensor, uint64_t offset, uint64_t length) const {
    const std::vector<OwnedRange>& ranges = owned_[tensor];
    auto it = std::upper_bound(ranges.begin(), ranges.end(), offset,
                               [](uint64_t off, const OwnedRange& r) { return off < r.offset; });
    if (it == ranges.begin()) return -1;
    --it;
    return offset + length <= it->offset + it->length ? it->owner : -1;
  }

  const ModelProfile& profile_;
  const SimConfig& config_;
  const bool ideal_;
  const bool allreduce_;
  const IdealPorts ports_;
  int64_t arrivals_ = 0;
  const int w_;
  int64_t total_ = 0;
  uint64_t ideal_piece_ = 0;
  TimeNs backward_ns_ = 0;
  std::vector<TimeNs> forward_before_;  // Σ fwd of the layers before each layer
  std::vector<Priority> priority_;
  std::vector<std::vector<OwnedRange>> owned_;
  // Gradient release groups: distinct ready times, tensors released together.
  std::vector<std::pair<TimeNs, std::vector<uint32_t>>> ready_groups_;

  std::vector<Worker> workers_;
  std::vector<Host> hosts_;
  // Host 0's Policy::schedule() from each iteration it changed in (NoteSchedule).
  std::vector<ScheduleChange> schedules_;
  // Per worker: bytes of each (iteration, tensor) result received.
  std::vector<std::vector<uint64_t>> received_;  // [w][iteration * L + tensor]
  // Per shard: contributions of each (iteration, tensor), created on first touch.
  std::vector<std::map<std::pair<int64_t, uint32_t>, Coverage>> coverage_;
  std::vector<uint64_t> coverage_left_;  // [shard][iteration * L + tensor] bytes·W to go
  std::vector<AggJob> agg_jobs_;
  // All-reduce.
  std::vector<std::vector<uint64_t>> ring_bounds_;  // [tensor]: chunk boundaries
  std::vector<uint64_t> ring_sent_;                 // [tensor * W + host]: bytes sent
  std::vector<std::map<std::pair<int64_t, uint32_t>, RingTensor>> ring_;  // [host]
  std::vector<RingJob> ring_jobs_;
  std::vector<std::vector<uint64_t>> port_arrived_;  // bound: [w][iteration * L + tensor]

  std::vector<Message> messages_;
  std::vector<int64_t> free_messages_;
  std::vector<DispatchRecord> dispatches_;
  std::vector<int64_t> free_dispatches_;
  std::vector<std::pair<uint64_t, uint64_t>> completed_scratch_;
  Dispatch dispatch_scratch_;
  bool ideal_schedule_pending_ = false;

  std::priority_queue<Event, std::vector<Event>, EventLater> events_;
  uint64_t seq_ = 0;
  int64_t processed_ = 0;
  int64_t since_progress_ = 0;  // events since a worker last finished a layer's compute
  absl::Status error_;
};

int64_t Engine::NewMessage() {
  if (!free_messages_.empty()) {
    const int64_t id = free_messages_.back();
    free_messages_.pop_back();
    messages_[id].segments.clear();
    messages_[id].decision = 0;
    return id;
  }
  messages_.emplace_back();
  return static_cast<int64_t>(messages_.size()) - 1;
}

absl::StatusOr<SimResult> Engine::Run(const PolicyFactory* factory, std::string_view label_view) {
  const std::string label(label_view);
  const size_t num_layers = profile_.layers.size();
  total_ = config_.warmup_iterations + config_.measured_iterations;
  backward_ns_ = profile_.BackwardNs();
  forward_before_.assign(num_layers, 0);
  for (size_t i = 1; i < num_layers; ++i) {
    forward_before_[i] = forward_before_[i - 1] + profile_.layers[i - 1].fwd_ns;
  }
  priority_.resize(num_layers);
  for (size_t i = 0; i < num_layers; ++i) {
    priority_[i] = config_.priorities.empty() ? static_cast<Priority>(i) : config_.priorities[i];
  }
  if (allreduce_) {
    RingSetUp();
  } else {
    owned_ = AssignShards(profile_, w_, ShardUnitBytes(profile_, config_));
  }
  {
    std::map<TimeNs, std::vector<uint32_t>> groups;
    // Within a group, later layers first: the order backward produces them in.
    for (size_t i = num_layers; i-- > 0;) {
      if (profile_.layers[i].param_bytes > 0) {
        groups[profile_.layers[i].ready_ns].push_back(static_cast<uint32_t>(i));
      }
    }
    for (auto& [t, tensors] : groups) ready_groups_.emplace_back(t, std::move(tensors));
  }
  if (ideal_) {
    const double bytes_per_s = config_.bandwidth_bits_per_s / 8.0;
    ideal_piece_ = config_.ideal_granularity_bytes;
    if (ideal_piece_ == 0) {
      const double auto_piece = std::clamp(bytes_per_s * 20e-6, 16384.0, 1048576.0);
      ideal_piece_ = static_cast<uint64_t>(auto_piece);
    }
  }

  workers_.assign(w_, Worker{});
  for (Worker& wk : workers_) wk.start.assign(total_ + 1, kNever);
  hosts_.resize(w_);
  received_.assign(w_, std::vector<uint64_t>(total_ * num_layers, 0));
  coverage_.assign(w_, {});
  coverage_left_.assign(allreduce_ ? 0 : static_cast<size_t>(w_) * total_ * num_layers, 0);
  ring_.assign(w_, {});
  if (allreduce_ && ideal_) port_arrived_.assign(w_, std::vector<uint64_t>(total_ * num_layers, 0));
  for (size_t t = 0; t < owned_.size(); ++t) {
    for (const OwnedRange& r : owned_[t]) {
      for (int64_t k = 0; k < total_; ++k) {
        coverage_left_[(r.owner * total_ + k) * num_layers + t] += r.length * w_;
      }
    }
  }

  const double bytes_per_s = config_.bandwidth_bits_per_s / 8.0;
  for (int h = 0; h < w_; ++h) {
    Host& host = hosts_[h];
    if (ideal_) continue;
    absl::StatusOr<std::unique_ptr<Policy>> policy = (*factory)();
    if (!policy.ok()) return policy.status();
    if (*policy == nullptr) return absl::InternalError("policy factory returned null");
    host.policy = std::move(*policy);
    host.policy->SetRank(static_cast<uint16_t>(h));
    for (size_t t = 0; t < num_layers; ++t) {
      if (profile_.layers[t].param_bytes == 0) continue;
      host.policy->RegisterTensor(TensorSpec{
          static_cast<uint32_t>(t), profile_.layers[t].param_bytes, DType::kF32, priority_[t]});
    }
    // The configured link, and the round trip of a small message: θ plus latency both ways.
    host.policy->OnLinkEstimate(bytes_per_s, 2 * config_.latency_ns + config_.overhead_ns);
  }

  for (int w = 0; w < w_; ++w) {
    const TimeNs start = w * config_.start_skew_ns;
    if (start == 0) {
      TryAdvance(w, 0);  // the same events, in the same order, as without the option
    } else {
      Push(start, EventType::kWorkerStart, w);
    }
  }

  while (!events_.empty() && error_.ok()) {
    const Event e = events_.top();
    events_.pop();
    ++processed_;
    if (++since_progress_ > config_.max_events_without_progress) {
      return absl::ResourceExhaustedError(absl::StrCat(
          label, ": more than ", config_.max_events_without_progress,
          " events without a layer's compute finishing; the schedule makes no progress"));
    }
    switch (e.type) {
      case EventType::kComputeDone: {
        since_progress_ = 0;
        Worker& wk = workers_[e.host];
        wk.busy = false;
        if (wk.layer < num_layers) {
          ++wk.layer;
        } else {
          wk.layer = 0;
          ++wk.iteration;
        }
        TryAdvance(e.host, e.time);
        break;
      }
      case EventType::kWorkerStart:
        TryAdvance(e.host, e.time);
        break;
      case EventType::kGradientsReady:
        OnGradientsReady(e.host, e.a, static_cast<size_t>(e.b), e.time);
        break;
      case EventType::kUplinkFree:
        hosts_[e.host].uplink_busy = false;
        StartUplink(e.host, e.time);
        break;
      case EventType::kDeliver:
        Deliver(e.a, e.time);
        break;
      case EventType::kAck:
        Ack(e.a, e.time);
        break;
      case EventType::kAggDone:
        Aggregated(e.host, agg_jobs_[e.a], e.time);
        break;
      case EventType::kWakeup:
        if (hosts_[e.host].wakeup_at == e.time) {
          hosts_[e.host].wakeup_at = kNever;
          Pump(e.host, e.time);
        }
        break;
      case EventType::kIdealUpFree:
        hosts_[e.host].ideal_up_busy = false;
        RequestIdealSchedule(e.time);
        break;
      case EventType::kIdealArrive:
        IdealArrive(e.a, e.time);
        break;
      case EventType::kIdealSchedule:
        ideal_schedule_pending_ = false;
        IdealSchedule(e.time);
        break;
      case EventType::kRingReduced: {
        const RingJob job = ring_jobs_[e.a];
        RingReduced(e.host, job.iteration, job.tensor, job.chunk, e.time);
        if (!ideal_) Pump(e.host, e.time);
        RingDropIfDone(e.host, job.iteration, job.tensor);
        break;
      }
      case EventType::kRingChainArrive: {
        const Segment seg = messages_[e.a].segments.front();
        FreeMessage(e.a);
        RingArrive(e.host, seg.iteration, KeyTensor(seg.key), seg.offset, seg.offset + seg.length,
                   seg.direction, e.time);
        break;
      }
    }
  }
  if (!error_.ok()) return error_;

  for (int w = 0; w < w_; ++w) {
    if (!workers_[w].done) {
      std::string detail;
      for (int h = 0; h < w_; ++h) {
        if (hosts_[h].policy != nullptr) {
          absl::StrAppend(&detail, " host ", h, ": ", hosts_[h].policy->queued_segments(),
                          " segments queued, ", hosts_[h].policy->credit_in_use(),
                          " credit bytes in use;");
        }
      }
      return absl::InternalError(absl::StrCat(
          label, ": stalled: worker ", w, " stuck in iteration ", workers_[w].iteration, " layer ",
          workers_[w].layer, " with no event left;", detail));
    }
  }

  SimResult result;
  result.policy = std::string(label);
  result.compute_ns = profile_.ComputeNs();
  auto latest_start = [&](int64_t k) {
    TimeNs s = 0;
    for (const Worker& wk : workers_) s = std::max(s, wk.start[k]);
    return s;
  };
  for (int64_t k = config_.warmup_iterations; k < total_; ++k) {
    result.iteration_ns.push_back(latest_start(k + 1) - latest_start(k));
  }
  result.total_ns = latest_start(total_);
  result.schedules = std::move(schedules_);
  const double measured = config_.measured_iterations;
  result.mean_iteration_ns =
      static_cast<double>(latest_start(total_) - latest_start(config_.warmup_iterations)) /
      measured;
  double busiest = 0;
  for (Host& host : hosts_) {
    LinkStats s = host.stats;
    s.up_bytes /= measured;
    s.down_bytes /= measured;
    s.up_busy_ns /= measured;
    s.down_busy_ns /= measured;
    s.up_messages /= measured;
    busiest = std::max({busiest, s.up_bytes, s.down_bytes});
    result.links.push_back(s);
  }
  result.comm_ns = busiest * 8e9 / config_.bandwidth_bits_per_s;
  DeriveShares(result);
  result.rho = Rho(profile_, config_);
  result.events = processed_;
  return result;
}

void Engine::TryAdvance(int w, TimeNs now) {
  Worker& wk = workers_[w];
  const size_t num_layers = profile_.layers.size();
  if (wk.busy || wk.done) return;
  if (wk.layer < num_layers) {
    const size_t i = wk.layer;
    // Layer i of iteration k uses the parameters updated by iteration k−1's pulled result.
    if (wk.iteration > 0 && profile_.layers[i].param_bytes > 0 &&
        !ResultReady(w, wk.iteration - 1, static_cast<uint32_t>(i))) {
      return;  // WorkerReceive, RingFinal or PortArrive calls back when the result is complete
    }
    if (i == 0) {
      wk.start[wk.iteration] = now;
      if (wk.iteration == total_) {
        wk.done = true;
        return;
      }
    }
    wk.busy = true;
    Push(now + profile_.layers[i].fwd_ns, EventType::kComputeDone, w);
    return;
  }
  wk.busy = true;
  for (size_t g = 0; g < ready_groups_.size(); ++g) {
    Push(now + ready_groups_[g].first, EventType::kGradientsReady, w, wk.iteration,
         static_cast<int64_t>(g));
  }
  Push(now + backward_ns_, EventType::kComputeDone, w);
}

bool Engine::ResultReady(int w, int64_t iteration, uint32_t tensor) const {
  const size_t index = iteration * profile_.layers.size() + tensor;
  if (received_[w][index] < profile_.layers[tensor].param_bytes) return false;
  if (!port_arrived_.empty()) {
    return port_arrived_[w][index] >= ring_sent_[tensor * w_ + (w + w_ - 1) % w_];
  }
  return true;
}

void Engine::OnGradientsReady(int w, int64_t iteration, size_t group, TimeNs now) {
  if (allreduce_) {
    for (uint32_t t : ready_groups_[group].second) {
      RingLocalReady(w, iteration, t, now);
      if (!error_.ok()) return;
      // The bound's port: everything this host sends of the tensor, due when the next forward
      // reaches its layer.
      const uint64_t bytes = ring_sent_[t * w_ + w];
      if (ideal_ && bytes > 0) {
        hosts_[w].ideal_up.insert(IdealItem{iteration, forward_before_[t], t, 0, bytes,
                                            priority_[t], Direction::kPush, (w + 1) % w_, 0});
        RequestIdealSchedule(now);
      }
    }
    if (!ideal_) Pump(w, now);
    return;
  }
  for (uint32_t t : ready_groups_[group].second) {
    const ModelLayer& layer = profile_.layers[t];
    for (const OwnedRange& r : owned_[t]) {
      if (r.owner == w) {
        ShardAdd(w, iteration, t, r.offset, r.offset + r.length, now);
      } else {
        ReadyRange range;
        range.tensor_id = t;
        range.priority = priority_[t];
        range.dtype = DType::kF32;
        range.direction = Direction::kPush;
        range.peer = static_cast<uint16_t>(r.owner);
        range.iteration = iteration;
        range.tensor_bytes = layer.param_bytes;
        range.offset = r.offset;
        range.length = r.length;
        Enqueue(w, range, now);
      }
    }
  }
  if (!ideal_) Pump(w, now);
}

void Engine::NoteSchedule(int host, int64_t iteration) {
  // Host 0 leads gradlane's choice (every other host runs what it decided); a policy switches
  // only where an iteration's ranges start, so one comparison per ready range finds each switch.
  if (host != 0) return;
  const std::string_view now_running = hosts_[0].policy->schedule();
  if (!schedules_.empty() && schedules_.back().schedule == now_running) return;
  schedules_.push_back({iteration, std::string(now_running)});
}

void Engine::Enqueue(int host, const ReadyRange& range, TimeNs now) {
  if (ideal_) {
    hosts_[host].ideal_up.insert(IdealItem{
        range.iteration, IdealRank(range.tensor_id, range.direction), range.tensor_id, range.offset,
        range.offset + range.length, range.priority, range.direction, range.peer, 0});
    RequestIdealSchedule(now);
  } else {
    hosts_[host].policy->OnReady(range, now);
    NoteSchedule(host, range.iteration);
  }
}

void Engine::ShardAdd(int shard, int64_t iteration, uint32_t tensor, uint64_t begin, uint64_t end,
                      TimeNs now) {
  const size_t num_layers = profile_.layers.size();
  auto key = std::make_pair(iteration, tensor);
  auto& per_shard = coverage_[shard];
  auto it = per_shard.find(key);
  if (it == per_shard.end()) {
    it = per_shard.emplace(key, Coverage(profile_.layers[tensor].param_bytes)).first;
  }
  completed_scratch_.clear();
  it->second.Add(begin, end, w_, completed_scratch_);
  uint64_t& left = coverage_left_[(shard * total_ + iteration) * num_layers + tensor];
  if (end - begin > left) {
    Fail(absl::InternalError(absl::StrCat("shard ", shard, " received more than W copies of ",
                                          "tensor ", tensor, " in iteration ", iteration,
                                          ": a policy sent a byte twice")));
    return;
  }
  left -= end - begin;
  if (left == 0) per_shard.erase(it);
  // Taken out of the scratch so that nothing called below can overwrite it.
  std::vector<std::pair<uint64_t, uint64_t>> completed;
  completed.swap(completed_scratch_);
  for (const auto& [b, e] : completed) {
    const AggJob job{iteration, tensor, b, e - b};
    // With one worker there is nothing to sum; the ideal bound sums for free.
    if (ideal_ || config_.aggregation_bytes_per_s <= 0 || w_ == 1) {
      Aggregated(shard, job, now);
      continue;
    }
    Host& host = hosts_[shard];
    const long double ns = static_cast<long double>(job.length) * w_ * 1e9L /
                           static_cast<long double>(config_.aggregation_bytes_per_s);
    const TimeNs begin_at = std::max(now, host.agg_free);
    host.agg_free = begin_at + static_cast<TimeNs>(std::llround(ns));
    agg_jobs_.push_back(job);
    Push(host.agg_free, EventType::kAggDone, shard, static_cast<int64_t>(agg_jobs_.size()) - 1);
  }
  completed.clear();
  completed_scratch_.swap(completed);  // keep the capacity
}

void Engine::Aggregated(int shard, const AggJob& job, TimeNs now) {
  const ModelLayer& layer = profile_.layers[job.tensor];
  // Remote workers first so the pulls are queued before the local worker may post new work.
  for (int i = 1; i < w_; ++i) {
    const int w = (shard + i) % w_;
    ReadyRange range;
    range.tensor_id = job.tensor;
    range.priority = priority_[job.tensor];
    range.dtype = DType::kF32;
    range.direction = Direction::kPull;
    range.peer = static_cast<uint16_t>(w);
    range.iteration = job.iteration;
    range.tensor_bytes = layer.param_bytes;
    range.offset = job.offset;
    range.length = job.length;
    Enqueue(shard, range, now);
  }
  if (!ideal_) Pump(shard, now);
  WorkerReceive(shard, job.iteration, job.tensor, job.length, now);
}

void Engine::WorkerReceive(int w, int64_t iteration, uint32_t tensor, uint64_t bytes, TimeNs now) {
  const size_t num_layers = profile_.layers.size();
  uint64_t& got = received_[w][iteration * num_layers + tensor];
  got += bytes;
  if (got > profile_.layers[tensor].param_bytes) {
    Fail(absl::InternalError(absl::StrCat("worker ", w, " received ", got, " bytes of tensor ",
                                          tensor, " (", profile_.layers[tensor].param_bytes,
                                          " expected) in iteration ", iteration,
                                          ": a policy sent a byte twice")));
    return;
  }
  if (got == profile_.layers[tensor].param_bytes) TryAdvance(w, now);
}

void Engine::Pump(int host_id, TimeNs now) {
  Host& host = hosts_[host_id];
  Dispatch& d = dispatch_scratch_;
  // Bound the loop: a policy that keeps returning true without progress is a contract breach.
  for (int guard = 0; error_.ok(); ++guard) {
    d.segments.clear();
    d.bytes = 0;
    if (!host.policy->NextDispatch(now, d)) break;
    Commit(host_id, d, now);
    if (guard > 10'000'000) {
      Fail(absl::InternalError("policy dispatched more than 10^7 times in one step"));
      return;
    }
  }
  if (host.policy->queued_segments() > 0) {
    TimeNs at = host.policy->NextWakeup(now);
    if (at != kNever) {
      at = std::max(at, now + 1);
      if (at < host.wakeup_at || host.wakeup_at <= now) {
        host.wakeup_at = at;
        Push(at, EventType::kWakeup, host_id);
      }
    }
  }
}

void Engine::Commit(int host_id, const Dispatch& d, TimeNs now) {
  const size_t num_layers = profile_.layers.size();
  uint64_t sum = 0;
  for (const Segment& s : d.segments) {
    const uint32_t t = KeyTensor(s.key);
    // The bytes must lie within one shard's range: the peer's for a push, ours for a pull.
    bool valid = s.peer < w_ && s.peer != host_id && s.length > 0 && t < num_layers &&
                 s.offset + s.length <= profile_.layers[t].param_bytes && s.iteration >= 0 &&
                 s.iteration < total_;
    if (valid && allreduce_) {
      // Every ring hop goes to the right neighbour; which chunks it may carry is checked on
      // arrival (RingArrive).
      valid = s.peer == (host_id + 1) % w_;
    } else if (valid) {
      const int owner = s.direction == Direction::kPush ? s.peer : host_id;
      valid = OwnerOf(t, s.offset, s.length) == owner;
    }
    if (!valid) {
      Fail(absl::InternalError(absl::StrCat(
          "host ", host_id, ": the policy dispatched an invalid segment (tensor ", t, ", ",
          s.direction == Direction::kPush ? "push" : "pull", " to peer ", s.peer, ", offset ",
          s.offset, ", length ", s.length, ", iteration ", s.iteration, ")")));
      return;
    }
    sum += s.length;
  }
  if (d.segments.empty() || sum != d.bytes) {
    Fail(absl::InternalError(absl::StrCat("host ", host_id, ": policy returned a dispatch with ",
                                          d.segments.size(), " segments, bytes ", d.bytes,
                                          " (segments sum ", sum, ")")));
    return;
  }
  int64_t dispatch_id;
  if (!free_dispatches_.empty()) {
    dispatch_id = free_dispatches_.back();
    free_dispatches_.pop_back();
  } else {
    dispatches_.emplace_back();
    dispatch_id = static_cast<int64_t>(dispatches_.size()) - 1;
  }
  DispatchRecord& rec = dispatches_[dispatch_id];
  rec.bytes = d.bytes;
  rec.pending_messages = 0;
  rec.sent_at = now;
  if (config_.live_link_estimates) hosts_[host_id].estimator.OnSend(d.bytes, now);
  // One message per peer, peers in order of first appearance (deterministic).
  std::vector<uint16_t> peers;
  for (const Segment& s : d.segments) {
    if (std::find(peers.begin(), peers.end(), s.peer) == peers.end()) peers.push_back(s.peer);
  }
  for (uint16_t peer : peers) {
    const int64_t id = NewMessage();
    Message& m = messages_[id];
    m.src = host_id;
    m.dst = peer;
    m.dispatch = dispatch_id;
    m.bytes = 0;
    for (const Segment& s : d.segments) {
      if (s.peer != peer) continue;
      m.segments.push_back(s);
      m.bytes += s.length;
    }
    m.iteration = m.segments.front().iteration;
    m.decision = hosts_[host_id].policy->Decision();
    ++rec.pending_messages;
    hosts_[host_id].uplink_fifo.push_back(id);
  }
  StartUplink(host_id, now);
}

void Engine::StartUplink(int host_id, TimeNs now) {
  Host& host = hosts_[host_id];
  if (host.uplink_busy || host.uplink_fifo.empty()) return;
  const int64_t id = host.uplink_fifo.front();
  host.uplink_fifo.pop_front();
  const Message& m = messages_[id];
  const TimeNs tx = TxNs(m.bytes);
  const TimeNs up_done = now + config_.overhead_ns + tx;
  Host& dst = hosts_[m.dst];
  const TimeNs down_start =
      std::max(now + config_.overhead_ns + config_.latency_ns, dst.downlink_free);
  dst.downlink_free = down_start + tx;
  if (Measured(m.iteration)) {
    host.stats.up_bytes += m.bytes;
    host.stats.up_busy_ns += config_.overhead_ns + tx;
    host.stats.up_messages += 1;
    dst.stats.down_bytes += m.bytes;
    dst.stats.down_busy_ns += tx;
  }
  host.uplink_busy = true;
  Push(up_done, EventType::kUplinkFree, host_id);
  Push(dst.downlink_free, EventType::kDeliver, m.dst, id);
}

void Engine::Deliver(int64_t msg_id, TimeNs now) {
  // Copy what we need: the handlers below may allocate messages and move the vector.
  const int src = messages_[msg_id].src;
  const int dst = messages_[msg_id].dst;
  const size_t count = messages_[msg_id].segments.size();
  if (hosts_[dst].policy != nullptr && messages_[msg_id].dispatch >= 0) {
    hosts_[dst].policy->OnPeerDecision(messages_[msg_id].decision, now);
  }
  for (size_t i = 0; i < count && error_.ok(); ++i) {
    const Segment s = messages_[msg_id].segments[i];
    const uint32_t t = KeyTensor(s.key);
    if (allreduce_ && ideal_) {
      PortArrive(dst, s.iteration, t, s.length, now);
    } else if (allreduce_) {
      RingArrive(dst, s.iteration, t, s.offset, s.offset + s.length, s.direction, now);
    } else if (s.direction == Direction::kPush) {
      ShardAdd(dst, s.iteration, t, s.offset, s.offset + s.length, now);
    } else {
      WorkerReceive(dst, s.iteration, t, s.length, now);
    }
  }
  if (messages_[msg_id].dispatch < 0) {
    if (DownConstrained(dst)) {
      hosts_[dst].ideal_down_busy = false;
      RequestIdealSchedule(now);
    }
    FreeMessage(msg_id);
  } else {
    Push(now + config_.latency_ns, EventType::kAck, src, msg_id);
  }
}

void Engine::Ack(int64_t msg_id, TimeNs now) {
  const int src = messages_[msg_id].src;
  const int64_t dispatch_id = messages_[msg_id].dispatch;
  FreeMessage(msg_id);
  DispatchRecord& rec = dispatches_[dispatch_id];
  if (--rec.pending_messages > 0) return;
  free_dispatches_.push_back(dispatch_id);
  Host& host = hosts_[src];
  host.policy->OnAcked(rec.bytes, now);
  if (config_.live_link_estimates) {
    host.estimator.OnAck(rec.bytes, rec.sent_at, now);
    const std::optional<double> bw = host.estimator.BytesPerSecond();
    const std::optional<TimeNs> rtt = host.estimator.SmoothedRtt();
    if (bw.has_value() && rtt.has_value()) host.policy->OnLinkEstimate(*bw, *rtt);
  }
  Pump(src, now);
}

void Engine::RequestIdealSchedule(TimeNs now) {
  // Deferred to after the events already queued for this instant, so that everything that
  // becomes ready at one time competes by priority, not by event order.
  if (ideal_schedule_pending_) return;
  ideal_schedule_pending_ = true;
  Push(now, EventType::kIdealSchedule, 0);
}

void Engine::IdealSchedule(TimeNs now) {
  auto make_piece = [&](int src, int dst, const IdealItem& item, uint64_t len) {
    const int64_t id = NewMessage();
    Message& m = messages_[id];
    m.src = src;
    m.dst = dst;
    m.dispatch = -1;
    m.iteration = item.iteration;
    m.bytes = len;
    Segment seg;
    seg.key = MakeKey(item.tensor, 0);
    seg.priority = item.priority;
    seg.direction = item.direction;
    seg.peer = static_cast<uint16_t>(dst);
    seg.iteration = item.iteration;
    seg.offset = item.offset;
    seg.length = len;
    seg.ready_at = now;
    m.segments.push_back(seg);
    return id;
  };
  // Uplinks. A constrained one starts its most urgent piece when free. An unconstrained one
  // sends all it has at once.
  for (int a = 0; a < w_; ++a) {
    Host& src = hosts_[a];
    const bool constrained = UpConstrained(a);
    while (!src.ideal_up.empty() && !src.ideal_up_busy) {
      auto node = src.ideal_up.extract(src.ideal_up.begin());
      IdealItem& item = node.value();
      const uint64_t len =
          constrained ? std::min(ideal_piece_, item.end - item.offset) : item.end - item.offset;
      const int64_t id = make_piece(a, item.peer, item, len);
      // The all-reduce bound's ports, like its chain hops, are 1 ns per 4 KiB faster than the
      // link, so that policies' segment times, each rounded to a whole ns, cannot undercut them.
      const TimeNs tx = !constrained         ? 0
                        : ports_.all_uplinks ? std::max<TimeNs>(0, TxNs(len) - RoundingSlack(len))
                                             : TxNs(len);
      if (Measured(item.iteration)) {
        src.stats.up_bytes += len;
        src.stats.up_busy_ns += tx;
        src.stats.up_messages += 1;
      }
      // A constrained downlink may start on the first bit (it cannot outrun the uplink at equal
      // rates); an unconstrained one delivers the piece when its last bit is in.
      const TimeNs arrive = now + config_.latency_ns + (DownConstrained(item.peer) ? 0 : tx);
      Push(arrive, EventType::kIdealArrive, item.peer, id);
      item.offset += len;
      if (item.offset < item.end) src.ideal_up.insert(std::move(node));
      if (constrained) {
        src.ideal_up_busy = true;
        Push(now + tx, EventType::kIdealUpFree, a);
      }
    }
  }
  // Constrained downlinks: each free one carries its most urgent arrived piece. At equal rates
  // a cut-through piece cannot outrun the uplink that feeds it.
  for (int b = 0; b < w_; ++b) {
    Host& dst = hosts_[b];
    if (!DownConstrained(b) || dst.ideal_down_busy || dst.ideal_down.empty()) continue;
    auto node = dst.ideal_down.extract(dst.ideal_down.begin());
    IdealItem& item = node.value();
    const uint64_t len = std::min(ideal_piece_, item.end - item.offset);
    const int64_t id = make_piece(item.peer, b, item, len);
    const TimeNs tx = TxNs(len);
    dst.ideal_down_busy = true;
    if (Measured(item.iteration)) {
      dst.stats.down_bytes += len;
      dst.stats.down_busy_ns += tx;
    }
    Push(now + tx, EventType::kDeliver, b, id);
    item.offset += len;
    if (item.offset < item.end) dst.ideal_down.insert(std::move(node));
  }
}

void Engine::IdealArrive(int64_t msg_id, TimeNs now) {
  const Message& m = messages_[msg_id];
  if (!DownConstrained(m.dst)) {
    if (Measured(m.iteration)) hosts_[m.dst].stats.down_bytes += m.bytes;
    Deliver(msg_id, now);
    return;
  }
  const Segment& seg = m.segments.front();
  hosts_[m.dst].ideal_down.insert(IdealItem{
      seg.iteration, IdealRank(KeyTensor(seg.key), seg.direction), KeyTensor(seg.key), seg.offset,
      seg.offset + seg.length, seg.priority, seg.direction, m.src, arrivals_++});
  FreeMessage(msg_id);
  RequestIdealSchedule(now);
}

void Engine::RingSetUp() {
  const size_t num_layers = profile_.layers.size();
  const uint64_t partition = config_.shard_partition_bytes;
  ring_bounds_.assign(num_layers, {});
  ring_sent_.assign(num_layers * w_, 0);
  for (size_t t = 0; t < num_layers; ++t) {
    const uint64_t bytes = profile_.layers[t].param_bytes;
    std::vector<uint64_t>& bounds = ring_bounds_[t];
    for (uint64_t off = 0; off < bytes; off += partition) {
      const uint64_t elements = std::min(partition, bytes - off) / 4;
      for (int c = 0; c < w_; ++c) bounds.push_back(off + 4 * EvenSplitPoint(elements, w_, c));
    }
    bounds.push_back(bytes);
    // Per host: a reduce-scatter hop of every chunk but the two whose ring ends at or next to it
    // (distance W−1 and W−2 from where the ring starts), an all-gather hop of every chunk but
    // those at distance W−2 (the all-gather's last receiver).
    for (size_t g = 0; g + 1 < bounds.size(); ++g) {
      for (int h = 0; h < w_ && w_ > 1; ++h) {
        const int d = RingDistance(h, g);
        const int hops = (d <= w_ - 2 ? 1 : 0) + (d == w_ - 1 || d <= w_ - 3 ? 1 : 0);
        ring_sent_[t * w_ + h] += hops * ChunkBytes(static_cast<uint32_t>(t), g);
      }
    }
  }
}

RingTensor& Engine::RingState(int host, int64_t iteration, uint32_t tensor) {
  auto [it, inserted] = ring_[host].try_emplace(std::make_pair(iteration, tensor));
  if (inserted) {
    it->second.rs_in.assign(ring_bounds_[tensor].size() - 1, 0);
    it->second.ag_in.assign(ring_bounds_[tensor].size() - 1, 0);
  }
  return it->second;
}

void Engine::RingDropIfDone(int host, int64_t iteration, uint32_t tensor) {
  // Complete: every chunk's final value is here, so nothing more of it can legitimately arrive.
  if (received_[host][iteration * profile_.layers.size() + tensor] ==
      profile_.layers[tensor].param_bytes) {
    ring_[host].erase(std::make_pair(iteration, tensor));
  }
}

void Engine::RingLocalReady(int host, int64_t iteration, uint32_t tensor, TimeNs now) {
  RingTensor& st = RingState(host, iteration, tensor);
  st.local_ready = true;
  for (size_t g = 0; g + 1 < ring_bounds_[tensor].size() && error_.ok(); ++g) {
    const uint64_t len = ChunkBytes(tensor, g);
    if (len == 0) continue;
    const int d = RingDistance(host, g);
    if (w_ == 1) {
      RingFinal(host, iteration, tensor, g, now);
    } else if (d == 0) {
      RingSend(host, iteration, tensor, g, Direction::kPush, now);
    } else if (st.rs_in[g] == len) {
      RingReduce(host, iteration, tensor, g, now);
    }
  }
  RingDropIfDone(host, iteration, tensor);
}

void Engine::RingArrive(int host, int64_t iteration, uint32_t tensor, uint64_t begin, uint64_t end,
                        Direction direction, TimeNs now) {
  const size_t index = iteration * profile_.layers.size() + tensor;
  auto twice = [&] {
    Fail(absl::InternalError(absl::StrCat(
        "host ", host, " received more than once bytes of ", "tensor ", tensor, " in iteration ",
        iteration, " (", direction == Direction::kPush ? "reduce-scatter" : "all-gather",
        "): a policy sent a byte twice")));
  };
  if (received_[host][index] == profile_.layers[tensor].param_bytes) return twice();
  RingTensor& st = RingState(host, iteration, tensor);
  const std::vector<uint64_t>& bounds = ring_bounds_[tensor];
  while (begin < end && error_.ok()) {
    // The last chunk starting at or before `begin`: with empty chunks, the non-empty one.
    const size_t g = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end() - 1, begin) -
                                         bounds.begin() - 1);
    const uint64_t stop = std::min(end, bounds[g + 1]);
    const uint64_t len = ChunkBytes(tensor, g);
    const int d = RingDistance(host, g);
    if (direction == Direction::kPush) {
      // Reduce-scatter: every host but the ring's first receives the chunk once from the left.
      if (d == 0) {
        Fail(absl::InternalError(
            absl::StrCat("host ", host, ": reduce-scatter bytes of tensor ", tensor, " chunk ", g,
                         " arrived where the chunk's ring starts (iteration ", iteration, ")")));
        return;
      }
      st.rs_in[g] += stop - begin;
      if (st.rs_in[g] > len) return twice();
      if (st.rs_in[g] == len && st.local_ready) RingReduce(host, iteration, tensor, g, now);
    } else {
      // All-gather: every host but the sum's owner receives the final chunk once.
      if (d == w_ - 1) {
        Fail(absl::InternalError(absl::StrCat("host ", host, ": all-gather bytes of tensor ",
                                              tensor, " chunk ", g, " arrived at its owner ",
                                              "(iteration ", iteration, ")")));
        return;
      }
      st.ag_in[g] += stop - begin;
      if (st.ag_in[g] > len) return twice();
      if (st.ag_in[g] == len) {
        RingFinal(host, iteration, tensor, g, now);
        if (d <= w_ - 3) RingSend(host, iteration, tensor, g, Direction::kPull, now);
      }
    }
    begin = stop;
  }
  if (!error_.ok()) return;
  if (!ideal_) Pump(host, now);
  RingDropIfDone(host, iteration, tensor);
}

void Engine::RingReduce(int host, int64_t iteration, uint32_t tensor, size_t chunk, TimeNs now) {
  if (ideal_ || config_.aggregation_bytes_per_s <= 0) {
    RingReduced(host, iteration, tensor, chunk, now);
    return;
  }
  // The incoming partial sum plus the local gradient: 2·chunk input bytes.
  Host& h = hosts_[host];
  const long double ns = static_cast<long double>(ChunkBytes(tensor, chunk)) * 2 * 1e9L /
                         static_cast<long double>(config_.aggregation_bytes_per_s);
  h.agg_free = std::max(now, h.agg_free) + static_cast<TimeNs>(std::llround(ns));
  ring_jobs_.push_back(RingJob{iteration, tensor, chunk});
  Push(h.agg_free, EventType::kRingReduced, host, static_cast<int64_t>(ring_jobs_.size()) - 1);
}

void Engine::RingReduced(int host, int64_t iteration, uint32_t tensor, size_t chunk, TimeNs now) {
  const int d = RingDistance(host, chunk);
  if (d <= w_ - 2) {
    RingSend(host, iteration, tensor, chunk, Direction::kPush, now);
  } else {
    // The end of the reduce-scatter: this host owns the sum and starts the all-gather.
    RingFinal(host, iteration, tensor, chunk, now);
    RingSend(host, iteration, tensor, chunk, Direction::kPull, now);
  }
}

void Engine::RingFinal(int host, int64_t iteration, uint32_t tensor, size_t chunk, TimeNs now) {
  const size_t index = iteration * profile_.layers.size() + tensor;
  uint64_t& got = received_[host][index];
  got += ChunkBytes(tensor, chunk);
  if (got == profile_.layers[tensor].param_bytes && ResultReady(host, iteration, tensor)) {
    TryAdvance(host, now);
  }
}

void Engine::RingSend(int host, int64_t iteration, uint32_t tensor, size_t chunk,
                      Direction direction, TimeNs now) {
  const int peer = (host + 1) % w_;
  const uint64_t offset = ring_bounds_[tensor][chunk];
  const uint64_t length = ChunkBytes(tensor, chunk);
  if (ideal_) {
    // The bound's chain: the hop takes its bytes' time (less 1 ns per 4 KiB, see the header)
    // plus one latency, with no contention, no θ and no summing time.
    const int64_t id = NewMessage();
    Message& m = messages_[id];
    m.src = host;
    m.dst = peer;
    m.dispatch = -1;
    m.iteration = iteration;
    m.bytes = length;
    Segment seg;
    seg.key = MakeKey(tensor, 0);
    seg.priority = priority_[tensor];
    seg.direction = direction;
    seg.peer = static_cast<uint16_t>(peer);
    seg.iteration = iteration;
    seg.offset = offset;
    seg.length = length;
    seg.ready_at = now;
    m.segments.push_back(seg);
    const TimeNs hop =
        std::max<TimeNs>(0, TxNs(length) - RoundingSlack(length)) + config_.latency_ns;
    Push(now + hop, EventType::kRingChainArrive, peer, id);
    return;
  }
  ReadyRange range;
  range.tensor_id = tensor;
  range.priority = priority_[tensor];
  range.dtype = DType::kF32;
  range.direction = direction;
  range.peer = static_cast<uint16_t>(peer);
  range.iteration = iteration;
  range.tensor_bytes = profile_.layers[tensor].param_bytes;
  range.offset = offset;
  range.length = length;
  range.ring_hop = true;
  hosts_[host].policy->OnReady(range, now);
  NoteSchedule(host, range.iteration);
}

void Engine::PortArrive(int host, int64_t iteration, uint32_t tensor, uint64_t bytes, TimeNs now) {
  const size_t index = iteration * profile_.layers.size() + tensor;
  port_arrived_[host][index] += bytes;
  if (port_arrived_[host][index] == ring_sent_[tensor * w_ + (host + w_ - 1) % w_] &&
      ResultReady(host, iteration, tensor)) {
    TryAdvance(host, now);
  }
}

}  // namespace

std::string_view SimModeName(SimMode mode) {
  switch (mode) {
    case SimMode::kParameterServer:
      return "ps";
    case SimMode::kAllReduce:
      return "allreduce";
  }
  return "unknown";
}

absl::Status ValidateConfig(const ModelProfile& profile, const SimConfig& config) {
  if (config.mode != SimMode::kParameterServer && config.mode != SimMode::kAllReduce) {
    return absl::InvalidArgumentError("unknown mode");
  }
  if (config.workers < 1 || config.workers > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers must be in [1, 4096], got ", config.workers));
  }
  if (!std::isfinite(config.bandwidth_bits_per_s) || config.bandwidth_bits_per_s <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bandwidth must be a positive number of bits/s, got ", config.bandwidth_bits_per_s));
  }
  if (config.overhead_ns < 0 || config.latency_ns < 0) {
    return absl::InvalidArgumentError("overhead and latency must be >= 0");
  }
  if (config.overhead_ns > 1000 * kSecond || config.latency_ns > 1000 * kSecond) {
    return absl::InvalidArgumentError("overhead and latency must be below 1000 s");
  }
  if (!std::isfinite(config.aggregation_bytes_per_s) || config.aggregation_bytes_per_s < 0) {
    return absl::InvalidArgumentError("aggregation rate must be >= 0 (0: instantaneous)");
  }
  if (config.shard_partition_bytes == 0) {
    return absl::InvalidArgumentError("shard partition size must be > 0");
  }
  if (config.warmup_iterations < 0 || config.measured_iterations < 1 ||
      config.warmup_iterations > 100000 || config.measured_iterations > 100000) {
    return absl::InvalidArgumentError(
        "warmup iterations must be >= 0 and measured iterations >= 1 (at most 100000 each)");
  }
  if (config.start_skew_ns < 0 || config.start_skew_ns > 10 * kSecond) {
    return absl::InvalidArgumentError("start skew must be in [0, 10 s]");
  }
  if (!config.priorities.empty() && config.priorities.size() != profile.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "priorities: ", config.priorities.size(), " given for ", profile.layers.size(), " layers"));
  }
  if (profile.layers.empty()) {
    return absl::InvalidArgumentError("model profile has no layers");
  }
  if (profile.layers.size() >= (1ull << 32)) {
    return absl::InvalidArgumentError("model profile has too many layers");
  }
  // Inputs the simulator could only answer by exhausting memory or overflowing virtual time:
  // refuse them up front instead. Per-(worker, iteration, layer) state is kept for the run.
  const long double state = static_cast<long double>(config.workers) * profile.layers.size() *
                            (config.warmup_iterations + config.measured_iterations + 1);
  if (state > (1 << 25)) {
    return absl::InvalidArgumentError(
        "workers × layers × iterations exceeds 2^25: simulate fewer iterations or workers");
  }
  long double chunks = 0;
  long double bytes = 0;
  for (const ModelLayer& l : profile.layers) {
    chunks += std::ceil(static_cast<long double>(l.param_bytes) / config.shard_partition_bytes);
    bytes += l.param_bytes;
  }
  if (chunks > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the profile needs ", static_cast<double>(chunks),
                     " shard partitions (more than 2^24); raise the shard partition size"));
  }
  // All-reduce: 2(W−1) hops of W chunks per partition and iteration.
  if (config.mode == SimMode::kAllReduce &&
      chunks * config.workers * 2 * (config.workers - 1) > (1 << 26)) {
    return absl::InvalidArgumentError(
        "all-reduce: more than 2^26 ring hops per iteration; raise the shard partition size or "
        "simulate fewer workers");
  }
  const long double per_iteration_ns =
      static_cast<long double>(profile.ForwardNs()) + profile.BackwardNs() +
      2.0L * config.workers * bytes * 8e9L / config.bandwidth_bits_per_s +
      4.0L * (config.overhead_ns + config.latency_ns) * (chunks + 1) * config.workers +
      (config.aggregation_bytes_per_s > 0
           ? config.workers * bytes * 1e9L / config.aggregation_bytes_per_s
           : 0.0L);
  const long double iterations = config.warmup_iterations + config.measured_iterations + 1;
  if (per_iteration_ns * iterations > 1e18L) {
    return absl::InvalidArgumentError(
        "the simulated time could exceed 10^18 ns (31 years): fewer iterations, a faster link "
        "or a smaller model");
  }
  return absl::OkStatus();
}

double Rho(const ModelProfile& profile, const SimConfig& config) {
  const double w = config.workers;
  const double moved_bytes = 2.0 * (w - 1) / w * static_cast<double>(profile.TotalParamBytes());
  const double comm_ns = moved_bytes * 8e9 / config.bandwidth_bits_per_s;
  const double c = static_cast<double>(profile.ComputeNs());
  return c > 0 ? comm_ns / c : std::numeric_limits<double>::infinity();
}

bool ScaleComputeToRho(ModelProfile& profile, const SimConfig& config, double rho) {
  const double factor = Rho(profile, config) / rho;
  if (!std::isfinite(factor)) return false;
  for (ModelLayer& l : profile.layers) {
    l.fwd_ns = static_cast<TimeNs>(std::llround(static_cast<double>(l.fwd_ns) * factor));
    l.bwd_ns = static_cast<TimeNs>(std::llround(static_cast<double>(l.bwd_ns) * factor));
    l.ready_ns = static_cast<TimeNs>(std::llround(static_cast<double>(l.ready_ns) * factor));
  }
  return true;
}

absl::StatusOr<SimResult> Simulate(const ModelProfile& profile, const SimConfig& config,
                                   const PolicyFactory& factory, std::string_view label) {
  if (absl::Status s = ValidateConfig(profile, config); !s.ok()) return s;
  if (!factory) return absl::InvalidArgumentError("no policy factory");
  Engine engine(profile, config, /*ideal=*/false);
  return engine.Run(&factory, label);
}

absl::StatusOr<SimResult> SimulateIdeal(const ModelProfile& profile, const SimConfig& config) {
  if (absl::Status s = ValidateConfig(profile, config); !s.ok()) return s;
  if (config.mode == SimMode::kAllReduce) {
    // One run: every uplink a fluid port of its own, plus the ring chain (header comment).
    Engine engine(profile, config, /*ideal=*/true, IdealPorts{false, 0, true, true});
    absl::StatusOr<SimResult> r = engine.Run(nullptr, "ideal");
    if (r.ok()) r->variant = "all-reduce: every uplink + ring chain";
    return r;
  }
  // The bound is the largest of the single-port relaxations and the laggard chain: each is a
  // lower bound on its own.
  std::optional<SimResult> bound;
  for (int host = 0; host < config.workers; ++host) {
    for (bool uplink : {true, false}) {
      Engine engine(profile, config, /*ideal=*/true, IdealPorts{false, host, uplink});
      absl::StatusOr<SimResult> r = engine.Run(nullptr, "ideal");
      if (!r.ok()) return r.status();
      r->variant = absl::StrCat("host ", host, uplink ? " uplink" : " downlink", " relaxation");
      if (!bound.has_value() || r->mean_iteration_ns > bound->mean_iteration_ns) {
        bound = *std::move(r);
      }
    }
  }
  const LaggardChain chain = LaggardChainBound(
      profile, config, AssignShards(profile, config.workers, ShardUnitBytes(profile, config)));
  // From a cold start: the last host to reach its last layer's forward in iteration 0 does so
  // at its start skew plus the forward before it; each iteration adds at least the chain; the
  // last one adds the rest of its compute before the next start.
  const int64_t iterations = config.warmup_iterations + config.measured_iterations;
  const TimeNs chain_total = (config.workers - 1) * config.start_skew_ns + profile.ComputeNs() +
                             (iterations - 1) * chain.per_iteration_ns;
  bound->total_ns = std::max(bound->total_ns, chain_total);
  bound->single_port_mean_ns = bound->mean_iteration_ns;
  if (static_cast<double>(chain.per_iteration_ns) > bound->mean_iteration_ns) {
    bound->variant = absl::StrCat("laggard chain, host ", chain.host, " uplink");
    bound->iteration_ns.assign(bound->iteration_ns.size(), chain.per_iteration_ns);
    bound->mean_iteration_ns = static_cast<double>(chain.per_iteration_ns);
    DeriveShares(*bound);
  }
  return *std::move(bound);
}

absl::StatusOr<SimResult> SimulateFluid(const ModelProfile& profile, const SimConfig& config) {
  if (absl::Status s = ValidateConfig(profile, config); !s.ok()) return s;
  if (config.mode != SimMode::kParameterServer) {
    return absl::InvalidArgumentError("the fluid reference exists in ps mode only");
  }
  Engine engine(profile, config, /*ideal=*/true, IdealPorts{true, 0, true});
  absl::StatusOr<SimResult> r = engine.Run(nullptr, "fluid");
  if (r.ok()) r->variant = "all ports";
  return r;
}

}  // namespace gradlane::sched::sim
