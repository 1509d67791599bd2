// Unit tests of gradlane's outer loop (sched/policies/gradlane_selector.h): the leader tries
// every candidate and keeps the fastest (or an earlier one within the noise of a runoff's
// scores), tries again when the iteration time drifts, followers run the leader's decision
// (and only a newer one), and a switch never puts two candidates' windows in flight at once
// nor loses or repeats a byte.
#include "sched/policies/gradlane_selector.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sched/policies/prophet.h"
#include "tests/unit/heap_counter.h"

namespace gradlane::sched {
namespace {

constexpr uint64_t kTensorBytes = 1 << 20;
constexpr uint64_t kCredit = 256 << 10;

ReadyRange Push(int64_t iteration, uint16_t peer = 1, uint32_t tensor = 0) {
  ReadyRange r;
  r.tensor_id = tensor;
  r.peer = peer;
  r.iteration = iteration;
  r.tensor_bytes = kTensorBytes;
  r.length = kTensorBytes;
  return r;
}

// Candidates "a", "b", "c": bytescheduler with a small window, so that each holds a backlog.
std::unique_ptr<GradlaneSelector> MakeSelector(int count = 3) {
  std::vector<GradlaneSelector::Candidate> candidates;
  for (int i = 0; i < count; ++i) {
    PolicyConfig c;
    c.name = "bytescheduler";
    c.partition_bytes = 64 << 10;
    c.credit_bytes = kCredit;
    auto p = MakePolicy(c);
    EXPECT_TRUE(p.ok()) << p.status();
    candidates.push_back({std::string(1, static_cast<char>('a' + i)), *std::move(p)});
  }
  auto s = std::make_unique<GradlaneSelector>(std::move(candidates));
  s->RegisterTensor({0, kTensorBytes, DType::kF32, 0});
  return s;
}

// Sends everything queued and acknowledges it at once (a link with no delay).
uint64_t Drain(Policy& p, TimeNs now) {
  Dispatch d;
  uint64_t sent = 0;
  for (int guard = 0; p.queued_segments() > 0 || p.credit_in_use() > 0; ++guard) {
    EXPECT_LT(guard, 100000) << "no progress";
    if (guard >= 100000) break;
    uint64_t batch = 0;
    while (p.NextDispatch(now, d)) batch += d.bytes;
    if (batch == 0 && p.credit_in_use() == 0) break;
    p.OnAcked(batch, now);
    sent += batch;
  }
  return sent;
}

// Runs iterations [from, to) on `s`: iteration k starts at `*now`, and lasts what `duration`
// says for the candidate active in it. Returns the candidate of each iteration.
std::vector<std::string> RunIterations(GradlaneSelector& s, int64_t from, int64_t to, TimeNs* now,
                                       const std::map<std::string, TimeNs>& duration) {
  std::vector<std::string> ran;
  for (int64_t k = from; k < to; ++k) {
    s.OnReady(Push(k), *now);
    ran.emplace_back(s.active_name());
    EXPECT_EQ(Drain(s, *now), kTensorBytes);
    *now += duration.at(std::string(s.active_name()));
  }
  return ran;
}

TEST(GradlaneSelectorTest, TriesEveryCandidateThenKeepsTheFastest) {
  auto s = MakeSelector();
  EXPECT_TRUE(s->leader());
  TimeNs now = kSecond;
  const std::map<std::string, TimeNs> duration = {
      {"a", 100 * kMillisecond}, {"b", 60 * kMillisecond}, {"c", 80 * kMillisecond}};
  // Iteration 5 warms up with the first candidate, then three iterations each.
  const std::vector<std::string> ran = RunIterations(*s, 5, 18, &now, duration);
  const std::vector<std::string> expected = {"a", "a", "a", "a", "b", "b", "b",
                                             "c", "c", "c", "b", "b", "b"};
  EXPECT_EQ(ran, expected);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->explorations(), 1u);
  // Each score is the mean of the trial's last two iterations; steady periods need no runoff.
  EXPECT_EQ(s->score(0), 100 * kMillisecond);
  EXPECT_EQ(s->score(1), 60 * kMillisecond);
  EXPECT_EQ(s->score(2), 80 * kMillisecond);
  EXPECT_EQ(s->runoffs(), 0u);
}

// Runs iterations [from, to) on `s` where each candidate's periods repeat a cycle of its own,
// advanced by every iteration it runs (as a schedule's do at W = 8). Returns who ran each.
std::vector<std::string> RunCycles(GradlaneSelector& s, int64_t from, int64_t to, TimeNs* now,
                                   const std::map<std::string, std::vector<TimeNs>>& cycles) {
  std::map<std::string, size_t> runs;
  std::vector<std::string> ran;
  for (int64_t k = from; k < to; ++k) {
    s.OnReady(Push(k), *now);
    const std::string name(s.active_name());
    ran.push_back(name);
    EXPECT_EQ(Drain(s, *now), kTensorBytes);
    const std::vector<TimeNs>& cycle = cycles.at(name);
    *now += cycle[runs[name]++ % cycle.size()];
  }
  return ran;
}

// a steady at 100 ms, b cycling 80, 120, 100, 80 (mean 95), c steady at 150: b's round trial
// scores 120 and 100 (mean 110), behind a, but within b's own spread (20/110).
std::map<std::string, std::vector<TimeNs>> CyclingB() {
  return {{"a", {100 * kMillisecond}},
          {"b", {80 * kMillisecond, 120 * kMillisecond, 100 * kMillisecond, 80 * kMillisecond}},
          {"c", {150 * kMillisecond}}};
}

TEST(GradlaneSelectorTest, ARunoffRanksCandidatesThatTwoPeriodsCannot) {
  auto s = MakeSelector();
  TimeNs now = 0;
  // a and b run again, 9 iterations each scored by the last 8, and b, the faster on average,
  // is kept.
  const auto cycles = CyclingB();
  const std::vector<std::string> ran = RunCycles(*s, 0, 30, &now, cycles);
  std::vector<std::string> expected = {"a", "a", "a", "a", "b", "b", "b", "c", "c", "c"};
  expected.insert(expected.end(), 9, "a");
  expected.insert(expected.end(), 9, "b");
  expected.insert(expected.end(), 2, "b");
  EXPECT_EQ(ran, expected);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->runoffs(), 1u);
  EXPECT_EQ(s->active_name(), "b");
  EXPECT_EQ(s->score(0), 100 * kMillisecond);
  EXPECT_EQ(s->score(1), 95 * kMillisecond);
  EXPECT_EQ(s->score(2), 150 * kMillisecond) << "the round's score of a candidate not in it";
}

