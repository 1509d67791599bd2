// Unit tests of the operator telemetry (issue #7): the engine→reader ring and snapshot exchange,
// the reader's state (histograms, queues, preemptions, iteration times, retention), traces,
// the Prometheus families (the transport backend's own included: a verbs description with its
// counters and a port counter), the admin commands and servers, and the ops flags' parsers.
#include "daemon/telemetry.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "daemon/admin_server.h"
#include "daemon/metrics.h"
#include "daemon/ops.h"
#include "daemon/telemetry_hub.h"
#include "daemon/telemetry_state.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "transport/verbs/verbs_describe.h"

namespace gradlane::daemon {
namespace {

using nlohmann::json;
using sched::kMillisecond;
using sched::kSecond;
using sched::TimeNs;

constexpr uint8_t kPush = 0;
constexpr uint8_t kPull = 1;

TelemetryEvent Ev(EventType type, int64_t iteration, TimeNs t1, TimeNs t0 = 0, uint64_t key = 0,
                  uint64_t offset = 0, uint64_t length = 100, uint16_t peer = 1,
                  uint8_t direction = kPush, int32_t priority = 0, uint32_t slot = 0,
                  uint32_t generation = 0) {
  return TelemetryEvent{type, direction, peer,   slot,   generation, priority,
                        key,  iteration, offset, length, t0,         t1};
}

TEST(PriorityClassTest, BoundedLogClasses) {
  EXPECT_EQ(PriorityClass(-5), 0);
  EXPECT_EQ(PriorityClass(0), 0);
  EXPECT_EQ(PriorityClass(1), 1);
  EXPECT_EQ(PriorityClass(2), 2);
  EXPECT_EQ(PriorityClass(3), 2);
  EXPECT_EQ(PriorityClass(4), 3);
  EXPECT_EQ(PriorityClass(63), 6);
  EXPECT_EQ(PriorityClass(64), 7);
  EXPECT_EQ(PriorityClass(1 << 30), 7);
  EXPECT_STREQ(PriorityClassName(2), "2-3");
  EXPECT_STREQ(PriorityClassName(7), "64+");
}

TEST(EventRingTest, FifoWrapAndDropWhenFull) {
  EventRing ring(5);  // rounded up to 8
  EXPECT_EQ(ring.capacity(), 8u);
  std::vector<TelemetryEvent> out;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 8; ++i) EXPECT_TRUE(ring.Push_st(Ev(EventType::kPosted, round * 8 + i, 1)));
    EXPECT_FALSE(ring.Push_st(Ev(EventType::kPosted, 999, 1)));  // full: dropped
    out.clear();
    EXPECT_EQ(ring.Drain(out, 3), 3u);
    EXPECT_EQ(ring.Drain(out, 100), 5u);
    ASSERT_EQ(out.size(), 8u);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i].iteration, round * 8 + i);
  }
  EXPECT_EQ(ring.dropped(), 3u);
}

TEST(EventRingTest, ConcurrentProducerConsumerKeepOrderAndAccountForEveryEvent) {
  EventRing ring(64);
  constexpr int64_t kEvents = 200000;
  std::atomic<bool> done{false};
  std::thread producer([&] {
    for (int64_t i = 0; i < kEvents; ++i) ring.Push_st(Ev(EventType::kPosted, i, i));
    done.store(true);
  });
  std::vector<TelemetryEvent> out;
  int64_t last = -1;
  uint64_t got = 0;
  for (;;) {
    const bool finished = done.load();
    out.clear();
    ring.Drain(out, 1000);
    for (const auto& e : out) {
      ASSERT_GT(e.iteration, last);  // in order, never torn or repeated
      ASSERT_EQ(e.t1, e.iteration);
      last = e.iteration;
    }
    got += out.size();
    if (finished && out.empty()) break;
  }
  producer.join();
  EXPECT_EQ(got + ring.dropped(), static_cast<uint64_t>(kEvents));
}

