// sched/policies/gradlane_selector.h — the `gradlane` policy's outer loop: it runs several
// complete schedules (candidates) one after another for a few training iterations each, times
// every iteration on rank 0, and the whole job keeps the candidate whose trial iterations were
// shortest (or an earlier one, the rules first, that the measurement cannot tell from it); it
// tries them all again when the iteration time drifts (a new link rate, a new ready pattern).
//
// Why an outer loop over whole schedules. gradlane's rules (gradlane.h: message size, fusion
// and window from the measured rate, RTT and θ) have the lowest mean over every profile, link
// and world size we simulate, but on 55 of 270 rows one of the papers' schedules was more than
// 1% faster, and which one changes from row to row (prophet's blocks on some, fifo's whole
// tensors on others, p3's stop-and-wait on a few): what wins depends on the whole network
// (incast at the shards, how many receivers share a downlink), which no host measures. The
// iteration time does measure it, and training repeats the same iteration thousands of times:
// ByteScheduler tunes its (partition, credit) the same way, by trying settings on the running
// job (its §4.3), and a try costs a couple of iterations of a job's thousands. A search over
// every knob (the BO tuner) needs tens of trials; a choice among a handful of schedules, each
// good somewhere, needs one trial each.
//
// Agreement. Every host must run the same candidate: mixing them costs more than any one of
// them (resnet50, 1 Gbit/s, W = 8, ρ = 1: hosts choosing by their own clocks picked three
// different candidates and were 14% slower than either). Each host's iteration periods are
// the job's on average, but iteration by iteration they differ by up to 10% between hosts
// (each starts when its own pulls are in), so each host measuring for itself cannot agree.
// Hence one host decides: rank 0 (the leader) runs the trials and the choice from its own
// clock, and every data message a host sends carries its current decision, one byte
// (Decision(): valid bit, a 3-bit epoch bumped on every switch, the candidate). A follower
// runs whatever decision it heard last with a newer epoch (1 to 3 ahead), from any peer, and
// stamps its own messages with it, so the decision also travels around an all-reduce ring
// where only rank 1 hears rank 0. A follower switches at the start of its next iteration
// after it hears (as the leader switches at the start of one); followers measure nothing.
//
// How the leader decides:
//  * Iteration starts: the first push of iteration k that reaches this policy starts it; its
//    period is the time to the first push of k + 1 (with a per-layer forward pass, one full
//    iteration of the synchronous job).
//  * Trials: the job's first iteration warms every estimate with candidate 0 and is not
//    measured. Then each candidate runs kTrialIterations iterations; its score is the mean of
//    the periods of its last kScoredIterations (the first absorbs what the previous candidate
//    left queued; iteration times of one schedule alternate, so one is not enough).
//  * Choice: the candidate with the smallest score; a candidate whose trial iteration was not
//    seen (a skipped iteration index) is not chosen. Candidate 0 (gradlane's rules) wins ties.
//    A round with nothing measured runs the rules and tries again at the next aligned
//    iteration, at most kMaxUnscoredRounds times (a client whose indices skip never scores).
//  * Runoff: two scored periods cannot rank candidates whose iteration times swing by more
//    than they differ. At W = 8 one schedule's periods repeat in cycles of 2–8 iterations that
//    swing by 10–25% (squeezenet1_1, ρ 2, 10 Gbit/s: prophet 8.6, 8.9, 11.8, 9.5 ms over and
//    over, fifo 10.8, 9.9): two periods of prophet's cycle scored worse than fifo's, and the job
//    ran 8% slower than prophet for good. So every candidate whose round score is within the
//    spread of the winner's or its own periods (longest minus shortest scored period, over the
//    mean) runs again, with the winner, for kRunoffIterations each, scored by the last
//    kRunoffScored (whole cycles of 2, 4 or 8; of any other length up to 8, all but part of
//    one cycle), and the fastest of those is kept — unless an earlier candidate (the rules
//    first) is behind it by no more than the two scores' noise together, estimated from each
//    trial's own periods as half the gap between the means of its first and second half, and
//    by at most kRunoffTieShare of the fastest's score (KeptAfterRunoff; the round's winner,
//    with its round score, if no runoff trial is complete). Where the machine's load moves
//    the periods, scores a percent apart rank nothing: through the daemons (densenet121, TCP,
//    W = 3, 2 cores) the runoff kept the window ÷ 2 on a score within 1% of the rules', and it
//    ran 2–3% slower than the rules for good. A choice among candidates the measurement
//    cannot tell apart is then made by preference, the rules first. Periods that repeat in
//    cycles of 1, 2 or 4 have no such noise, and the fastest is kept; a cycle of 8 or of an
//    odd length, or periods that trend, read as noise though they are not, hence the cap: a
//    tie kept wrongly costs at most that share. Every one within the
//    spread, not only the runner-up: with the best two only, squeezenet1_1 at ρ 1, 1 Gbit/s,
//    W = 8 ran a runoff of the rules and bytescheduler while prophet, third in the round by
//    4% and 2% faster than both over many iterations, never ran again.
//    Where the periods are steady (spread 0), no runoff: a job pays for one only where its own
//    measurements say two periods are not enough, and the entrants are by that measure as fast
//    as the winner, so running them costs little.
//  * Drift: once chosen, a period more than kDriftShare below the chosen score, or more than
//    the drift share above it, on kDriftIterations consecutive iterations starts the trials
//    again, at the next iteration that is a multiple of kTrialAlignIterations. The drift share
//    is kDriftShare, or the chosen trial's own spread where that is wider, up to
//    kMaxDriftShare: a slower period that the chosen schedule's own trial already showed is no
//    news about the network. Where the host, not the link, sets the pace (the daemons waiting
//    for a CPU a third of the time, mobilenet_v2 over DPDK on 2 cores), a schedule's periods
//    swing by 30-40% with the machine's load, and a fixed 20% restarted the trials on load
//    alone; a new link rate or ready pattern that moves the iteration time by more than the
//    schedule's own swing is still seen within kDriftIterations. Faster periods keep the fixed
//    share: a trial with one straggler period has a wide spread and a score above what the
//    schedule runs at, and periods well below the score say the choice was made on a bad
//    measurement (or the link got faster) — either way worth trying again. The cap keeps one
//    straggler in a two-period trial (spread up to 2/3) from hiding a slowdown of 1.5x.
//  * Switching: ranges go to the active candidate at once; a candidate that was switched away
//    from keeps what it had queued and sends it first (it is older: the previous iteration's
//    pulls), under its own window, and the active one starts sending once all of that is
//    acknowledged, so that one candidate's window is in flight at a time (two only where a
//    candidate is switched back to before its own bytes are acknowledged). An ack carries
//    only a byte count, so acks go to the inactive candidates' bytes in flight (each one's
//    credit_in_use, the Policy contract's bytes committed and not yet acknowledged) first (they
//    are older), each capped at what it has in flight, the rest to the active one: every
//    candidate's credit is conserved and none is returned more than it lent.
//  * Candidates that are not running see every range through Policy::OnObservedReady and
//    queue none: prophet keeps learning the ready times, the rules the bytes per iteration,
//    so that a trial and a choice start as warm as the candidate would be running alone.
//
// Thread rules and allocation: as Policy (one owner thread). The candidates are built once;
// after every candidate has run once, OnReady/NextDispatch/OnAcked allocate nothing.
#ifndef GRADLANE_SCHED_POLICIES_GRADLANE_SELECTOR_H_
#define GRADLANE_SCHED_POLICIES_GRADLANE_SELECTOR_H_

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sched/policies/gradlane.h"
#include "sched/policy.h"