// Five candidates of which four are too close to call in the round. b wins the round (94, 104:
// 99 ms); a (105) and c are within b's spread (10/99), e only within its own (80, 140: 110 ms,
// beyond b's spread, within e's 60/110); d (150) is beyond both. Over whole cycles c is the
// fastest (90 ms; b 99, a 105, e 115), though its round periods (124, 84: 104) rank it third.
std::map<std::string, std::vector<TimeNs>> FourTooCloseToCall() {
  return {{"a", {105 * kMillisecond}},
          {"b", {100 * kMillisecond, 94 * kMillisecond, 104 * kMillisecond, 98 * kMillisecond}},
          {"c", {60 * kMillisecond, 124 * kMillisecond, 84 * kMillisecond, 92 * kMillisecond}},
          {"d", {150 * kMillisecond}},
          {"e", {120 * kMillisecond, 80 * kMillisecond, 140 * kMillisecond, 120 * kMillisecond}}};
}

// kLatestChoiceIteration bounds the choice (the benchmarks' warm-ups rest on it): as many
// candidates as gradlane has, every one within the others' spread, so all of them run again.
TEST(GradlaneSelectorTest, TheChoiceComesByTheLatestChoiceIteration) {
  const int count = static_cast<int>(std::size(kGradlaneCandidates));
  auto s = MakeSelector(count);
  std::map<std::string, std::vector<TimeNs>> cycles;
  for (int i = 0; i < count; ++i) {
    cycles[std::string(1, static_cast<char>('a' + i))] = {90 * kMillisecond, 110 * kMillisecond};
  }
  const std::string last(1, static_cast<char>('a' + count - 1));
  cycles[last] = {88 * kMillisecond, 108 * kMillisecond};  // 2% faster: it wins
  TimeNs now = 0;
  RunCycles(*s, 0, kLatestChoiceIteration, &now, cycles);
  EXPECT_TRUE(s->in_runoff()) << "a runoff of all of them is still running";
  EXPECT_EQ(s->entrants().size(), static_cast<size_t>(count));
  RunCycles(*s, kLatestChoiceIteration, kLatestChoiceIteration + 1, &now, cycles);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->active_name(), last);
}