TEST(SnapshotExchangeTest, ReaderSeesLatestCompleteSnapshotNeverATornOne) {
  SnapshotExchange x;
  EXPECT_EQ(x.Latest().sequence, 0u);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t seq = 1; seq <= 20000; ++seq) {
      EngineSnapshot& s = x.Back_st();
      s.sequence = seq;
      s.job_count = static_cast<uint32_t>(seq % 7);
      if (s.jobs.size() < s.job_count) s.jobs.resize(s.job_count);
      for (uint32_t i = 0; i < s.job_count; ++i) s.jobs[i].slot = static_cast<uint32_t>(seq);
      x.Publish_st();
    }
    done.store(true);
  });
  uint64_t last = 0;
  while (!done.load()) {
    const EngineSnapshot& s = x.Latest();
    ASSERT_GE(s.sequence, last);
    last = s.sequence;
    ASSERT_EQ(s.job_count, s.sequence % 7);
    for (uint32_t i = 0; i < s.job_count; ++i) ASSERT_EQ(s.jobs[i].slot, s.sequence);
  }
  writer.join();
  EXPECT_EQ(x.Latest().sequence, 20000u);
}

TEST(HistogramTest, PrometheusLeBuckets) {
  Histogram h(&DelayBuckets());
  h.Observe(1e-5);  // exactly the first bound: in it (le)
  h.Observe(1.1e-5);
  h.Observe(100);  // above every bound: +Inf
  EXPECT_EQ(h.count(), 3u);
  EXPECT_EQ(h.counts()[0], 1u);
  EXPECT_EQ(h.counts()[1], 1u);
  EXPECT_EQ(h.counts().back(), 1u);
  EXPECT_DOUBLE_EQ(h.sum(), 1e-5 + 1.1e-5 + 100);
}

EngineSnapshot OneJobSnapshot(uint64_t seq, TimeNs at, const std::string& id = "job-a",
                              uint32_t slot = 0, uint32_t generation = 0) {
  EngineSnapshot s;
  s.sequence = seq;
  s.taken_at = at;
  s.job_count = 1;
  s.jobs.resize(1);
  JobSnapshot& j = s.jobs[0];
  j.slot = slot;
  j.generation = generation;
  j.id = id;
  j.rank = 0;
  j.world = 3;
  j.policy = "p3";
  j.phase = "active";
  j.peer_count = 2;
  j.peers.resize(2);
  j.peers[0].rank = 1;
  j.peers[0].address = "10.0.0.2:7610";
  j.peers[0].state = PeerStateName::kUp;
  j.peers[1].rank = 2;
  j.peers[1].address = "10.0.0.3:7610";
  j.peers[1].state = PeerStateName::kDown;
  return s;
}