namespace gradlane::sched {

// The candidates MakePolicy("gradlane") tries, in trial order: gradlane's rules first (they
// win ties and run the warm-up iteration), then the papers' schedules.
// Then the rules with half and twice their window (rule 4 of gradlane.h): the
// window rule models the queues at the receivers from the peer count and the key partition, and
// the best window is up to 2x either side of it, depending on what no host measures (how many
// senders share a receiver at once, how the keys' sizes run): a trial measures it.
// Last, the rules with blocks of up to 2δ (rule 3): rule 1 prices a message by how long it
// holds back the one gradient that gates the next forward pass, but a fused block of small
// tensors holds back only what becomes ready while it is on the wire, which the ready pattern
// decides. On models of many mid-size tensors at W = 8 (squeezenet1_1, 10 Gbit/s, ρ 1: 268
// messages per host, their θ 10% of the iteration) the rules' messages are too many: blocks of
// 2δ are 1.08x the bound against 1.12x; of 60 sample rows they are faster on 7, up to 8% slower
// on 25 (docs/simulator.md, "The blocks variant").
inline constexpr std::string_view kGradlaneCandidates[] = {"gradlane-rules",
                                                           "prophet",
                                                           "bytescheduler",
                                                           "fifo",
                                                           "p3",
                                                           "gradlane-rules-window*2",
                                                           "gradlane-rules-window/2",
                                                           "gradlane-rules-blocks*2"};
inline constexpr int64_t kTrialIterations = 3;
// The score is the mean period of a trial's last kScoredIterations iterations.
inline constexpr int64_t kScoredIterations = 2;
// A runoff's trials (the round's candidates within their spread of its winner).
inline constexpr int64_t kRunoffIterations = 9;
inline constexpr int64_t kRunoffScored = 8;
// At most this share of the fastest runoff score may an earlier candidate be behind and still
// be kept as a tie (KeptAfterRunoff): the margin gradlane is held to against any one schedule.
inline constexpr double kRunoffTieShare = 0.01;
inline constexpr double kDriftShare = 0.2;
inline constexpr double kMaxDriftShare = 0.5;
inline constexpr int kDriftIterations = 3;
inline constexpr int64_t kTrialAlignIterations = 8;
// The decision byte (Policy::Decision): kDecisionValid | epoch << kEpochShift | candidate.
inline constexpr uint8_t kDecisionValid = 0x80;
inline constexpr uint8_t kEpochShift = 4;
inline constexpr uint8_t kEpochMask = 0x7;
inline constexpr uint8_t kCandidateMask = 0xf;
// A follower adopts an epoch 1..kMaxEpochsAhead ahead of its own (gradlane_selector.cc says why).
inline constexpr uint8_t kMaxEpochsAhead = 3;
inline constexpr uint32_t kMaxUnscoredRounds = 3;
static_assert(std::size(kGradlaneCandidates) <= kCandidateMask);
static_assert(kGradlaneCandidates[0] == GradlaneRulesName(GradlaneVariant::kRules) &&
              kGradlaneCandidates[5] == GradlaneRulesName(GradlaneVariant::kDoubleWindow) &&
              kGradlaneCandidates[6] == GradlaneRulesName(GradlaneVariant::kHalfWindow) &&
              kGradlaneCandidates[7] == GradlaneRulesName(GradlaneVariant::kDoubleBlocks));
// The iteration by which the leader has chosen at the latest, with every estimate it has
// warm: the warm-up iteration, one trial of each candidate, and a runoff of all of them. A
// benchmark's warm-up of at least this many iterations measures the chosen schedule only
// (gradlane-sim's default warm-up, run-replay's for gradlane: 104, the next multiple of 8).
inline constexpr int64_t kLatestChoiceIteration =
    1 +
    static_cast<int64_t>(std::size(kGradlaneCandidates)) * (kTrialIterations + kRunoffIterations);

class GradlaneSelector final : public Policy {
 public:
  struct Candidate {
    std::string name;
    std::unique_ptr<Policy> policy;
  };