// The runoff takes every candidate within the spread, not only the round's best two.
TEST(GradlaneSelectorTest, ARunoffTakesEveryCandidateWithinTheSpread) {
  auto s = MakeSelector(5);
  TimeNs now = 0;
  const std::vector<std::string> ran = RunCycles(*s, 0, 56, &now, FourTooCloseToCall());
  std::vector<std::string> expected = {"a"};
  for (const char* name : {"a", "b", "c", "d", "e"}) expected.insert(expected.end(), 3, name);
  // The round's winner first, then the others by their round scores.
  for (const char* name : {"b", "c", "a", "e"}) expected.insert(expected.end(), 9, name);
  expected.insert(expected.end(), 4, "c");
  EXPECT_EQ(ran, expected);
  EXPECT_EQ(s->entrants(), (std::vector<size_t>{1, 2, 0, 4}));
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->runoffs(), 1u);
  EXPECT_EQ(s->active_name(), "c");
  EXPECT_EQ(s->score(2), 90 * kMillisecond);
  EXPECT_EQ(s->score(1), 99 * kMillisecond);
  EXPECT_EQ(s->score(4), 115 * kMillisecond);
  EXPECT_EQ(s->score(3), 150 * kMillisecond) << "the round's score of a candidate not in it";
}

// a and b tie in the round (2000 ms; b's periods 1900 and 2100 put it in a runoff); c is too
// slow. In the runoff a and b score the given halves: four periods each at the first, four at
// the second. Returns which of them is kept.
std::string KeptAfterANoisyRunoff(TimeNs a_first, TimeNs a_second, TimeNs b_first,
                                  TimeNs b_second) {
  std::vector<TimeNs> a(5, 2000 * kMillisecond);  // warm-up, round, the runoff's first
  std::vector<TimeNs> b = {2000 * kMillisecond, 1900 * kMillisecond, 2100 * kMillisecond,
                           2000 * kMillisecond};
  a.insert(a.end(), 4, a_first * kMillisecond);
  a.insert(a.end(), 4, a_second * kMillisecond);
  b.insert(b.end(), 4, b_first * kMillisecond);
  b.insert(b.end(), 4, b_second * kMillisecond);
  auto s = MakeSelector();
  TimeNs now = 0;
  const std::vector<std::string> ran =
      RunCycles(*s, 0, 30, &now, {{"a", a}, {"b", b}, {"c", {3000 * kMillisecond}}});
  std::vector<std::string> expected = {"a", "a", "a", "a", "b", "b", "b", "c", "c", "c"};
  expected.insert(expected.end(), 9, "a");
  expected.insert(expected.end(), 9, "b");
  EXPECT_EQ(std::vector<std::string>(ran.begin(), ran.begin() + 28), expected);
  EXPECT_EQ(s->runoffs(), 1u);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(ran.back(), s->active_name());
  return std::string(s->active_name());
}

TEST(GradlaneSelectorTest, ARunoffKeepsTheEarlierCandidateWhereTheScoresDifferByLessThanNoise) {
  // a: 2008 ms, halves 16 apart (noise 8); b: noise 6. Together hypot(8, 6) = 10 ms.
  EXPECT_EQ(KeptAfterANoisyRunoff(2000, 2016, 1993, 2005), "a") << "b 9 ms faster: within 10";
  EXPECT_EQ(KeptAfterANoisyRunoff(2000, 2016, 1990, 2002), "b") << "b 12 ms faster: beyond 10";
  EXPECT_EQ(KeptAfterANoisyRunoff(2000, 2016, 1999, 1999), "b")
      << "b 9 ms faster and steady: beyond a's noise of 8 alone";
  // a slows down in its trial (2000, then 2080: noise 40) against a steady 2010: 30 ms behind,
  // within the noise, but more than 1% of b's score.
  EXPECT_EQ(KeptAfterANoisyRunoff(2000, 2080, 2010, 2010), "b") << "capped at kRunoffTieShare";
  // Where every candidate's periods are steady only an exact tie goes to the earlier one.
  EXPECT_EQ(KeptAfterANoisyRunoff(2000, 2000, 1999, 1999), "b");
  EXPECT_EQ(KeptAfterANoisyRunoff(2000, 2000, 2000, 2000), "a");
}