TEST(TelemetryStateTest, QueuesDelaysPreemptionsAndBytesByPeer) {
  TelemetryState st;
  st.OnSnapshot(OneJobSnapshot(1, 0), 0);
  // Two ranges enter the policy: a less urgent one first (priority 9 at t=1 ms), then an
  // urgent one (priority 0 at t=2 ms).
  st.OnEvent(Ev(EventType::kReady, 0, 1 * kMillisecond, 0, 5, 0, 1000, 1, kPush, 9));
  st.OnEvent(Ev(EventType::kReady, 0, 2 * kMillisecond, 0, 1, 0, 400, 2, kPush, 0));
  const JobTelemetry* j = st.FindJob(0, 0);
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->queued_bytes[PriorityClass(9)], 1000);
  EXPECT_EQ(j->queued_bytes[0], 400);
  // The urgent one goes first: it overtakes bytes queued since 1 ms — a preemption.
  st.OnEvent(
      Ev(EventType::kDispatched, 0, 3 * kMillisecond, 2 * kMillisecond, 1, 0, 400, 2, kPush, 0));
  EXPECT_EQ(j->preemptions, 1u);
  // Then the old one, in two segments: nothing older waits, no preemption.
  st.OnEvent(
      Ev(EventType::kDispatched, 0, 4 * kMillisecond, 1 * kMillisecond, 5, 0, 600, 1, kPush, 9));
  st.OnEvent(
      Ev(EventType::kDispatched, 0, 5 * kMillisecond, 1 * kMillisecond, 5, 600, 400, 1, kPush, 9));
  EXPECT_EQ(j->preemptions, 1u);
  EXPECT_EQ(j->queued_bytes[0], 0);
  EXPECT_EQ(j->queued_bytes[PriorityClass(9)], 0);
  EXPECT_TRUE(j->queued_by_ready.empty());
  // Queueing delay by class: class 0 waited 1 ms; class 4 (8-15) waited 3 ms and 4 ms.
  EXPECT_EQ(st.queueing_delay()[0].count(), 1u);
  EXPECT_NEAR(st.queueing_delay()[0].sum(), 1e-3, 1e-12);
  EXPECT_EQ(st.queueing_delay()[PriorityClass(9)].count(), 2u);
  EXPECT_NEAR(st.queueing_delay()[PriorityClass(9)].sum(), 7e-3, 1e-12);
  // Latency from acks.
  st.OnEvent(Ev(EventType::kAcked, 0, 9 * kMillisecond, 4 * kMillisecond, 5, 0, 600, 1, kPush));
  st.OnEvent(Ev(EventType::kAcked, 0, 9 * kMillisecond, 8 * kMillisecond, 7, 0, 10, 1, kPull));
  EXPECT_EQ(st.segment_latency()[0].count(), 1u);
  EXPECT_NEAR(st.segment_latency()[0].sum(), 5e-3, 1e-12);
  EXPECT_EQ(st.segment_latency()[1].count(), 1u);
  // Received bytes.
  st.OnEvent(Ev(EventType::kReceived, 0, 9 * kMillisecond, 0, 7, 0, 77, 2, kPull, 3));
  // Bytes by peer address (from the snapshot), direction and class.
  auto sent = st.SentByPeer();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent["10.0.0.2:7610"].bytes[0][PriorityClass(9)], 1000u);
  EXPECT_EQ(sent["10.0.0.2:7610"].segments[0][PriorityClass(9)], 2u);
  EXPECT_EQ(sent["10.0.0.3:7610"].bytes[0][0], 400u);
  auto recv = st.ReceivedByPeer();
  EXPECT_EQ(recv["10.0.0.3:7610"].bytes[1][PriorityClass(3)], 77u);
  auto pol = st.ByPolicy();
  EXPECT_EQ(pol["p3"].segments, 3u);
  EXPECT_EQ(pol["p3"].preemptions, 1u);
}

TEST(TelemetryStateTest, IterationTimeIsStartToStart) {
  TelemetryState st;
  st.OnSnapshot(OneJobSnapshot(1, 0), 0);
  // Iteration k starts at k * 100 ms (+ a second post of the same iteration later).
  for (int k = 0; k < 5; ++k) {
    st.OnEvent(Ev(EventType::kPosted, k, k * 100 * kMillisecond));
    st.OnEvent(Ev(EventType::kPosted, k, k * 100 * kMillisecond + 30 * kMillisecond));
  }
  const JobTelemetry* j = st.FindJob(0, 0);
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->iteration, 4);
  EXPECT_EQ(j->iteration_seconds.count(), 4u);
  EXPECT_NEAR(j->iteration_seconds.sum(), 0.4, 1e-9);
  EXPECT_NEAR(j->last_iteration_seconds, 0.1, 1e-9);
}

TEST(TelemetryStateTest, EndedJobsAreRetainedThenFoldedIntoTotals) {
  TelemetryState st(10 * kSecond);
  st.OnSnapshot(OneJobSnapshot(1, 0), 0);
  st.OnEvent(Ev(EventType::kDispatched, 0, 2, 1, 1, 0, 500, 1));
  // Next snapshot: the job is gone (released).
  EngineSnapshot empty;
  empty.sequence = 2;
  empty.taken_at = kSecond;
  st.OnSnapshot(empty, kSecond);
  const JobTelemetry* j = st.FindJob(0, 0);
  ASSERT_NE(j, nullptr);
  EXPECT_TRUE(j->ended);
  empty.sequence = 3;
  st.OnSnapshot(empty, 12 * kSecond);  // past the retention
  EXPECT_EQ(st.FindJob(0, 0), nullptr);
  // Its bytes still count, under the peer's address.
  EXPECT_EQ(st.SentByPeer()["10.0.0.2:7610"].bytes[0][0], 500u);
  EXPECT_EQ(st.ByPolicy()["p3"].segments, 1u);
}