  // Builds kGradlaneCandidates from `config` (each as MakePolicy would build it by that name;
  // the rules' variants as GradlanePolicy::Create with their GradlaneVariant). With a fixed
  // config.credit_bytes the window variants run the rules' window: trials of one schedule.
  static absl::StatusOr<std::unique_ptr<GradlaneSelector>> Create(const PolicyConfig& config);
  // Any candidates, in trial order (tests). Requires at least one; keeps the first 15.
  explicit GradlaneSelector(std::vector<Candidate> candidates);

  std::string_view name() const override { return "gradlane"; }
  void RegisterTensor(const TensorSpec& tensor) override;
  void OnReady(const ReadyRange& range, TimeNs now) override;
  bool NextDispatch(TimeNs now, Dispatch& out) override;
  void OnAcked(uint64_t bytes, TimeNs now) override;
  TimeNs NextWakeup(TimeNs now) const override;
  void OnLinkEstimate(double bytes_per_s, TimeNs rtt) override;
  size_t queued_segments() const override;
  uint64_t credit_in_use() const override;
  void SetRank(uint16_t rank) override { rank_ = rank; }
  uint8_t Decision() const override;
  void OnPeerDecision(uint8_t decision, TimeNs now) override;

  // Introspection (metrics, tests, the simulator's report).
  // The share of the chosen score by which a slower period differs to count as drifted.
  double drift_share() const { return drift_share_; }
  size_t active() const { return active_; }
  std::string_view active_name() const { return candidates_[active_].name; }
  std::string_view schedule() const override { return active_name(); }
  bool exploring() const { return phase_ != Phase::kChosen; }
  bool in_runoff() const { return phase_ == Phase::kRunoff; }
  bool leader() const { return rank_ == 0; }
  // The latest trial's score of each candidate (the mean of its scored periods, from the
  // runoff where it ran in one); kNever before its trial. A trial with a skipped scored
  // iteration is not chosen.
  TimeNs score(size_t candidate) const;
  // How many times the trials ran (1 after the first round, runoff included).
  uint32_t explorations() const { return explorations_; }
  // How many rounds of trials ended in a runoff.
  uint32_t runoffs() const { return runoffs_; }
  // The leader's current or latest trials' candidates, in trial order (a runoff's: the round's
  // winner first, then the others in it by round score). Empty before the first iteration and
  // on followers, which run no trials.
  const std::vector<size_t>& entrants() const { return entrants_; }
  size_t candidate_count() const { return candidates_.size(); }
  const Policy& candidate(size_t i) const { return *candidates_[i].policy; }