TEST(GradlaneSelectorTest, ARunoffThatScoresNoneKeepsTheRoundsWinnerAndItsScore) {
  auto s = MakeSelector();
  TimeNs now = 0;
  const auto cycles = CyclingB();
  // The round (iterations 1–9) and the runoff's first iteration (10, a's), unmeasured yet.
  RunCycles(*s, 0, 11, &now, cycles);
  ASSERT_TRUE(s->in_runoff());
  // The client's indices jump past the whole runoff: nothing of it was measured.
  RunCycles(*s, 40, 41, &now, cycles);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->active_name(), "a");
  EXPECT_EQ(s->score(0), 100 * kMillisecond) << "its round score";
  // And with that score a drift is still seen: a slows to 200 ms, the trials start again.
  RunIterations(*s, 41, 49, &now,
                {{"a", 200 * kMillisecond}, {"b", 200 * kMillisecond}, {"c", 200 * kMillisecond}});
  EXPECT_TRUE(s->exploring());
}

TEST(GradlaneSelectorTest, NoRunoffWhereTheGapExceedsTheSpread) {
  auto s = MakeSelector();
  TimeNs now = 0;
  // b cycles by 10% around 66 against a's steady 100: two periods are enough.
  const std::map<std::string, std::vector<TimeNs>> cycles = {
      {"a", {100 * kMillisecond}},
      {"b", {63 * kMillisecond, 70 * kMillisecond}},
      {"c", {150 * kMillisecond}}};
  const std::vector<std::string> ran = RunCycles(*s, 0, 12, &now, cycles);
  EXPECT_EQ(ran.back(), "b");
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->runoffs(), 0u);
}

TEST(GradlaneSelectorTest, TheFirstCandidateWinsATie) {
  auto s = MakeSelector();
  TimeNs now = 0;
  RunIterations(*s, 0, 12, &now,
                {{"a", 70 * kMillisecond}, {"b", 70 * kMillisecond}, {"c", 70 * kMillisecond}});
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->active_name(), "a");
}

TEST(GradlaneSelectorTest, ACandidateWithASkippedIterationIsNotChosen) {
  auto s = MakeSelector();
  TimeNs now = 0;
  const std::map<std::string, TimeNs> d = {
      {"a", 100 * kMillisecond}, {"b", 60 * kMillisecond}, {"c", 80 * kMillisecond}};
  RunIterations(*s, 0, 5, &now, d);   // warm-up, a's trial, b's first iteration
  RunIterations(*s, 6, 12, &now, d);  // iteration 5 (one of b's scored ones) never came
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->active_name(), "c");
}

TEST(GradlaneSelectorTest, ADriftingIterationTimeStartsTheTrialsAgain) {
  auto s = MakeSelector();
  TimeNs now = 0;
  RunIterations(*s, 0, 12, &now,
                {{"a", 100 * kMillisecond}, {"b", 60 * kMillisecond}, {"c", 80 * kMillisecond}});
  ASSERT_EQ(s->active_name(), "b");
  // A 10% change is noise: no new trials.
  RunIterations(*s, 12, 20, &now,
                {{"a", 100 * kMillisecond}, {"b", 66 * kMillisecond}, {"c", 80 * kMillisecond}});
  EXPECT_FALSE(s->exploring());
  // The link got slower for b, and a is now the fastest: after three drifted iterations the
  // trials start again at the next multiple of kTrialAlignIterations (24; the third drifted
  // period, iteration 22's, is known when 23 starts), and a wins.
  const std::map<std::string, TimeNs> slower = {
      {"a", 90 * kMillisecond}, {"b", 120 * kMillisecond}, {"c", 150 * kMillisecond}};
  RunIterations(*s, 20, 23, &now, slower);
  EXPECT_FALSE(s->exploring()) << "two drifted periods (iterations 20, 21) are not yet a drift";
  const std::vector<std::string> ran = RunIterations(*s, 23, 34, &now, slower);
  const std::vector<std::string> expected = {"b", "a", "a", "a", "b", "b", "b", "c", "c", "c", "a"};
  EXPECT_EQ(ran, expected);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->explorations(), 2u);
}

