// sched/bo_tuner.h — Bayesian-optimisation auto-tuner for the ByteScheduler knobs
// (partition size δ, credit size c), as in ByteScheduler §4.3.
//
// What it is for: training speed as a function of (δ, c) is unknown, noisy, not smooth (the
// per-partition overhead is a step function of δ, §4.1) and each evaluation costs training
// iterations (and, in PS mode, a restart), so the tuner spends few trials. The caller runs a
// few iterations with Suggest(), reports the measured speed with Observe(), and repeats until
// Done(); Best() is the configuration to keep.
//
// Model: a Gaussian-process surrogate over x = (log2 δ, log2 c), each normalised to [0, 1]
// by the bounds (the knobs matter multiplicatively: 64 kB vs 128 kB is as large a step as
// 16 MB vs 32 MB). The GP models log(speed): bad configurations are worse by factors (a tiny
// partition can be tens of times slower), and on a log scale those cliffs do not swamp the
// few-percent differences near the optimum that the search must resolve; it also makes an expected
// improvement read as a relative gain. The log speeds are standardised (mean 0, variance 1)
// before fitting, so the GP's signal variance is 1 and ξ is in standard deviations of the
// observed log speeds: the paper's ξ = 0.1 then means the same whatever the speed's unit.
// Kernel: Matérn 5/2 with one length scale per knob plus a white observation-noise term —
// Matérn rather than squared-exponential because the objective has kinks and steps that an
// infinitely smooth prior would over-smooth (Snoek et al. 2012 make the same choice). The
// length scales and the noise variance are fitted by maximising the log marginal likelihood
// over a small fixed grid (GpHyperparameterGrid()) after every observation; with fewer than
// kMinObservationsToFit observations the fixed defaults in GpHyperparameters are used.
// Acquisition: Expected Improvement with exploration margin ξ (default 0.1, as in the paper),
// maximising speed, maximised over a deterministic candidate set: a regular grid, seeded
// uniform random points, and a seeded cloud of points around the best trial so far (finer than
// the grid where it matters). The first `initial_trials` suggestions are a seeded
// Latin-hypercube design, since a GP fitted to one or two points has nothing to say.
// Stopping: after max_trials, or once the next suggestion's EI (≈ expected relative gain) falls
// below min_relative_ei.
//
// Measured on the synthetic delay model of tests/unit/sched/bo_tuner_test.cc (2% of the
// search space within 3% of the optimum): over seeds 1..60, 20 trials end within 3% of the
// grid-search optimum in ~87% of runs and within 5% in ~97%, median gap ~1%; random search
// with the same budget has a median gap of ~4% (seeds 1..10).
//
// Guarantees: deterministic — the same bounds, options, seed and sequence of observations give
// the same suggestions (the random stream is std::mt19937_64, whose output the standard fixes,
// turned into doubles by hand rather than by the implementation-defined std distributions;
// only a different libm's last-bit rounding of exp/log could change a tie elsewhere). No I/O,
// no clock. At most kMaxObservations observations, so the GP's linear algebra (an n×n
// Cholesky) stays tiny. Not thread-safe: one owner (the master worker's engine or
// control thread, which broadcasts the chosen knobs).
#ifndef GRADLANE_SCHED_BO_TUNER_H_
#define GRADLANE_SCHED_BO_TUNER_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradlane::sched {

// ---------------------------------------------------------------------------------------------
// Gaussian-process building blocks, public so that they can be tested on their own.

// A point in the normalised search space [0, 1]^2: {partition, credit}.
using GpPoint = std::array<double, 2>;

struct GpHyperparameters {
  // Matérn 5/2 length scale per dimension, in normalised units (> 0).
  std::array<double, 2> length_scale = {0.3, 0.3};
  // Prior variance of the standardised objective (> 0).
  double signal_variance = 1.0;
  // Observation-noise variance of the standardised objective (>= 0; a tiny jitter is always
  // added to keep the Cholesky factorisation stable with duplicate points).
  double noise_variance = 1e-3;
};

// The grid over which hyperparameters are fitted: length scales
// {0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1, 2} per dimension × noise variances
// {1e-6, 1e-4, 1e-2, 0.1}; signal variance 1 (the data are standardised). The short end is a
// twentieth of the range (finer structure than ~20 trials can resolve is not worth modelling),
// the long end lets a knob that does not matter be ignored; the noise levels span an exact
// measurement to a noise of ~0.3 standard deviations of the observations. 324 fits of an
// n ≤ 64 Cholesky per observation: milliseconds, once per trial that itself costs training
// iterations.
std::vector<GpHyperparameters> GpHyperparameterGrid();

// Matérn 5/2 covariance between a and b.
double MaternKernel52(const GpPoint& a, const GpPoint& b, const GpHyperparameters& h);

struct GpPrediction {
  double mean = 0;      // in the units of the observed y
  double variance = 0;  // of the latent function (noise excluded), in y units squared
};

// A Gaussian process conditioned on observations (x_i, y_i). y is standardised internally;
// predictions come back in y's units.
class GaussianProcess {
 public:
  // InvalidArgument if the sizes differ, there are no points or more than kMaxPoints, a value
  // is not finite, or the hyperparameters are out of range; FailedPrecondition if the kernel
  // matrix cannot be factorised even with added jitter.
  static absl::StatusOr<GaussianProcess> Fit(std::span<const GpPoint> x, std::span<const double> y,
                                             const GpHyperparameters& hyper);

  static constexpr int kMaxPoints = 64;

