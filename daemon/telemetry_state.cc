#include "daemon/telemetry_state.h"

#include <algorithm>
#include <queue>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace gradlane::daemon {

using sched::TimeNs;

namespace {

double Seconds(TimeNs ns) { return static_cast<double>(ns) / 1e9; }

// A job that failed or whose client closed: it sends nothing more.
bool Over(const JobSnapshot& j) { return j.phase == "failed" || j.phase == "ended"; }

int Dir(uint8_t d) { return d == static_cast<uint8_t>(sched::Direction::kPull) ? 1 : 0; }

}  // namespace

const std::vector<double>& DelayBuckets() {
  static const std::vector<double> k = {1e-5,   2.5e-5, 5e-5, 1e-4,   2.5e-4, 5e-4, 1e-3,
                                        2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2,   0.1,  0.25,
                                        0.5,    1,      2.5,  5,      10};
  return k;
}

const std::vector<double>& IterationBuckets() {
  static const std::vector<double> k = {1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                                        0.5,  1,      2.5,  5,    10,     30,   60,  120};
  return k;
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(bounds->size() + 1, 0) {}

void Histogram::Observe(double v) {
  const auto it = std::lower_bound(bounds_->begin(), bounds_->end(), v);  // first bound >= v
  ++counts_[static_cast<size_t>(it - bounds_->begin())];
  ++count_;
  sum_ += v;
}

void TrafficCounters::Merge(const TrafficCounters& o) {
  for (int d = 0; d < kDirections; ++d) {
    for (int c = 0; c < kPriorityClasses; ++c) {
      bytes[d][c] += o.bytes[d][c];
      segments[d][c] += o.segments[d][c];
    }
  }
}

bool TrafficCounters::empty() const {
  for (const auto& d : segments) {
    for (uint64_t n : d) {
      if (n != 0) return false;
    }
  }
  return true;
}

JobTelemetry::JobTelemetry() : iteration_seconds(&IterationBuckets()) {}

std::string JobTelemetry::PeerName(uint16_t rank) const {
  if (rank < peer_addresses.size() && !peer_addresses[rank].empty()) return peer_addresses[rank];
  return absl::StrCat("rank ", rank);
}

// ---------------------------------------------------------------------------- traces ----

void TraceRecorder::Arm(const std::string& job_id, uint32_t slot, uint32_t generation,
                        uint16_t rank, int64_t after_iteration, int iterations, size_t max_spans,
                        TimeNs now, TimeNs deadline) {
  Cancel();
  state_ = State::kWaiting;
  job_id_ = job_id;
  slot_ = slot;
  generation_ = generation;
  rank_ = rank;
  after_ = after_iteration;
  iterations_ = iterations;
  max_spans_ = max_spans;
  armed_at_ = now;
  deadline_ = deadline;
  spans_.reserve(max_spans);  // the fixed-size buffer: nothing grows while recording
}

void TraceRecorder::Cancel() {
  state_ = State::kIdle;
  spans_ = {};
  dropped_ = 0;
  open_segments_.clear();
  open_rounds_.clear();
  open_posts_.clear();
  iteration_spans_.clear();
  next_started_ = false;
  ready_pending_ = 0;
  end_reason_.clear();
}

void TraceRecorder::Keep(const TraceSpan& s) {
  if (spans_.size() < max_spans_) {
    spans_.push_back(s);
  } else {
    ++dropped_;
  }
}

void TraceRecorder::OnEvent(const TelemetryEvent& e) {
  if (!Matches(e.job_slot, e.job_generation)) return;
  if (state_ == State::kWaiting) {
    if (e.type == EventType::kBlock || e.iteration <= after_) return;
    first_ = e.iteration;  // the first event of a new iteration opens the window
    state_ = State::kRecording;
  }
  if (e.type == EventType::kPosted && e.iteration >= first_ + iterations_) next_started_ = true;
  if (e.type == EventType::kBlock || !InWindow(e.iteration)) return;
  const SegId id{Dir(e.direction) == 1 ? uint8_t{1} : uint8_t{0}, e.peer, e.key, e.iteration,
                 e.offset};
  TraceSpan s{};
  s.direction = id.direction;
  s.peer = e.peer;
  s.priority = e.priority;
  s.key = e.key;
  s.iteration = e.iteration;
  s.offset = e.offset;
  s.length = e.length;
  switch (e.type) {
    case EventType::kReady:
      ready_pending_ += static_cast<int64_t>(e.length);
      break;
    case EventType::kDispatched:
      ready_pending_ -= static_cast<int64_t>(e.length);
      s.kind = TraceSpan::kSegment;
      // The engine stamps a dispatch with its loop's time, which may be a few microseconds
      // older than a ready time read from the clock later in the same round: clamp, so the
      // queue span never ends before it starts.
      s.t0 = e.t0;
      s.t1 = std::max(e.t1, e.t0);
      open_segments_[id] = s;
      break;
    case EventType::kAcked:
      if (auto it = open_segments_.find(id); it != open_segments_.end()) {
        it->second.t2 = std::max(e.t1, it->second.t1);
        Keep(it->second);
        open_segments_.erase(it);
      }
      break;
    case EventType::kRoundOpened:
      s.kind = TraceSpan::kRound;
      s.t0 = e.t1;
      open_rounds_[SegId{0, 0, e.key, e.iteration, 0}] = s;
      break;
    case EventType::kRoundReduced:
      if (auto it = open_rounds_.find(SegId{0, 0, e.key, e.iteration, 0});
          it != open_rounds_.end()) {
        it->second.t1 = std::max(e.t1, it->second.t0);
        Keep(it->second);
        open_rounds_.erase(it);
      }
      break;
    case EventType::kPosted: {
      s.kind = TraceSpan::kPost;
      s.direction = 0;
      s.peer = 0;
      s.t0 = e.t1;
      open_posts_[SegId{0, 0, e.key, e.iteration, e.offset}] = s;
      IterationSpan& is = iteration_spans_[e.iteration];
      if (is.first == 0 || e.t1 < is.first) is.first = e.t1;
      ++is.outstanding;
      break;
    }
    case EventType::kPostDone:
      if (auto it = open_posts_.find(SegId{0, 0, e.key, e.iteration, e.offset});
          it != open_posts_.end()) {
        it->second.t1 = std::max(e.t1, it->second.t0);
        it->second.priority = e.priority;  // the completion status
        Keep(it->second);
        open_posts_.erase(it);
        IterationSpan& is = iteration_spans_[e.iteration];
        is.last = std::max(is.last, e.t1);
        --is.outstanding;
      }
      break;
    case EventType::kReceived:
    case EventType::kBlock:
      break;
  }
}

TraceRecorder::State TraceRecorder::Poll(TimeNs now, bool job_ended) {
  if (state_ == State::kWaiting) {
    if (job_ended) {
      Finish("the job ended before a new iteration started");
    } else if (now >= deadline_) {
      Finish("no new iteration of the job started before the deadline");
    }
  } else if (state_ == State::kRecording) {
    if (next_started_ && spans_open() == 0 && ready_pending_ <= 0) {
      Finish("complete");
    } else if (job_ended) {
      Finish("the job ended");
    } else if (now >= deadline_) {
      Finish("deadline reached");
    }
  }
  return state_;
}

void TraceRecorder::Finish(const char* why) {
  end_reason_ = why;
  for (const auto& [it, is] : iteration_spans_) {
    if (is.first == 0 || is.last == 0 || is.outstanding != 0) continue;
    TraceSpan s{};
    s.kind = TraceSpan::kIteration;
    s.iteration = it;
    s.t0 = is.first;
    s.t1 = is.last;
    Keep(s);
  }
  state_ = State::kDone;
}

absl::StatusOr<std::string> TraceRecorder::Take() {
  if (state_ != State::kDone) return absl::FailedPreconditionError("trace not finished");
  if (spans_.empty()) {
    const std::string why = end_reason_;
    Cancel();
    return absl::FailedPreconditionError(absl::StrCat("nothing recorded: ", why));
  }
  // Tracks: one per kind and peer; within a track, lanes so that spans in one lane never
  // overlap (a lane is a trace "thread": Chrome and Perfetto nest complete events by time on
  // their thread, so overlapping siblings would render as false parents).
  struct Item {
    const TraceSpan* s;
    TimeNs begin, end;
  };
  std::map<std::string, std::vector<Item>> tracks;
  TimeNs origin = std::numeric_limits<TimeNs>::max();
  for (const TraceSpan& s : spans_) {
    std::string track;
    TimeNs end = s.t1;
    switch (s.kind) {
      case TraceSpan::kIteration:
        track = "0 iterations";
        break;
      case TraceSpan::kPost:
        track = "1 posts";
        break;
      case TraceSpan::kRound:
        track = "2 shard aggregation";
        break;
      case TraceSpan::kSegment:
        track = absl::StrCat(s.direction == 1 ? "4 pull" : "3 push", " -> rank ", s.peer);
        end = s.t2;
        break;
    }
    tracks[track].push_back(Item{&s, s.t0, std::max(end, s.t0)});
    origin = std::min(origin, s.t0);
  }
  auto us = [origin](TimeNs t) { return static_cast<double>(t - origin) / 1e3; };
  nlohmann::json events = nlohmann::json::array();
  const int pid = rank_;
  events.push_back(
      {{"ph", "M"},
       {"name", "process_name"},
       {"pid", pid},
       {"tid", 0},
       {"args", {{"name", absl::StrCat("gradlaned rank ", rank_, " job ", job_id_)}}}});
  int next_tid = 1;
  struct Out {
    double ts, dur;
    int tid;
    int order;  // parent before children at equal ts
    nlohmann::json ev;
  };
  std::vector<Out> out;
  out.reserve(spans_.size() * 3);
  for (auto& [name, items] : tracks) {
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.begin < b.begin; });
    // Min-heap of (lane end, lane index).
    std::priority_queue<std::pair<TimeNs, int>, std::vector<std::pair<TimeNs, int>>, std::greater<>>
        free_at;
    std::vector<int> lane_tid;
    for (const Item& item : items) {
      int lane;
      if (!free_at.empty() && free_at.top().first <= item.begin) {
        lane = free_at.top().second;
        free_at.pop();
      } else {
        lane = static_cast<int>(lane_tid.size());
        lane_tid.push_back(next_tid++);
        events.push_back({{"ph", "M"},
                          {"name", "thread_name"},
                          {"pid", pid},
                          {"tid", lane_tid.back()},
                          {"args", {{"name", absl::StrCat(name.substr(2), " #", lane)}}}});
        events.push_back({{"ph", "M"},
                          {"name", "thread_sort_index"},
                          {"pid", pid},
                          {"tid", lane_tid.back()},
                          {"args", {{"sort_index", lane_tid.back()}}}});
      }
      free_at.push({item.end, lane});
      const int tid = lane_tid[lane];
      const TraceSpan& s = *item.s;
      const uint32_t tensor = sched::KeyTensor(s.key);
      const uint32_t part = sched::KeyPartition(s.key);
      auto complete = [&](const std::string& n, const char* cat, TimeNs b, TimeNs e, int order,
                          nlohmann::json args) {
        out.push_back(Out{us(b),
                          us(e) - us(b),
                          tid,
                          order,
                          {{"ph", "X"},
                           {"name", n},
                           {"cat", cat},
                           {"pid", pid},
                           {"tid", tid},
                           {"ts", us(b)},
                           {"dur", us(e) - us(b)},
                           {"args", std::move(args)}}});
      };
      switch (s.kind) {
        case TraceSpan::kIteration:
          complete(absl::StrCat("iteration ", s.iteration), "iteration", s.t0, s.t1, 0,
                   {{"iteration", s.iteration}});
          break;
        case TraceSpan::kPost:
          complete(absl::StrCat("post t", tensor), "post", s.t0, s.t1, 0,
                   {{"tensor", tensor},
                    {"iteration", s.iteration},
                    {"offset", s.offset},
                    {"length", s.length},
                    {"status", s.priority}});
          break;
        case TraceSpan::kRound:
          complete(absl::StrCat("reduce t", tensor, ".p", part), "aggregation", s.t0, s.t1, 0,
                   {{"tensor", tensor}, {"partition", part}, {"iteration", s.iteration}});
          break;
        case TraceSpan::kSegment: {
          nlohmann::json args = {
              {"tensor", tensor},         {"partition", part},
              {"iteration", s.iteration}, {"offset", s.offset},
              {"length", s.length},       {"priority", s.priority},
              {"peer", s.peer},           {"direction", s.direction == 1 ? "pull" : "push"}};
          const TimeNs acked = std::max(s.t2, s.t1);
          complete(absl::StrCat(s.direction == 1 ? "pull t" : "push t", tensor, ".p", part),
                   "segment", s.t0, acked, 0, args);
          complete("queue", "queue", s.t0, s.t1, 1, {{"priority", s.priority}});
          complete("wire", "wire", s.t1, acked, 2, {{"length", s.length}});
          break;
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Out& a, const Out& b) {
    if (a.ts != b.ts) return a.ts < b.ts;
    if (a.tid != b.tid) return a.tid < b.tid;
    return a.order < b.order;
  });
  for (Out& o : out) events.push_back(std::move(o.ev));
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ns"},
                        {"otherData",
                         {{"job", job_id_},
                          {"rank", rank_},
                          {"first_iteration", first_},
                          {"iterations", iterations_},
                          {"spans", spans_.size()},
                          {"spans_dropped", dropped_},
                          {"spans_incomplete", spans_open()},
                          {"end", end_reason_},
                          {"clock", "CLOCK_MONOTONIC"},
                          {"origin_ns", origin}}}};
  std::string text = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  Cancel();
  return text;
}

