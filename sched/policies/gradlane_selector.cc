#include "sched/policies/gradlane_selector.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sched/policies/gradlane.h"

namespace gradlane::sched {

absl::StatusOr<std::unique_ptr<GradlaneSelector>> GradlaneSelector::Create(
    const PolicyConfig& config) {
  std::vector<Candidate> candidates;
  for (std::string_view name : kGradlaneCandidates) {
    PolicyConfig c = config;
    c.name = std::string(name);
    // P3's point is its small slices: the job's keys (what partition_bytes carries) cut it only
    // where they are finer than its slice, as gradlane-sim cuts p3 run on its own. The slice is
    // the f32 one (50,000 elements, 200 kB) for every dtype: a 16-bit tensor's are 100,000
    // elements, which keeps the candidate the simulator's p3.
    if (name == "p3") {
      const uint64_t own = DefaultPartitionBytes(name, DType::kF32);
      c.partition_bytes = c.partition_bytes == 0 ? own : std::min(c.partition_bytes, own);
    }
    // The rules' variants are not policies of their own to a user, so MakePolicy does not know
    // them; it has validated `config` (it builds the selector).
    std::unique_ptr<Policy> variant;
    for (GradlaneVariant v : {GradlaneVariant::kHalfWindow, GradlaneVariant::kDoubleWindow,
                              GradlaneVariant::kDoubleBlocks}) {
      if (name == GradlaneRulesName(v)) variant = GradlanePolicy::Create(c, v);
    }
    absl::StatusOr<std::unique_ptr<Policy>> policy =
        variant != nullptr ? absl::StatusOr<std::unique_ptr<Policy>>(std::move(variant))
                           : MakePolicy(c);
    if (!policy.ok()) {
      return absl::Status(policy.status().code(), absl::StrCat("gradlane candidate ", c.name, ": ",
                                                               policy.status().message()));
    }
    candidates.push_back({c.name, *std::move(policy)});
  }
  return std::make_unique<GradlaneSelector>(std::move(candidates));
}

namespace {

// The decision byte has room for 15 candidates.
std::vector<GradlaneSelector::Candidate> FirstFifteen(
    std::vector<GradlaneSelector::Candidate> candidates) {
  if (candidates.size() > kCandidateMask) candidates.resize(kCandidateMask);
  return candidates;
}

}  // namespace

GradlaneSelector::GradlaneSelector(std::vector<Candidate> candidates)
    : candidates_(FirstFifteen(std::move(candidates))), trials_(candidates_.size()) {
  entrants_.reserve(candidates_.size());  // a round's and a runoff's lists never reallocate
}

void GradlaneSelector::RegisterTensor(const TensorSpec& tensor) {
  for (Candidate& c : candidates_) c.policy->RegisterTensor(tensor);
}

void GradlaneSelector::OnLinkEstimate(double bytes_per_s, TimeNs rtt) {
  // Every candidate keeps its estimates current, so that one chosen later starts from them.
  for (Candidate& c : candidates_) c.policy->OnLinkEstimate(bytes_per_s, rtt);
}

TimeNs GradlaneSelector::score(size_t candidate) const {
  const Trial& t = trials_[candidate];
  return t.periods == 0 ? kNever : t.total / t.periods;
}

size_t GradlaneSelector::TrialCandidate(int64_t iteration) const {
  const int64_t length = phase_ == Phase::kRunoff ? kRunoffIterations : kTrialIterations;
  const int64_t trial = (iteration - trials_from_) / length;
  return trial < static_cast<int64_t>(entrants_.size()) ? entrants_[trial] : candidates_.size();
}

void GradlaneSelector::StartTrials(Phase phase, int64_t from) {
  phase_ = phase;
  trials_from_ = from;
  if (phase == Phase::kRound) {
    entrants_.resize(candidates_.size());
    std::iota(entrants_.begin(), entrants_.end(), size_t{0});
  }
  // A runoff keeps the round's results of those not in it (score() reports them).
  for (size_t c : entrants_) trials_[c] = Trial{};
}

void GradlaneSelector::Score(TimeNs period) {
  const int64_t into = iteration_ - trials_from_;
  if (into < 0) return;
  const size_t c = TrialCandidate(iteration_);
  if (c >= candidates_.size()) return;
  const bool runoff = phase_ == Phase::kRunoff;
  const int64_t length = runoff ? kRunoffIterations : kTrialIterations;
  const int64_t scored = runoff ? kRunoffScored : kScoredIterations;
  if (into % length < length - scored) return;  // absorbs what the previous candidate left
  Trial& t = trials_[c];
  if (t.periods < scored / 2) t.first_half += period;
  t.total += period;
  ++t.periods;
  t.shortest = std::min(t.shortest, period);
  t.longest = std::max(t.longest, period);
}

bool GradlaneSelector::Complete(size_t candidate) const {
  const int64_t complete = phase_ == Phase::kRunoff ? kRunoffScored : kScoredIterations;
  return trials_[candidate].periods == complete;
}

double GradlaneSelector::Spread(size_t candidate) const {
  const Trial& t = trials_[candidate];
  if (t.total == 0) return 0.0;
  return static_cast<double>(t.longest - t.shortest) * static_cast<double>(t.periods) /
         static_cast<double>(t.total);
}

size_t GradlaneSelector::Fastest() const {
  size_t best = candidates_.size();
  for (size_t c : entrants_) {
    // A trial with a skipped iteration index is incomplete: it is not chosen.
    if (!Complete(c)) continue;
    // Means, compared as totals of equally many periods; the earlier candidate wins ties.
    if (best == candidates_.size() || trials_[c].total < trials_[best].total ||
        (trials_[c].total == trials_[best].total && c < best)) {
      best = c;
    }
  }
  return best;
}

double GradlaneSelector::MeanNoise(size_t candidate) const {
  const Trial& t = trials_[candidate];
  const int64_t half = t.periods / 2;
  if (half == 0) return 0.0;
  const double first = static_cast<double>(t.first_half) / static_cast<double>(half);
  const double second =
      static_cast<double>(t.total - t.first_half) / static_cast<double>(t.periods - half);
  return std::abs(first - second) / 2.0;
}

size_t GradlaneSelector::KeptAfterRunoff() const {
  const size_t fastest = Fastest();
  if (fastest == candidates_.size()) return fastest;
  const double fastest_mean = static_cast<double>(score(fastest));
  size_t kept = fastest;
  for (size_t c : entrants_) {
    if (c >= kept || !Complete(c)) continue;
    const double behind = static_cast<double>(score(c)) - fastest_mean;
    const double noise = std::hypot(MeanNoise(c), MeanNoise(fastest));
    if (behind <= std::min(noise, kRunoffTieShare * fastest_mean)) kept = c;
  }
  return kept;
}

void GradlaneSelector::EndRound() {
  const size_t best = Fastest();
  if (best == candidates_.size()) {
    Choose(best);
    return;
  }
  // A candidate whose round score is within the spread of its own or the winner's periods
  // (longest minus shortest, over the mean): two periods do not rank it against the winner
  // (see the header), so it runs again.
  const double best_total = static_cast<double>(trials_[best].total);
  // The round's winner first (it is the one kept, with its round score, if the runoff scores
  // none), then the others by their round scores (ties: the earlier candidate).
  // Built here, not in entrants_ (which the loop reads), on the stack: no allocation. At most
  // kCandidateMask candidates (FirstFifteen).
  size_t runoff[kCandidateMask];
  size_t count = 0;
  runoff[count++] = best;
  for (size_t c : entrants_) {
    if (c == best || !Complete(c)) continue;
    const double apart = static_cast<double>(trials_[c].total) - best_total;
    if (apart >= std::max(Spread(best), Spread(c)) * best_total) continue;
    size_t at = count++;
    for (; at > 1 && trials_[runoff[at - 1]].total > trials_[c].total; --at) {
      runoff[at] = runoff[at - 1];
    }
    runoff[at] = c;
  }
  if (count == 1) {
    Choose(best);
    return;
  }
  round_winner_ = trials_[best];
  entrants_.assign(runoff, runoff + count);
  ++runoffs_;
  StartTrials(Phase::kRunoff, iteration_);
  Activate(best);
}

void GradlaneSelector::Choose(size_t best) {
  const bool any = best < candidates_.size();
  Activate(any ? best : 0);
  drifted_ = 0;
  ++explorations_;
  if (any) {
    chosen_score_ = score(best);
    drift_share_ = std::clamp(Spread(best), kDriftShare, kMaxDriftShare);
    phase_ = Phase::kChosen;
    unscored_rounds_ = 0;
    return;
  }
  // Nothing was measured (iterations skipped, or indices that do not step by one): the rules
  // run while the trials wait for the next aligned start, at most kMaxUnscoredRounds times.
  chosen_score_ = kNever;
  drift_share_ = kDriftShare;
  if (++unscored_rounds_ < kMaxUnscoredRounds) {
    StartTrials(Phase::kRound, (iteration_ / kTrialAlignIterations + 1) * kTrialAlignIterations);
  } else {
    phase_ = Phase::kChosen;
  }
}

void GradlaneSelector::StartIteration(int64_t iteration, TimeNs now) {
  if (!started_) {
    started_ = true;
    StartTrials(Phase::kRound, iteration + 1);  // the first iteration warms the estimates up
  } else if (iteration == iteration_ + 1) {
    const TimeNs period = now - iteration_start_;
    if (exploring()) {
      Score(period);
    } else if (chosen_score_ != kNever) {
      const double chosen = static_cast<double>(chosen_score_);
      const double off = static_cast<double>(period) - chosen;
      const bool drifted = off > drift_share_ * chosen || -off > kDriftShare * chosen;
      drifted_ = drifted ? drifted_ + 1 : 0;
      if (drifted_ >= kDriftIterations) {
        StartTrials(Phase::kRound, (iteration / kTrialAlignIterations + 1) * kTrialAlignIterations);
        drifted_ = 0;
      }
    }
  }
  iteration_ = iteration;
  iteration_start_ = now;
  if (!exploring() || iteration < trials_from_) return;
  const size_t c = TrialCandidate(iteration);
  if (c < candidates_.size()) {
    Activate(c);
  } else if (phase_ == Phase::kRound) {
    EndRound();
  } else {
    // A runoff that scored none (skipped iteration indices) keeps the round's winner, and
    // its round score, so that a drift can still start the trials again.
    size_t best = KeptAfterRunoff();
    if (best == candidates_.size()) {
      best = entrants_.front();
      trials_[best] = round_winner_;
    }
    Choose(best);
  }
}

void GradlaneSelector::Activate(size_t candidate) {
  if (candidate == active_) return;
  active_ = candidate;
  epoch_ = (epoch_ + 1) & kEpochMask;
}

uint8_t GradlaneSelector::Decision() const {
  if (!leader()) return adopted_;
  return static_cast<uint8_t>(kDecisionValid | epoch_ << kEpochShift | active_);
}

void GradlaneSelector::OnPeerDecision(uint8_t decision, TimeNs /*now*/) {
  if (leader() || (decision & kDecisionValid) == 0 || decision == adopted_) return;
  const size_t candidate = decision & kCandidateMask;
  if (candidate >= candidates_.size()) return;  // a build with other candidates: ignored
  const uint8_t epoch = (decision >> kEpochShift) & kEpochMask;
  const uint8_t ours = (adopted_ >> kEpochShift) & kEpochMask;
  // Older stamps still arrive (messages committed before the switch, or relayed by a peer
  // that has not heard yet): only an epoch 1 to 3 ahead is followed, so that one 4 or more
  // behind is never mistaken for a newer one. A follower misses at most a switch or two: the
  // leader switches at most once per kTrialIterations iterations, and its messages reach
  // every peer (directly, or around the ring) within one.
  const uint8_t ahead = (epoch - ours) & kEpochMask;
  if (adopted_ != 0 && (ahead == 0 || ahead > kMaxEpochsAhead)) return;
  adopted_ = decision;
  pending_ = candidate;
}

void GradlaneSelector::OnReady(const ReadyRange& range, TimeNs now) {
  // A host's own pushes of an iteration come before any pull of it (a shard pulls a key only
  // once this host's contribution is in), so the first push marks the iteration's start.
  if (range.direction == Direction::kPush && (!started_ || range.iteration > iteration_)) {
    if (leader()) {
      StartIteration(range.iteration, now);
    } else {
      // A follower switches where the leader did, at an iteration's start: a candidate that
      // learns from the ready pattern (prophet) would otherwise take the rest of an iteration
      // for a whole one (densenet121, ρ = 2, 3 Gbit/s, W = 8: 1.19x prophet's own time).
      started_ = true;
      iteration_ = range.iteration;
      active_ = pending_;
    }
  }
  // The others learn from it (prophet's ready times, the rules' bytes per iteration), so that
  // a trial measures a candidate as warm as it would be running alone.
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (i == active_) {
      candidates_[i].policy->OnReady(range, now);
    } else {
      candidates_[i].policy->OnObservedReady(range, now);
    }
  }
}