// A chosen schedule whose own trial swung by 35% (a host whose CPU sets the pace) is not tried
// again for periods 29% off its score, which a fixed 20% took for a drift; a change beyond its
// swing still starts the trials again.
TEST(GradlaneSelectorTest, ADriftIsAChangeBeyondTheChosenTrialsOwnSpread) {
  auto s = MakeSelector();
  TimeNs now = 0;
  // b's round periods (iterations 5, 6) are 100 and 70 ms: score 85, spread 30/85; a's 120 is
  // beyond that spread, so no runoff.
  const std::map<std::string, std::vector<TimeNs>> noisy_b = {
      {"a", {120 * kMillisecond}},
      {"b", {70 * kMillisecond, 100 * kMillisecond}},
      {"c", {150 * kMillisecond}}};
  RunCycles(*s, 0, 12, &now, noisy_b);
  ASSERT_EQ(s->active_name(), "b");
  ASSERT_EQ(s->runoffs(), 0u);
  EXPECT_EQ(s->score(1), 85 * kMillisecond);
  EXPECT_NEAR(s->drift_share(), 30.0 / 85.0, 1e-9);
  // The machine gets busier: 110 ms, 29% above the score, for twenty iterations.
  const std::map<std::string, TimeNs> busier = {
      {"a", 150 * kMillisecond}, {"b", 110 * kMillisecond}, {"c", 190 * kMillisecond}};
  RunIterations(*s, 12, 32, &now, busier);
  EXPECT_FALSE(s->exploring()) << "a swing within b's own spread is not a drift";
  EXPECT_EQ(s->explorations(), 1u);
  // The link halves: 170 ms, twice the score. Three such periods (32, 33, 34) are a drift; the
  // trials start again at 40.
  const std::map<std::string, TimeNs> halved = {
      {"a", 130 * kMillisecond}, {"b", 170 * kMillisecond}, {"c", 250 * kMillisecond}};
  RunIterations(*s, 32, 41, &now, halved);
  EXPECT_TRUE(s->exploring());
  EXPECT_EQ(s->active_name(), "a") << "the new round's first trial";
}
// A chosen trial with one straggler period (100 and 200 ms: score 150, spread 2/3) neither
// hides periods well below its score (kDriftShare holds below: the choice was made on a bad
// measurement) nor a 1.6x slowdown (the share is at most kMaxDriftShare).
TEST(GradlaneSelectorTest, AStragglerInTheChosenTrialHidesNoDrift) {
  // b's round periods (iterations 5, 6) are 100 and 200 ms; a (260) is beyond b's spread.
  const std::map<std::string, std::vector<TimeNs>> straggler_b = {
      {"a", {260 * kMillisecond}},
      {"b", {200 * kMillisecond, 100 * kMillisecond}},
      {"c", {300 * kMillisecond}}};
  for (const TimeNs steady : {100 * kMillisecond, 240 * kMillisecond}) {
    auto s = MakeSelector();
    TimeNs now = 0;
    RunCycles(*s, 0, 10, &now, straggler_b);
    // From iteration 10, where b is chosen, b runs at `steady`: a third below its score, or
    // 1.6x it. Three such periods (10, 11, 12) are a drift; the trials start again at 16.
    const std::map<std::string, TimeNs> after = {
        {"a", 260 * kMillisecond}, {"b", steady}, {"c", 300 * kMillisecond}};
    RunIterations(*s, 10, 11, &now, after);
    ASSERT_EQ(s->active_name(), "b");
    ASSERT_FALSE(s->exploring());
    ASSERT_EQ(s->runoffs(), 0u);
    ASSERT_EQ(s->score(1), 150 * kMillisecond);
    EXPECT_DOUBLE_EQ(s->drift_share(), kMaxDriftShare);
    RunIterations(*s, 11, 17, &now, after);
    EXPECT_TRUE(s->exploring()) << "b at " << steady / kMillisecond << " ms";
    EXPECT_EQ(s->explorations(), 1u);
  }
}