// ----------------------------------------------------------------------------- state ----

TelemetryState::TelemetryState(TimeNs job_retention) : retention_(job_retention) {
  for (auto& h : segment_latency_) h = Histogram(&DelayBuckets());
}

JobTelemetry& TelemetryState::Job(uint32_t slot, uint32_t generation, TimeNs t) {
  auto [it, inserted] = jobs_.try_emplace({slot, generation});
  if (inserted) {
    it->second.slot = slot;
    it->second.generation = generation;
    it->second.first_event = t;
  }
  return it->second;
}

const JobTelemetry* TelemetryState::FindJob(uint32_t slot, uint32_t generation) const {
  auto it = jobs_.find({slot, generation});
  return it == jobs_.end() ? nullptr : &it->second;
}

void TelemetryState::OnEvent(const TelemetryEvent& e) {
  ++events_;
  trace_.OnEvent(e);
  JobTelemetry& j = Job(e.job_slot, e.job_generation, e.t1);
  const int cls = PriorityClass(e.priority);
  const int dir = Dir(e.direction);
  switch (e.type) {
    case EventType::kReady:
      j.queued_bytes[cls] += static_cast<int64_t>(e.length);
      j.queued_by_ready[e.t1] += e.length;
      break;
    case EventType::kDispatched: {
      j.queued_bytes[cls] =
          std::max<int64_t>(0, j.queued_bytes[cls] - static_cast<int64_t>(e.length));
      auto it = j.queued_by_ready.find(e.t0);
      if (it != j.queued_by_ready.end()) {
        it->second -= std::min(it->second, e.length);
        if (it->second == 0) j.queued_by_ready.erase(it);
      }
      if (!j.queued_by_ready.empty() && j.queued_by_ready.begin()->first < e.t0) ++j.preemptions;
      ++j.segments_sent;
      if (j.sent.size() <= e.peer) j.sent.resize(e.peer + 1u);
      j.sent[e.peer].Add(dir, cls, e.length);
      queueing_delay_[cls].Observe(Seconds(std::max<TimeNs>(0, e.t1 - e.t0)));
      break;
    }
    case EventType::kAcked:
      segment_latency_[dir].Observe(Seconds(std::max<TimeNs>(0, e.t1 - e.t0)));
      break;
    case EventType::kReceived:
      if (j.received.size() <= e.peer) j.received.resize(e.peer + 1u);
      j.received[e.peer].Add(dir, cls, e.length);
      break;
    case EventType::kPosted:
      ++j.posts;
      if (e.iteration > j.iteration) {
        if (j.iteration >= 0) {
          j.last_iteration_seconds = Seconds(e.t1 - j.iteration_started);
          j.iteration_seconds.Observe(j.last_iteration_seconds);
        }
        j.iteration = e.iteration;
        j.iteration_started = e.t1;
      }
      break;
    case EventType::kPostDone:
      ++j.posts_done;
      break;
    case EventType::kBlock:
      ++j.blocks;
      break;
    case EventType::kRoundOpened:
    case EventType::kRoundReduced:
      break;
  }
}

