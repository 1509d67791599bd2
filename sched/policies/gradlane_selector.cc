#include "sched/policies/gradlane_selector.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

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
    auto policy = MakePolicy(c);
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
    : candidates_(FirstFifteen(std::move(candidates))),
      scores_(candidates_.size(), kNever),
      scored_(candidates_.size(), 0) {}

void GradlaneSelector::RegisterTensor(const TensorSpec& tensor) {
  for (Candidate& c : candidates_) c.policy->RegisterTensor(tensor);
}

void GradlaneSelector::OnLinkEstimate(double bytes_per_s, TimeNs rtt) {
  // Every candidate keeps its estimates current, so that one chosen later starts from them.
  for (Candidate& c : candidates_) c.policy->OnLinkEstimate(bytes_per_s, rtt);
}

size_t GradlaneSelector::TrialCandidate(int64_t iteration) const {
  const int64_t trial = (iteration - trials_from_) / kTrialIterations;
  return static_cast<size_t>(std::min<int64_t>(trial, static_cast<int64_t>(candidates_.size())));
}

void GradlaneSelector::Choose() {
  size_t best = 0;
  bool any = false;
  for (size_t i = 0; i < scores_.size(); ++i) {
    if (scored_[i] != kScoredIterations) continue;  // a skipped iteration index
    if (!any || scores_[i] < scores_[best]) best = i;
    any = true;
  }
  Activate(best);
  std::fill(scored_.begin(), scored_.end(), 0);
  drifted_ = 0;
  ++explorations_;
  if (any) {
    chosen_score_ = scores_[best];
    exploring_ = false;
    unscored_rounds_ = 0;
    return;
  }
  // Nothing was measured (iterations skipped, or indices that do not step by one): the rules
  // run while the trials wait for the next aligned start, at most kMaxUnscoredRounds times.
  chosen_score_ = kNever;
  if (++unscored_rounds_ < kMaxUnscoredRounds) {
    trials_from_ = (iteration_ / kTrialAlignIterations + 1) * kTrialAlignIterations;
  } else {
    exploring_ = false;
  }
}

void GradlaneSelector::StartIteration(int64_t iteration, TimeNs now) {
  if (!started_) {
    started_ = true;
    trials_from_ = iteration + 1;  // the first iteration warms the estimates up
  } else if (iteration == iteration_ + 1) {
    const TimeNs period = now - iteration_start_;
    if (exploring_) {
      const int64_t into = iteration_ - trials_from_;
      const size_t c = TrialCandidate(iteration_);
      if (into >= 0 && c < scores_.size() &&
          into % kTrialIterations >= kTrialIterations - kScoredIterations) {
        scores_[c] = (scored_[c] == 0 ? 0 : scores_[c]) + period;
        ++scored_[c];
      }
    } else if (chosen_score_ != kNever) {
      const double chosen = static_cast<double>(chosen_score_) / kScoredIterations;
      const double off = static_cast<double>(period) - chosen;
      drifted_ = std::abs(off) > kDriftShare * chosen ? drifted_ + 1 : 0;
      if (drifted_ >= kDriftIterations) {
        exploring_ = true;
        trials_from_ = (iteration / kTrialAlignIterations + 1) * kTrialAlignIterations;
        std::fill(scores_.begin(), scores_.end(), kNever);
        std::fill(scored_.begin(), scored_.end(), 0);
        drifted_ = 0;
      }
    }
  }
  iteration_ = iteration;
  iteration_start_ = now;
  if (!exploring_ || iteration < trials_from_) return;
  const size_t c = TrialCandidate(iteration);
  if (c < candidates_.size()) {
    Activate(c);
  } else {
    Choose();
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