TEST(GradlaneSelectorTest, FollowersRunTheLeadersDecision) {
  auto leader = MakeSelector();
  auto follower = MakeSelector();
  follower->SetRank(2);
  EXPECT_FALSE(follower->leader());
  EXPECT_EQ(follower->Decision(), 0) << "a follower has nothing to relay before it hears";
  TimeNs now = 0;
  const std::map<std::string, TimeNs> d = {
      {"a", 100 * kMillisecond}, {"b", 60 * kMillisecond}, {"c", 80 * kMillisecond}};
  std::vector<uint8_t> heard;
  size_t leader_before = 0;  // what the leader ran in the previous iteration
  for (int64_t k = 0; k < 12; ++k) {
    RunIterations(*leader, k, k + 1, &now, d);
    // The follower starts iteration k before it hears the leader's decision of k, so it runs
    // the one it heard during k - 1 (and switches only at an iteration's start). It measures
    // nothing: its own (different) iteration times change nothing.
    follower->OnReady(Push(k, 0), now + k * kMillisecond);
    EXPECT_EQ(follower->active(), leader_before) << "iteration " << k;
    follower->OnPeerDecision(leader->Decision(), now + k * kMillisecond);
    EXPECT_EQ(follower->active(), leader_before) << "not in the middle of an iteration";
    Drain(*follower, now + k * kMillisecond);
    heard.push_back(leader->Decision());
    EXPECT_EQ(follower->Decision(), leader->Decision()) << "it relays what it heard at once";
    leader_before = leader->active();
  }
  follower->OnReady(Push(12, 0), now);
  ASSERT_EQ(follower->active_name(), "b");
  // Stamps of messages committed before the last switch still arrive: ignored.
  for (uint8_t old : heard) follower->OnPeerDecision(old, now);
  // Nothing to agree on (another policy), or a candidate this build does not have: ignored.
  follower->OnPeerDecision(0, now);
  follower->OnPeerDecision(static_cast<uint8_t>(kDecisionValid | 7 << kEpochShift | 9), now);
  Drain(*follower, now);
  follower->OnReady(Push(13, 0), now);
  EXPECT_EQ(follower->active_name(), "b");
  // The leader ignores every stamp: it decides.
  leader->OnPeerDecision(heard.front(), now);
  EXPECT_EQ(leader->active_name(), "b");
}

TEST(GradlaneSelectorTest, AFollowerKeepsUpThroughManyEpochsAndIgnoresOldOnes) {
  auto leader = MakeSelector();
  auto follower = MakeSelector();
  follower->SetRank(1);
  TimeNs now = 0;
  // Three rounds of trials (the leader's epoch wraps around its 3 bits more than once): each
  // time the chosen candidate slows down by half, so that the drift starts the trials again.
  std::map<std::string, TimeNs> d = {
      {"a", 100 * kMillisecond}, {"b", 60 * kMillisecond}, {"c", 80 * kMillisecond}};
  std::vector<uint8_t> heard;
  size_t leader_before = 0;
  for (int64_t k = 0; k < 64; ++k) {
    RunIterations(*leader, k, k + 1, &now, d);
    if (!leader->exploring()) d[std::string(leader->active_name())] = 150 * kMillisecond;
    follower->OnReady(Push(k, 0), now);
    ASSERT_EQ(follower->active(), leader_before) << "iteration " << k;
    const uint8_t byte = leader->Decision();
    if (heard.empty() || heard.back() != byte) heard.push_back(byte);
    follower->OnPeerDecision(byte, now);
    // A relay that has not heard yet: the decision of up to four switches ago changes nothing.
    for (size_t back = 2; back <= 5 && back <= heard.size(); ++back) {
      follower->OnPeerDecision(heard[heard.size() - back], now);
    }
    ASSERT_EQ(follower->Decision(), byte) << "iteration " << k;
    Drain(*follower, now);
    leader_before = leader->active();
  }
  EXPECT_GE(leader->explorations(), 3u);
  EXPECT_GT(heard.size(), 8u) << "the epoch wrapped";
}