void TelemetryState::OnSnapshot(const EngineSnapshot& snap, TimeNs now) {
  if (snap.sequence == 0 || snap.sequence == snapshot_.sequence) return;
  snapshot_.sequence = snap.sequence;
  snapshot_.taken_at = snap.taken_at;
  snapshot_.listen_port = snap.listen_port;
  snapshot_.job_count = snap.job_count;
  snapshot_.jobs.assign(snap.jobs.begin(), snap.jobs.begin() + snap.job_count);
  std::map<std::pair<uint32_t, uint32_t>, const JobSnapshot*> live;
  for (const JobSnapshot& js : snapshot_.jobs) live[{js.slot, js.generation}] = &js;
  for (const JobSnapshot& js : snapshot_.jobs) {
    JobTelemetry& j = Job(js.slot, js.generation, snap.taken_at);
    j.in_snapshot = true;
    j.id = js.id;
    j.policy = js.policy;
    for (uint32_t i = 0; i < js.peer_count; ++i) {
      const PeerSnapshot& p = js.peers[i];
      if (j.peer_addresses.size() <= p.rank) j.peer_addresses.resize(p.rank + 1u);
      if (!p.address.empty()) j.peer_addresses[p.rank] = p.address;
    }
    if (Over(js)) {
      j.queued_bytes.fill(0);
      j.queued_by_ready.clear();
    }
  }
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobTelemetry& j = it->second;
    if (!live.contains(it->first) && !j.ended && (j.in_snapshot || j.first_event < snap.taken_at)) {
      // Released (or so short-lived that no snapshot caught it).
      j.ended = true;
      j.ended_at = now;
      j.queued_bytes.fill(0);
      j.queued_by_ready.clear();
    }
    if (j.ended && now - j.ended_at >= retention_ && !trace_.Matches(j.slot, j.generation)) {
      Retire(j);
      it = jobs_.erase(it);
      continue;
    }
    ++it;
  }
}