// Parses a trace and checks, per lane, that complete events nest and are ordered; returns the
// events by category.
std::map<std::string, int> CheckTraceJson(const std::string& text) {
  json doc = json::parse(text, nullptr, false);
  EXPECT_FALSE(doc.is_discarded());
  std::map<std::string, int> cats;
  std::map<int, std::vector<std::pair<double, double>>> stacks;
  double last = -1e300;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
    EXPECT_GE(e["dur"].get<double>(), 0);
    EXPECT_GE(ts, last);
    last = ts;
    auto& st = stacks[e["tid"].get<int>()];
    while (!st.empty() && st.back().second <= ts + 1e-3 && !(end == ts && st.back().first == ts)) {
      st.pop_back();
    }
    if (!st.empty()) {
      EXPECT_GE(ts, st.back().first - 1e-3);
      EXPECT_LE(end, st.back().second + 1e-3) << e.dump();
    }
    st.push_back({ts, end});
    ++cats[e["cat"].get<std::string>()];
  }
  return cats;
}

TEST(TraceRecorderTest, RecordsTheWindowNestedAndOrdered) {
  TelemetryState st;
  st.OnSnapshot(OneJobSnapshot(1, 0), 0);
  TimeNs t = kSecond;
  auto iteration = [&](int64_t k) {
    // A post, one push (ready, dispatched, acked), one shard round, the pull back, completion.
    st.OnEvent(Ev(EventType::kPosted, k, t, 0, sched::MakeKey(3, 0), 0, 800));
    st.OnEvent(Ev(EventType::kReady, k, t, 0, sched::MakeKey(3, 0), 0, 800, 1, kPush, 2));
    st.OnEvent(Ev(EventType::kRoundOpened, k, t + 1000, 0, sched::MakeKey(4, 0), 0, 800));
    st.OnEvent(
        Ev(EventType::kDispatched, k, t + 2000, t, sched::MakeKey(3, 0), 0, 800, 1, kPush, 2));
    st.OnEvent(Ev(EventType::kDispatched, k, t + 2500, t, sched::MakeKey(3, 0), 0, 0, 2, kPush, 2));
    st.OnEvent(
        Ev(EventType::kAcked, k, t + 9000, t + 2000, sched::MakeKey(3, 0), 0, 800, 1, kPush));
    st.OnEvent(Ev(EventType::kAcked, k, t + 9500, t + 2500, sched::MakeKey(3, 0), 0, 0, 2, kPush));
    st.OnEvent(Ev(EventType::kRoundReduced, k, t + 12000, 0, sched::MakeKey(4, 0), 0, 800));
    st.OnEvent(Ev(EventType::kReady, k, t + 12000, 0, sched::MakeKey(4, 0), 0, 800, 1, kPull, 1));
    st.OnEvent(Ev(EventType::kDispatched, k, t + 12000, t + 12000, sched::MakeKey(4, 0), 0, 800, 1,
                  kPull, 1));
    st.OnEvent(
        Ev(EventType::kAcked, k, t + 20000, t + 12000, sched::MakeKey(4, 0), 0, 800, 1, kPull));
    st.OnEvent(Ev(EventType::kPostDone, k, t + 30000, 0, sched::MakeKey(3, 0), 0, 800));
    t += 100 * kMillisecond;
  };
  iteration(0);
  ASSERT_TRUE(st.StartTrace("job-a", 2, 1000, t, t + 10 * kSecond).ok());
  EXPECT_FALSE(st.StartTrace("job-a", 1, 10, t, t + kSecond).ok());  // one at a time
  EXPECT_EQ(st.PollTrace(t), TraceRecorder::State::kWaiting);
  iteration(1);
  iteration(2);
  EXPECT_EQ(st.PollTrace(t), TraceRecorder::State::kRecording);
  iteration(3);  // its first post shows iteration 2 had all its posts
  EXPECT_EQ(st.PollTrace(t), TraceRecorder::State::kDone);
  const auto& spans = st.trace().spans();
  // Per iteration: 3 segments, 1 round, 1 post; plus 2 iteration spans. Iteration 3 is outside.
  EXPECT_EQ(spans.size(), 2u * 5 + 2);
  for (const TraceSpan& s : spans) EXPECT_TRUE(s.iteration == 1 || s.iteration == 2);
  absl::StatusOr<std::string> text = st.trace().Take();
  ASSERT_TRUE(text.ok()) << text.status();
  auto cats = CheckTraceJson(*text);
  EXPECT_EQ(cats["segment"], 6);
  EXPECT_EQ(cats["queue"], 6);
  EXPECT_EQ(cats["wire"], 6);
  EXPECT_EQ(cats["aggregation"], 2);
  EXPECT_EQ(cats["post"], 2);
  EXPECT_EQ(cats["iteration"], 2);
  EXPECT_FALSE(st.trace().armed());
  EXPECT_TRUE(st.trace().spans().empty());  // buffer freed
}