bool GradlaneSelector::NextDispatch(TimeNs now, Dispatch& out) {
  // What a candidate switched away from still holds is older (the previous iteration's pulls):
  // it goes first, under that candidate's own window.
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (i == active_ || candidates_[i].policy->queued_segments() == 0) continue;
    if (candidates_[i].policy->NextDispatch(now, out)) return true;
  }
  // One window at a time: the active candidate starts once the others' bytes are acknowledged,
  // so what is committed never exceeds one candidate's window (a switch costs one round trip).
  if (OthersHoldBytes()) {
    out.segments.clear();
    out.bytes = 0;
    return false;
  }
  return candidates_[active_].policy->NextDispatch(now, out);
}

bool GradlaneSelector::OthersHoldBytes() const {
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const Policy& p = *candidates_[i].policy;
    if (i != active_ && (p.credit_in_use() > 0 || p.queued_segments() > 0)) {
      return true;
    }
  }
  return false;
}

void GradlaneSelector::OnAcked(uint64_t bytes, TimeNs now) {
  uint64_t left = bytes;
  for (size_t i = 0; i < candidates_.size() && left > 0; ++i) {
    const uint64_t lent = candidates_[i].policy->credit_in_use();
    if (i == active_ || lent == 0) continue;
    const uint64_t share = std::min(left, lent);
    left -= share;
    candidates_[i].policy->OnAcked(share, now);
  }
  if (left == 0) return;
  // Anything beyond what the active candidate lent is the caller's mistake; the candidate's
  // own window clamps it (and counts it, where it does).
  candidates_[active_].policy->OnAcked(left, now);
}

TimeNs GradlaneSelector::NextWakeup(TimeNs now) const {
  if (OthersHoldBytes()) {
    // Only what the others queued can go before an ack arrives.
    TimeNs wake = kNever;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const Policy& p = *candidates_[i].policy;
      if (i != active_ && p.queued_segments() > 0) wake = std::min(wake, p.NextWakeup(now));
    }
    return wake;
  }
  const Policy& active = *candidates_[active_].policy;
  return active.queued_segments() > 0 ? active.NextWakeup(now) : kNever;
}

size_t GradlaneSelector::queued_segments() const {
  size_t n = 0;
  for (const Candidate& c : candidates_) n += c.policy->queued_segments();
  return n;
}

uint64_t GradlaneSelector::credit_in_use() const {
  uint64_t n = 0;
  for (const Candidate& c : candidates_) n += c.policy->credit_in_use();
  return n;
}

}  // namespace gradlane::sched