void TelemetryState::Retire(const JobTelemetry& j) {
  const JobTelemetry& m = j;
  for (uint16_t r = 0; r < m.sent.size(); ++r) {
    if (!m.sent[r].empty()) retired_sent_[m.PeerName(r)].Merge(m.sent[r]);
  }
  for (uint16_t r = 0; r < m.received.size(); ++r) {
    if (!m.received[r].empty()) retired_received_[m.PeerName(r)].Merge(m.received[r]);
  }
  PolicyCounters& p = retired_policy_[m.policy.empty() ? "unknown" : m.policy];
  p.segments += m.segments_sent;
  p.blocks += m.blocks;
  p.preemptions += m.preemptions;
}

std::map<std::string, TrafficCounters> TelemetryState::SentByPeer() const {
  std::map<std::string, TrafficCounters> out = retired_sent_;
  for (auto& [key, j] : jobs_) {
    const JobTelemetry& m = j;
    for (uint16_t r = 0; r < m.sent.size(); ++r) {
      if (!m.sent[r].empty()) out[m.PeerName(r)].Merge(m.sent[r]);
    }
  }
  return out;
}

std::map<std::string, TrafficCounters> TelemetryState::ReceivedByPeer() const {
  std::map<std::string, TrafficCounters> out = retired_received_;
  for (auto& [key, j] : jobs_) {
    const JobTelemetry& m = j;
    for (uint16_t r = 0; r < m.received.size(); ++r) {
      if (!m.received[r].empty()) out[m.PeerName(r)].Merge(m.received[r]);
    }
  }
  return out;
}