TEST(TraceRecorderTest, BufferIsBoundedAndOverflowIsCounted) {
  TelemetryState st;
  st.OnSnapshot(OneJobSnapshot(1, 0), 0);
  ASSERT_TRUE(st.StartTrace("job-a", 1, 3, 0, 10 * kSecond).ok());
  st.OnEvent(Ev(EventType::kPosted, 0, 10));
  for (uint64_t i = 0; i < 10; ++i) {
    st.OnEvent(Ev(EventType::kDispatched, 0, 20, 10, sched::MakeKey(1, i), 0, 5));
    st.OnEvent(Ev(EventType::kAcked, 0, 30, 20, sched::MakeKey(1, i), 0, 5));
  }
  EXPECT_EQ(st.trace().spans().size(), 3u);
  EXPECT_EQ(st.trace().spans().capacity(), 3u);  // never grew past the armed buffer
  EXPECT_EQ(st.trace().spans_dropped(), 7u);
}

TEST(TraceRecorderTest, UnknownJobNoProgressAndEndedJobAreClearErrors) {
  TelemetryState st;
  st.OnSnapshot(OneJobSnapshot(1, 0), 0);
  EXPECT_TRUE(absl::IsNotFound(st.StartTrace("nope", 1, 10, 0, kSecond)));
  EXPECT_TRUE(absl::IsInvalidArgument(st.StartTrace("job-a", 0, 10, 0, kSecond)));
  ASSERT_TRUE(st.StartTrace("job-a", 1, 10, 0, kSecond).ok());
  EXPECT_EQ(st.PollTrace(kSecond / 2), TraceRecorder::State::kWaiting);
  EXPECT_EQ(st.PollTrace(kSecond), TraceRecorder::State::kDone);
  auto r = st.trace().Take();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no new iteration"), std::string::npos);
  // A job that ends while armed finishes the trace.
  ASSERT_TRUE(st.StartTrace("job-a", 1, 10, 0, 100 * kSecond).ok());
  EngineSnapshot s = OneJobSnapshot(2, kSecond);
  s.jobs[0].phase = "ended";
  st.OnSnapshot(s, kSecond);
  EXPECT_EQ(st.PollTrace(kSecond), TraceRecorder::State::kDone);
  EXPECT_NE(st.trace().Take().status().message().find("ended"), std::string::npos);
}

// A hub over a Telemetry that a test publishes into as the engine would.
struct HubFixture {
  Telemetry telemetry;
  std::unique_ptr<TelemetryHub> hub;
  HubFixture() {
    HubSources src;
    src.telemetry = &telemetry;
    src.engine_stats = [] {
      EngineStats s;
      s.jobs_active = 1;
      s.posts_completed = 42;
      return s;
    };
    src.transport_stats = [] {
      transport::TransportStats t;
      t.total.bytes_sent = 1234;
      t.errors[static_cast<size_t>(transport::WireError::kAuthFailed)] = 2;
      return t;
    };
    src.backend = [] {
      // As VerbsTransport describes itself, with a port counter as soft-RoCE has one.
      transport::BackendDescription d;
      d.backend = "verbs";
      d.info = {{"device", "rxe0"}, {"port", "1"}, {"gid_index", "1"}};
      transport::verbs::VerbsStats v;
      v.eager_sends = 7;
      v.rendezvous_headers = 3;
      v.clear_to_send = 3;
      v.rendezvous_writes = 3;
      v.registrations = 5;
      v.rnr_errors = 1;
      transport::verbs::AppendVerbsCounters(v, d.counters);
      d.counters.push_back({"verbs_hw_sent_pkts",
                            transport::CounterType::Counter,
                            "gradlane_verbs_hw_counters_total",
                            {{"device", "rxe0"}, {"port", "1"}, {"counter", "sent_pkts"}},
                            "the driver's counter",
                            12});
      return d;
    };
    src.version = "test";
    src.link_bytes_per_second = 1.25e9;
    hub = std::make_unique<TelemetryHub>(std::move(src));
    EngineSnapshot& s = telemetry.SnapshotBack_st();
    s = OneJobSnapshot(0, 1);
    s.jobs[0].bandwidth_bytes_per_s = 1e9;
    s.jobs[0].srtt_ns = 200000;
    telemetry.PublishSnapshot_st();
    telemetry.Emit_st(Ev(EventType::kPosted, 0, 1));
    telemetry.Emit_st(Ev(EventType::kPosted, 1, 1 + 50 * kMillisecond));
    telemetry.Emit_st(Ev(EventType::kDispatched, 1, 3, 2, 1, 0, 100, 1, kPush, 5));
  }
};