 private:
  enum class Phase : uint8_t { kRound, kRunoff, kChosen };
  // One candidate's scored periods in the current round or runoff.
  struct Trial {
    TimeNs total = 0;
    int64_t periods = 0;
    TimeNs shortest = kNever;
    TimeNs longest = 0;
    TimeNs first_half = 0;  // the total of the first half of the scored periods
  };

  void StartIteration(int64_t iteration, TimeNs now);
  // Which candidate runs iteration `iteration` of the current trials (candidate_count() when
  // the trials are over).
  size_t TrialCandidate(int64_t iteration) const;
  // Counts the period of iteration_ (which just ended) towards its trial, if it is scored.
  void Score(TimeNs period);
  // The round's trials are over: choose, or run the ones too close to call again.
  void EndRound();
  // Keeps `best` (candidate_count(): nothing was measured).
  void Choose(size_t best);
  // Whether `candidate`'s trial in the current round or runoff scored every period.
  bool Complete(size_t candidate) const;
  // The spread of `candidate`'s scored periods in the current trials: longest minus shortest,
  // over their mean (0 before it scored any).
  double Spread(size_t candidate) const;
  // The entrant of the smallest complete score (candidate_count() if none).
  size_t Fastest() const;
  // How far `candidate`'s mean score may be from its true mean: half the difference between
  // the means of its first and second half of scored periods (0 where they agree, as over
  // whole cycles of a schedule whose periods repeat).
  double MeanNoise(size_t candidate) const;
  // The runoff's choice: the earliest entrant whose score is behind the fastest's by no more
  // than the two scores' noise together nor kRunoffTieShare of the fastest's score (the
  // fastest where none is), candidate_count() if no trial is complete.
  size_t KeptAfterRunoff() const;
  void StartTrials(Phase phase, int64_t from);
  // The leader's switch to `candidate` (a new epoch if it differs).
  void Activate(size_t candidate);
  // Whether a candidate other than the active one has bytes queued or in flight.
  bool OthersHoldBytes() const;

  std::vector<Candidate> candidates_;
  std::vector<Trial> trials_;  // the current round's or runoff's, by candidate
  // The current (or latest) trials' candidates in trial order: 0, 1, ... in a round; in a
  // runoff the round's winner, then the others in it by round score.
  std::vector<size_t> entrants_;
  Trial round_winner_;  // entrants_[0]'s round trial (its score if the runoff scores none)
  size_t active_ = 0;
  uint16_t rank_ = 0;
  uint8_t epoch_ = 0;    // the leader's
  uint8_t adopted_ = 0;  // a follower's latest decision heard (0: none yet)
  size_t pending_ = 0;   // its candidate, which the follower runs from its next iteration

  bool started_ = false;
  int64_t iteration_ = 0;  // the latest iteration started on this host
  TimeNs iteration_start_ = 0;
  Phase phase_ = Phase::kRound;
  int64_t trials_from_ = 0;  // the iteration the current trials' first candidate starts in
  TimeNs chosen_score_ = kNever;
  // A period more than this share of chosen_score_ above it has drifted: kDriftShare, or the
  // chosen trial's spread where that is wider, at most kMaxDriftShare (below: kDriftShare).
  double drift_share_ = kDriftShare;
  int drifted_ = 0;  // consecutive drifted periods
  uint32_t explorations_ = 0;
  uint32_t runoffs_ = 0;
  uint32_t unscored_rounds_ = 0;  // consecutive rounds that measured nothing
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICIES_GRADLANE_SELECTOR_H_