std::map<std::string, TelemetryState::PolicyCounters> TelemetryState::ByPolicy() const {
  std::map<std::string, PolicyCounters> out = retired_policy_;
  for (auto& [key, j] : jobs_) {
    PolicyCounters& p = out[j.policy.empty() ? "unknown" : j.policy];
    p.segments += j.segments_sent;
    p.blocks += j.blocks;
    p.preemptions += j.preemptions;
  }
  return out;
}

absl::Status TelemetryState::StartTrace(const std::string& job_id, int iterations, size_t max_spans,
                                        TimeNs now, TimeNs deadline) {
  if (iterations < 1) return absl::InvalidArgumentError("--iterations must be at least 1");
  if (trace_.armed()) return absl::UnavailableError("a trace is already being recorded");
  const JobSnapshot* found = nullptr;
  for (const JobSnapshot& js : snapshot_.jobs) {
    if (js.id == job_id && !Over(js)) found = &js;
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("no active job '", job_id, "' on this daemon"));
  }
  const JobTelemetry* j = FindJob(found->slot, found->generation);
  trace_.Arm(job_id, found->slot, found->generation, found->rank, j != nullptr ? j->iteration : -1,
             iterations, max_spans, now, deadline);
  return absl::OkStatus();
}

TraceRecorder::State TelemetryState::PollTrace(TimeNs now) {
  if (!trace_.armed()) return trace_.state();
  bool ended = true;
  for (const JobSnapshot& js : snapshot_.jobs) {
    // Matches() is true only for the armed job's slot and generation.
    if (trace_.Matches(js.slot, js.generation) && !Over(js)) ended = false;
  }
  return trace_.Poll(now, ended);
}

}  // namespace gradlane::daemon