TEST(MetricsTest, FamiliesFollowPrometheusConventions) {
  HubFixture f;
  auto families = CollectMetrics(*f.hub);
  std::map<std::string, const prometheus::MetricFamily*> by_name;
  for (const auto& fam : families) {
    EXPECT_TRUE(by_name.emplace(fam.name, &fam).second) << "duplicate family " << fam.name;
    EXPECT_EQ(fam.name.rfind("gradlane_", 0), 0u) << fam.name;
    if (fam.type == prometheus::MetricType::Counter) {
      EXPECT_TRUE(fam.name.size() > 6 && fam.name.substr(fam.name.size() - 6) == "_total")
          << fam.name;
    }
    for (const auto& m : fam.metric) {
      for (const auto& l : m.label) {
        EXPECT_NE(l.name, "job") << fam.name << ": 'job' clashes with Prometheus' target label";
        EXPECT_NE(l.name, "tensor") << fam.name;
      }
    }
  }
  for (const char* n :
       {"gradlane_sent_bytes_total", "gradlane_received_bytes_total",
        "gradlane_link_capacity_bytes_per_second", "gradlane_bandwidth_estimate_bytes_per_second",
        "gradlane_rtt_seconds", "gradlane_credit_in_use_bytes", "gradlane_queueing_delay_seconds",
        "gradlane_segment_latency_seconds", "gradlane_preemptions_total", "gradlane_blocks_total",
        "gradlane_segments_total", "gradlane_job_iteration_seconds", "gradlane_errors_total",
        "gradlane_job_peer_up", "gradlane_engine_heartbeat_age_seconds"}) {
    EXPECT_TRUE(by_name.contains(n)) << n;
  }
  // Histograms: cumulative buckets ending in +Inf, count equal to the last bucket.
  const auto* it = by_name.at("gradlane_job_iteration_seconds");
  ASSERT_EQ(it->metric.size(), 1u);
  const auto& h = it->metric[0].histogram;
  EXPECT_EQ(h.sample_count, 1u);
  EXPECT_NEAR(h.sample_sum, 0.05, 1e-9);
  EXPECT_TRUE(std::isinf(h.bucket.back().upper_bound));
  EXPECT_EQ(h.bucket.back().cumulative_count, h.sample_count);
  for (size_t i = 1; i < h.bucket.size(); ++i) {
    EXPECT_GE(h.bucket[i].cumulative_count, h.bucket[i - 1].cumulative_count);
  }
  const auto* sent = by_name.at("gradlane_sent_bytes_total");
  ASSERT_EQ(sent->metric.size(), 1u);
  EXPECT_EQ(sent->metric[0].counter.value, 100);
  std::map<std::string, std::string> labels;
  for (const auto& l : sent->metric[0].label) labels[l.name] = l.value;
  EXPECT_EQ(labels["peer"], "10.0.0.2:7610");
  EXPECT_EQ(labels["direction"], "push");
  EXPECT_EQ(labels["priority_class"], "4-7");
  const auto* up = by_name.at("gradlane_job_peer_up");
  ASSERT_EQ(up->metric.size(), 2u);
  EXPECT_EQ(up->metric[0].gauge.value + up->metric[1].gauge.value, 1);  // one up, one down
}