  GpPrediction Predict(const GpPoint& p) const;
  // log p(y | X, θ) of the standardised observations: the criterion for fitting θ.
  double log_marginal_likelihood() const { return log_marginal_likelihood_; }
  const GpHyperparameters& hyperparameters() const { return hyper_; }
  // The standard deviation of the observed y (1 if they are all equal): the unit in which the
  // GP works internally.
  double y_scale() const { return y_scale_; }

 private:
  GaussianProcess() = default;

  GpHyperparameters hyper_;
  std::vector<GpPoint> x_;
  double y_mean_ = 0;
  double y_scale_ = 1;
  std::vector<double> chol_;   // lower-triangular L with K + σ²I = L Lᵀ, row-major n×n
  std::vector<double> alpha_;  // (K + σ²I)⁻¹ y_standardised
  double log_marginal_likelihood_ = 0;
};

// Expected improvement of a point with posterior `mean` and standard deviation `stddev` over
// the incumbent `best`, for maximisation, with exploration margin `xi` (all in the same units):
//   EI = (μ − f⁺ − ξ) Φ(z) + σ φ(z),  z = (μ − f⁺ − ξ) / σ;   max(0, μ − f⁺ − ξ) when σ = 0.
double ExpectedImprovement(double mean, double stddev, double best, double xi);

// ---------------------------------------------------------------------------------------------
// The tuner.

// Inclusive bounds of the two knobs, in bytes.
struct TunerBounds {
  uint64_t min_partition_bytes = 0;
  uint64_t max_partition_bytes = 0;
  uint64_t min_credit_bytes = 0;
  uint64_t max_credit_bytes = 0;
};

struct TunerParams {
  uint64_t partition_bytes = 0;
  uint64_t credit_bytes = 0;
  friend bool operator==(const TunerParams&, const TunerParams&) = default;
};

struct TunerTrial {
  TunerParams params;
  double speed = 0;  // larger is better (e.g. samples/s); > 0
};

struct BoTunerOptions {
  // EI exploration margin in standard deviations of the observed speed (paper: 0.1).
  double xi = 0.1;
  // Space-filling trials before the GP drives the search.
  int initial_trials = 5;
  // Done() after this many observations (<= kMaxObservations).
  int max_trials = 20;
  // Done() early once at least `min_trials` are observed and the best candidate's expected
  // improvement of log(speed) is below `min_relative_ei`: the model expects less than that
  // fraction of gain from one more trial, not worth the iterations (and, in PS mode, the
  // restart) a trial costs.
  int min_trials = 10;
  double min_relative_ei = 1e-3;
  // Candidate set: a grid of grid_points_per_dim² points plus random_candidates uniform points.
  int grid_points_per_dim = 33;
  int random_candidates = 1024;
  // Suggested byte counts are rounded to a multiple of this (then clamped to the bounds), so a
  // partition never splits an f32 element. >= 1.
  uint64_t quantum_bytes = 4;
};

class BoTuner {
 public:
  static constexpr int kMaxObservations = GaussianProcess::kMaxPoints;
  // Below this many observations the GP uses GpHyperparameters' defaults: a likelihood over
  // two or three points prefers whatever explains them exactly, which is no evidence.
  static constexpr int kMinObservationsToFit = 4;

  // InvalidArgument on a zero or inverted bound, or options out of range.
  static absl::StatusOr<BoTuner> Create(const TunerBounds& bounds, uint64_t seed,
                                        const BoTunerOptions& options = {});

  // The configuration to try next. Pure: calling it twice without an Observe() in between
  // returns the same point.
  TunerParams Suggest() const { return next_; }

  // Records that `params` ran at `speed`. `params` need not be the suggested point, but must lie
  // within the bounds. InvalidArgument for a speed that is not finite and > 0 or for
  // out-of-bounds params, ResourceExhausted after kMaxObservations observations. A rejected
  // observation leaves the tuner unchanged.
  absl::Status Observe(const TunerParams& params, double speed);

  // The observed trial with the highest speed; NotFound before the first observation.
  absl::StatusOr<TunerTrial> Best() const;

  // Whether to stop tuning: max_trials reached, or (after min_trials) the expected improvement
  // of the next suggestion fell below the threshold. Suggest() still works afterwards.
  bool Done() const;

  // Expected improvement of log(speed) at Suggest() (≈ expected relative gain); +inf during
  // the initial design.
  double next_expected_improvement() const { return next_ei_; }
  const std::vector<TunerTrial>& trials() const { return trials_; }
  // The surrogate fitted to all observations so far (nullptr before the first observation);
  // exposed for metrics and tests.
  const GaussianProcess* model() const { return model_.has_value() ? &*model_ : nullptr; }

  // Normalised coordinates of a configuration, and back (rounded to the quantum, clamped).
  GpPoint ToUnit(const TunerParams& p) const;
  TunerParams FromUnit(const GpPoint& u) const;

 private:
  BoTuner(const TunerBounds& bounds, uint64_t seed, const BoTunerOptions& options);

  // Refits the GP and picks the next suggestion.
  absl::Status Plan();

  TunerBounds bounds_;
  BoTunerOptions options_;
  std::vector<GpPoint> initial_design_;
  // Points of the grid and the random draw, fixed at construction.
  std::vector<GpPoint> candidates_;
  // Offsets from the incumbent, half within ±0.03 (about one grid step), half within ±0.1.
  static constexpr int kLocalCandidates = 256;
  std::vector<GpPoint> local_offsets_;
  std::vector<TunerTrial> trials_;
  std::optional<GaussianProcess> model_;
  TunerParams next_;
  double next_ei_ = 0;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_BO_TUNER_H_