TEST(GradlaneSelectorTest, IndicesThatNeverStepByOneLeaveTheRulesRunning) {
  auto s = MakeSelector();
  TimeNs now = 0;
  // A client that counts iterations in twos: no period is ever measured, so no candidate is
  // scored; the rules run between the aligned retries, and after kMaxUnscoredRounds the
  // trials stop for good.
  for (int64_t k = 0; k < 400; k += 2) {
    s->OnReady(Push(k), now);
    Drain(*s, now);
    now += 50 * kMillisecond;
  }
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->active_name(), "a");
  EXPECT_EQ(s->explorations(), kMaxUnscoredRounds);
}

TEST(GradlaneSelectorTest, CandidatesThatDoNotRunLearnTheReadyPattern) {
  // Prophet learns when each tensor becomes ready; as a candidate that is not running it must
  // still see every range (and queue none), so that its trial and its choice start warm.
  std::vector<GradlaneSelector::Candidate> candidates;
  for (const char* name : {"bytescheduler", "prophet"}) {
    PolicyConfig c;
    c.name = name;
    candidates.push_back({name, *MakePolicy(c)});
  }
  GradlaneSelector s(std::move(candidates));
  s.RegisterTensor({0, kTensorBytes, DType::kF32, 0});
  s.RegisterTensor({1, kTensorBytes, DType::kF32, 1});
  const auto& prophet = dynamic_cast<const ProphetPolicy&>(s.candidate(1));
  TimeNs now = kSecond;
  s.OnReady(Push(0, 1, 1), now);  // tensor 1 at the iteration's start
  s.OnReady(Push(0, 1, 0), now + 7 * kMillisecond);
  ASSERT_EQ(s.active(), 0u);
  EXPECT_EQ(prophet.queued_segments(), 0u);
  ASSERT_TRUE(prophet.learned_ready_offset(0).has_value());
  EXPECT_EQ(*prophet.learned_ready_offset(0), 7 * kMillisecond);
  Drain(s, now + 7 * kMillisecond);
}

TEST(GradlaneSelectorTest, ASwitchKeepsOneWindowInFlightAndLosesNoByte) {
  auto s = MakeSelector(2);
  TimeNs now = 0;
  // Warm-up and a's trial with a backlog left at each iteration's end.
  for (int64_t k = 0; k < 4; ++k) {
    s->OnReady(Push(k), now);
    Drain(*s, now);
    now += 100 * kMillisecond;
  }
  ASSERT_EQ(s->active_name(), "a");
  // Iteration 4 goes to b while a still holds a whole tensor of iteration 3 (a late pull).
  s->OnReady(Push(3, 2, 0), now);
  s->OnReady(Push(4), now);
  ASSERT_EQ(s->active_name(), "b");
  EXPECT_GT(s->candidate(0).queued_segments(), 0u);
  EXPECT_GT(s->candidate(1).queued_segments(), 0u);
  Dispatch d;
  std::map<std::pair<int64_t, uint16_t>, uint64_t> sent;
  std::vector<uint64_t> unacked;
  for (int guard = 0; s->queued_segments() > 0 || !unacked.empty(); ++guard) {
    ASSERT_LT(guard, 100000);
    while (s->NextDispatch(now, d)) {
      for (const Segment& seg : d.segments) sent[{seg.iteration, seg.peer}] += seg.length;
      // b's iteration 4 only once a's bytes are all acknowledged.
      if (d.segments.front().iteration == 4) {
        EXPECT_EQ(s->candidate(0).credit_in_use(), 0u);
        EXPECT_EQ(s->candidate(0).queued_segments(), 0u);
      }
      unacked.push_back(d.bytes);
      EXPECT_LE(s->credit_in_use(), kCredit);
    }
    ASSERT_FALSE(unacked.empty()) << "deadlock";
    // Acks out of order: the newest first.
    s->OnAcked(unacked.back(), now);
    unacked.pop_back();
    now += kMicrosecond;
  }
  EXPECT_EQ(s->credit_in_use(), 0u);
  EXPECT_EQ(s->candidate(0).credit_in_use(), 0u);
  EXPECT_EQ(s->candidate(1).credit_in_use(), 0u);
  EXPECT_EQ((sent[{3, 2}]), kTensorBytes);
  EXPECT_EQ((sent[{4, 1}]), kTensorBytes);
  EXPECT_EQ(s->NextWakeup(now), kNever);
}