// The sample of family `name` whose labels include every one of `want`; null when none.
const prometheus::ClientMetric* Sample(const std::vector<prometheus::MetricFamily>& families,
                                       const std::string& name,
                                       const std::map<std::string, std::string>& want = {}) {
  for (const auto& f : families) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      size_t matched = 0;
      for (const auto& l : m.label) {
        const auto it = want.find(l.name);
        if (it != want.end() && it->second == l.value) ++matched;
      }
      if (matched == want.size()) return &m;
    }
  }
  return nullptr;
}

TEST(MetricsTest, TheTransportBackendAndItsOwnCountersAreExported) {
  HubFixture f;
  const auto families = CollectMetrics(*f.hub);
  const auto* info =
      Sample(families, "gradlane_transport_info",
             {{"backend", "verbs"}, {"device", "rxe0"}, {"port", "1"}, {"gid_index", "1"}});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->gauge.value, 1);
  const auto* eager = Sample(families, "gradlane_verbs_eager_sends_total");
  ASSERT_NE(eager, nullptr);
  EXPECT_EQ(eager->counter.value, 7);
  for (const char* step : {"header", "clear_to_send", "write"}) {
    const auto* r = Sample(families, "gradlane_verbs_rendezvous_total", {{"step", step}});
    ASSERT_NE(r, nullptr) << step;
    EXPECT_EQ(r->counter.value, 3) << step;
  }
  const auto* rnr = Sample(families, "gradlane_verbs_error_completions_total",
                           {{"status", "receiver_not_ready"}});
  ASSERT_NE(rnr, nullptr);
  EXPECT_EQ(rnr->counter.value, 1);
  const auto* regs = Sample(families, "gradlane_verbs_registrations");
  ASSERT_NE(regs, nullptr);
  EXPECT_EQ(regs->gauge.value, 5);
  const auto* hw = Sample(families, "gradlane_verbs_hw_counters_total", {{"counter", "sent_pkts"}});
  ASSERT_NE(hw, nullptr);
  EXPECT_EQ(hw->counter.value, 12);
  // A counter without a metric of its own is left to the status reply.
  for (const auto& fam : families) EXPECT_EQ(fam.name.find("segments_acked"), std::string::npos);
  const auto types = [&](const std::string& name) {
    for (const auto& fam : families) {
      if (fam.name == name) return fam.type;
    }
    return prometheus::MetricType::Untyped;
  };
  EXPECT_EQ(types("gradlane_verbs_registered_bytes"), prometheus::MetricType::Gauge);
  EXPECT_EQ(types("gradlane_verbs_completions_total"), prometheus::MetricType::Counter);
}

TEST(MetricsServerTest, ServesAndABusyPortIsAnError) {
  HubFixture f;
  auto a = MetricsServer::Start("127.0.0.1:0", f.hub.get());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_GT((*a)->port(), 0);
  auto b = MetricsServer::Start(absl::StrCat("127.0.0.1:", (*a)->port()), f.hub.get());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("cannot listen"), std::string::npos) << b.status();
  EXPECT_FALSE(MetricsServer::Start("not-an-address", f.hub.get()).ok());
}