TEST(GradlaneSelectorTest, MakePolicyBuildsEveryCandidate) {
  PolicyConfig c;
  c.name = "gradlane";
  c.partition_bytes = 1 << 20;
  auto p = MakePolicy(c);
  ASSERT_TRUE(p.ok()) << p.status();
  auto* s = dynamic_cast<GradlaneSelector*>(p->get());
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->candidate_count(), std::size(kGradlaneCandidates));
  for (size_t i = 0; i < s->candidate_count(); ++i) {
    EXPECT_EQ(s->candidate(i).name(), kGradlaneCandidates[i]);
  }
  EXPECT_EQ(s->active_name(), "gradlane-rules");
  EXPECT_EQ(s->Decision(), kDecisionValid) << "epoch 0, candidate 0";
  // A bad knob names the candidate that refused it.
  c.credit_bytes = uint64_t{1} << 41;
  auto bad = MakePolicy(c);
  EXPECT_FALSE(bad.ok());
}

// Drain's loop with the caller's Dispatch (reserved ahead), so that the test itself allocates
// nothing while the heap is counted.
void DrainInto(Policy& p, TimeNs now, Dispatch& dispatch) {
  for (int guard = 0; p.queued_segments() > 0 && guard < 100000; ++guard) {
    uint64_t batch = 0;
    while (p.NextDispatch(now, dispatch)) batch += dispatch.bytes;
    p.OnAcked(batch, now);
  }
}

TEST(GradlaneSelectorTest, NoAllocationOnceEveryCandidateHasRun) {
  auto s = MakeSelector();
  TimeNs now = 0;
  const std::map<std::string, TimeNs> d = {
      {"a", 100 * kMillisecond}, {"b", 60 * kMillisecond}, {"c", 80 * kMillisecond}};
  RunIterations(*s, 0, 14, &now, d);
  ASSERT_FALSE(s->exploring());
  Dispatch dispatch;
  dispatch.segments.reserve(1024);
  auto iteration = [&](int64_t k, TimeNs length) {
    s->OnReady(Push(k), now);
    DrainInto(*s, now, dispatch);
    now += length;
  };
  // Drift (b slows down) makes it try every candidate again, which must not allocate either.
  const uint64_t before = gradlane_test::HeapAllocations();
  for (int64_t k = 14; k < 40; ++k) iteration(k, k < 20 ? 60 * kMillisecond : 200 * kMillisecond);
  EXPECT_EQ(gradlane_test::HeapAllocations() - before, 0u);
  EXPECT_EQ(s->explorations(), 2u);
  EXPECT_EQ(s->queued_segments(), 0u);
}

// A runoff, and a new round after it (the entrants back to every candidate), allocate nothing.
TEST(GradlaneSelectorTest, NoAllocationThroughARunoffAndANewRound) {
  auto s = MakeSelector(5);
  TimeNs now = 0;
  const auto named = FourTooCloseToCall();
  RunCycles(*s, 0, 16, &now, named);  // every candidate has run; iteration 16 starts the runoff
  std::vector<std::vector<TimeNs>> cycles;
  for (const auto& [name, cycle] : named) cycles.push_back(cycle);  // "a".."e": by candidate
  std::vector<size_t> runs(cycles.size(), 0);
  Dispatch dispatch;
  dispatch.segments.reserve(1024);
  const uint64_t before = gradlane_test::HeapAllocations();
  // The runoff ends at 52; from 55 every period is 300 ms, a drift, so a new round runs in
  // 64..78 and ends at 79 (steady periods: no runoff).
  for (int64_t k = 16; k < 80; ++k) {
    s->OnReady(Push(k), now);
    if (k == 16) {
      EXPECT_TRUE(s->in_runoff());
    }
    DrainInto(*s, now, dispatch);
    const std::vector<TimeNs>& cycle = cycles[s->active()];
    now += k < 55 ? cycle[runs[s->active()]++ % cycle.size()] : 300 * kMillisecond;
  }
  EXPECT_EQ(gradlane_test::HeapAllocations() - before, 0u);
  EXPECT_FALSE(s->exploring());
  EXPECT_EQ(s->explorations(), 2u);
  EXPECT_EQ(s->runoffs(), 1u);
  EXPECT_EQ(s->entrants().size(), 5u) << "the new round's entrants: every candidate";
}

}  // namespace
}  // namespace gradlane::sched