TEST(AdminCommandTest, CommandsAndErrors) {
  HubFixture f;
  AdminOptions o;
  json r = AdminCommand(*f.hub, o, json{{"cmd", "status"}});
  EXPECT_TRUE(r["ok"]);
  EXPECT_EQ(r["jobs_active"], 1);
  EXPECT_EQ(r["posts_completed"], 42);
  EXPECT_EQ(r["backend"], "verbs");
  EXPECT_EQ(r["backend_info"]["device"], "rxe0");
  EXPECT_EQ(r["backend_info"]["gid_index"], "1");
  std::map<std::string, json> rows;
  for (const json& c : r["backend_counters"]) rows[c["name"].get<std::string>()] = c;
  ASSERT_TRUE(rows.contains("verbs_eager_sends"));
  EXPECT_EQ(rows["verbs_eager_sends"]["value"], 7);
  EXPECT_FALSE(rows["verbs_eager_sends"]["help"].get<std::string>().empty());
  EXPECT_EQ(rows["verbs_segments_acked"]["value"], 0);  // no metric, but in the reply
  EXPECT_EQ(rows["verbs_hw_sent_pkts"]["value"], 12);
  r = AdminCommand(*f.hub, o, json{{"cmd", "jobs"}});
  ASSERT_EQ(r["jobs"].size(), 1u);
  EXPECT_EQ(r["jobs"][0]["job"], "job-a");
  EXPECT_EQ(r["jobs"][0]["iteration"], 1);
  r = AdminCommand(*f.hub, o, json{{"cmd", "peers"}});
  ASSERT_EQ(r["peers"].size(), 2u);
  EXPECT_EQ(r["peers"][1]["state"], "down");
  r = AdminCommand(*f.hub, o, json{{"cmd", "queues"}});
  EXPECT_EQ(r["jobs"][0]["classes"].size(), static_cast<size_t>(kPriorityClasses));
  r = AdminCommand(*f.hub, o, json{{"cmd", "bandwidth"}});
  EXPECT_EQ(r["jobs"][0]["bandwidth_bytes_per_second"], 1e9);
  EXPECT_DOUBLE_EQ(r["jobs"][0]["srtt_seconds"].get<double>(), 2e-4);
  r = AdminCommand(*f.hub, o, json{{"cmd", "reboot"}});
  EXPECT_FALSE(r["ok"]);
  EXPECT_NE(r["error"].get<std::string>().find("unknown command"), std::string::npos);
  EXPECT_FALSE(AdminCommand(*f.hub, o, json::array())["ok"]);
  EXPECT_FALSE(AdminCommand(*f.hub, o, json{{"cmd", 3}})["ok"]);
}

std::string Ask(const std::string& path, const std::string& line) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  std::string in;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) in.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return in;
}

TEST(AdminServerTest, ServesOverItsSocketAndRefusesToStealALiveOne) {
  HubFixture f;
  char dir[] = "/tmp/gl-admin-test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  AdminOptions o;
  o.socket_path = std::string(dir) + "/d.admin.sock";
  auto s = AdminServer::Start(o, f.hub.get());
  ASSERT_TRUE(s.ok()) << s.status();
  json r = json::parse(Ask(o.socket_path, "{\"cmd\":\"jobs\"}\n"), nullptr, false);
  ASSERT_FALSE(r.is_discarded());
  EXPECT_EQ(r["jobs"][0]["job"], "job-a");
  r = json::parse(Ask(o.socket_path, "garbage\n"), nullptr, false);
  EXPECT_FALSE(r["ok"]);
  r = json::parse(Ask(o.socket_path, "{\"cmd\":\"trace\",\"job\":\"nope\"}\n"), nullptr, false);
  EXPECT_FALSE(r["ok"]);
  EXPECT_NE(r["error"].get<std::string>().find("no active job"), std::string::npos);
  r = json::parse(Ask(o.socket_path, "{\"cmd\":\"trace\",\"job\":\"job-a\",\"iterations\":0}\n"),
                  nullptr, false);
  EXPECT_FALSE(r["ok"]);
  r = json::parse(Ask(o.socket_path, std::string(5000, 'x')), nullptr, false);
  EXPECT_FALSE(r["ok"]);  // over-long request line
  auto second = AdminServer::Start(o, f.hub.get());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another gradlaned"), std::string::npos);
  (*s)->Stop();
  EXPECT_NE(::access(o.socket_path.c_str(), F_OK), 0);  // removed
  ::rmdir(dir);
}

TEST(OpsFlagsTest, LinkRateAndAdminSocketDefaults) {
  EXPECT_DOUBLE_EQ(*ParseLinkRate("25gbit"), 25e9 / 8);
  EXPECT_DOUBLE_EQ(*ParseLinkRate("400Mbit"), 400e6 / 8);
  EXPECT_DOUBLE_EQ(*ParseLinkRate("0"), 0);
  EXPECT_DOUBLE_EQ(*ParseLinkRate("8e9"), 1e9);
  EXPECT_FALSE(ParseLinkRate("fast").ok());
  EXPECT_FALSE(ParseLinkRate("-1gbit").ok());
  EXPECT_FALSE(ParseLinkRate("gbit").ok());
  EXPECT_EQ(DefaultAdminSocket("/run/gradlane/gradlaned.sock"),
            "/run/gradlane/gradlaned.admin.sock");
  EXPECT_EQ(DefaultAdminSocket("/tmp/x"), "/tmp/x.admin");
}

}  // namespace
}  // namespace gradlane::daemon
