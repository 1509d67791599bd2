// sched/bo_tuner.cc — see the header for the model, the choices and the guarantees.
#include "sched/bo_tuner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "absl/strings/str_cat.h"

namespace gradlane::sched {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// std::uniform_real_distribution's algorithm is implementation-defined; this one is not, so
// a seed means the same candidates everywhere.
double UnitDouble(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// In-place Cholesky of the row-major n×n symmetric matrix `a` (lower triangle read and
// written; the upper triangle is zeroed). False if `a` is not numerically positive definite.
bool Cholesky(std::vector<double>& a, int n) {
  for (int j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (int k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0.0)) return false;
    const double l = std::sqrt(d);
    a[j * n + j] = l;
    for (int i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (int k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / l;
    }
    for (int k = j + 1; k < n; ++k) a[j * n + k] = 0.0;
  }
  return true;
}

// Solves L v = b in place (forward substitution).
void SolveLower(const std::vector<double>& l, int n, std::vector<double>& b) {
  for (int i = 0; i < n; ++i) {
    double s = b[i];
    for (int k = 0; k < i; ++k) s -= l[i * n + k] * b[k];
    b[i] = s / l[i * n + i];
  }
}

// Solves Lᵀ v = b in place (back substitution).
void SolveUpperFromLower(const std::vector<double>& l, int n, std::vector<double>& b) {
  for (int i = n - 1; i >= 0; --i) {
    double s = b[i];
    for (int k = i + 1; k < n; ++k) s -= l[k * n + i] * b[k];
    b[i] = s / l[i * n + i];
  }
}

bool ValidHyper(const GpHyperparameters& h) {
  return h.length_scale[0] > 0 && h.length_scale[1] > 0 && std::isfinite(h.length_scale[0]) &&
         std::isfinite(h.length_scale[1]) && h.signal_variance > 0 &&
         std::isfinite(h.signal_variance) && h.noise_variance >= 0 &&
         std::isfinite(h.noise_variance);
}

}  // namespace

std::vector<GpHyperparameters> GpHyperparameterGrid() {
  static constexpr double kLengths[] = {0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1.0, 2.0};
  static constexpr double kNoises[] = {1e-6, 1e-4, 1e-2, 1e-1};
  std::vector<GpHyperparameters> grid;
  for (double noise : kNoises) {
    for (double l0 : kLengths) {
      for (double l1 : kLengths) {
        GpHyperparameters h;
        h.length_scale = {l0, l1};
        h.signal_variance = 1.0;
        h.noise_variance = noise;
        grid.push_back(h);
      }
    }
  }
  return grid;
}

double MaternKernel52(const GpPoint& a, const GpPoint& b, const GpHyperparameters& h) {
  const double d0 = (a[0] - b[0]) / h.length_scale[0];
  const double d1 = (a[1] - b[1]) / h.length_scale[1];
  const double r = std::sqrt(5.0 * (d0 * d0 + d1 * d1));
  return h.signal_variance * (1.0 + r + r * r / 3.0) * std::exp(-r);
}

absl::StatusOr<GaussianProcess> GaussianProcess::Fit(std::span<const GpPoint> x,
                                                     std::span<const double> y,
                                                     const GpHyperparameters& hyper) {
  if (x.size() != y.size()) {
    return absl::InvalidArgumentError("gp: x and y differ in length");
  }
  if (x.empty() || x.size() > static_cast<size_t>(kMaxPoints)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gp: need 1..", kMaxPoints, " points, got ", x.size()));
  }
  if (!ValidHyper(hyper)) return absl::InvalidArgumentError("gp: hyperparameters out of range");
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i][0]) || !std::isfinite(x[i][1]) || !std::isfinite(y[i])) {
      return absl::InvalidArgumentError("gp: non-finite input");
    }
  }
  const int n = static_cast<int>(x.size());
  GaussianProcess gp;
  gp.hyper_ = hyper;
  gp.x_.assign(x.begin(), x.end());

  double mean = 0;
  for (double v : y) mean += v;
  mean /= n;
  double var = 0;
  for (double v : y) var += (v - mean) * (v - mean);
  var /= n;
  gp.y_mean_ = mean;
  // Identical observations carry no scale; 1 keeps the arithmetic defined.
  gp.y_scale_ = var > 0 ? std::sqrt(var) : 1.0;
  std::vector<double> ys(n);
  for (int i = 0; i < n; ++i) ys[i] = (y[i] - mean) / gp.y_scale_;

  // Duplicate points with zero noise make K singular; a jitter far below any noise level the
  // grid fits keeps the factorisation alive without changing the model.
  for (double jitter = 1e-10 * hyper.signal_variance;; jitter *= 100) {
    if (jitter > 1e-2 * hyper.signal_variance) {
      return absl::FailedPreconditionError("gp: kernel matrix not positive definite");
    }
    gp.chol_.assign(static_cast<size_t>(n) * n, 0.0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j <= i; ++j) {
        gp.chol_[i * n + j] = MaternKernel52(gp.x_[i], gp.x_[j], hyper);
      }
      gp.chol_[i * n + i] += hyper.noise_variance + jitter;
    }
    if (Cholesky(gp.chol_, n)) break;
  }
  gp.alpha_ = ys;
  SolveLower(gp.chol_, n, gp.alpha_);
  SolveUpperFromLower(gp.chol_, n, gp.alpha_);

  double fit = 0;
  for (int i = 0; i < n; ++i) fit += ys[i] * gp.alpha_[i];
  double log_det_half = 0;
  for (int i = 0; i < n; ++i) log_det_half += std::log(gp.chol_[i * n + i]);
  gp.log_marginal_likelihood_ =
      -0.5 * fit - log_det_half - 0.5 * n * std::log(2 * std::numbers::pi);
  return gp;
}

GpPrediction GaussianProcess::Predict(const GpPoint& p) const {
  const int n = static_cast<int>(x_.size());
  std::vector<double> k(n);
  double mean_s = 0;
  for (int i = 0; i < n; ++i) {
    k[i] = MaternKernel52(p, x_[i], hyper_);
    mean_s += k[i] * alpha_[i];
  }
  SolveLower(chol_, n, k);
  double explained = 0;
  for (double v : k) explained += v * v;
  const double var_s = std::max(0.0, hyper_.signal_variance - explained);
  return {y_mean_ + y_scale_ * mean_s, y_scale_ * y_scale_ * var_s};
}

double ExpectedImprovement(double mean, double stddev, double best, double xi) {
  const double improvement = mean - best - xi;
  if (!(stddev > 1e-12)) return std::max(0.0, improvement);
  const double z = improvement / stddev;
  const double cdf = 0.5 * std::erfc(-z / std::numbers::sqrt2);
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
  // Far in the lower tail both terms are ~0 and rounding can make the sum slightly negative.
  return std::max(0.0, improvement * cdf + stddev * pdf);
}

absl::StatusOr<BoTuner> BoTuner::Create(const TunerBounds& bounds, uint64_t seed,
                                        const BoTunerOptions& options) {
  if (bounds.min_partition_bytes == 0 || bounds.min_credit_bytes == 0) {
    return absl::InvalidArgumentError("bo tuner: lower bounds must be > 0 bytes");
  }
  if (bounds.min_partition_bytes > bounds.max_partition_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bo tuner: partition bounds inverted: [",
                                                   bounds.min_partition_bytes, ", ",
                                                   bounds.max_partition_bytes, "]"));
  }
  if (bounds.min_credit_bytes > bounds.max_credit_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bo tuner: credit bounds inverted: [",
                                                   bounds.min_credit_bytes, ", ",
                                                   bounds.max_credit_bytes, "]"));
  }
  const BoTunerOptions& o = options;
  if (!(o.xi >= 0 && std::isfinite(o.xi))) {
    return absl::InvalidArgumentError("bo tuner: xi must be finite and >= 0");
  }
  if (o.max_trials < 1 || o.max_trials > kMaxObservations) {
    return absl::InvalidArgumentError(
        absl::StrCat("bo tuner: max_trials must be in [1, ", kMaxObservations, "]"));
  }
  if (o.initial_trials < 1 || o.initial_trials > o.max_trials) {
    return absl::InvalidArgumentError("bo tuner: initial_trials must be in [1, max_trials]");
  }
  if (o.min_trials < 0 || !(o.min_relative_ei >= 0 && std::isfinite(o.min_relative_ei))) {
    return absl::InvalidArgumentError("bo tuner: min_trials and min_relative_ei must be >= 0");
  }
  if (o.grid_points_per_dim < 2 || o.grid_points_per_dim > 256 || o.random_candidates < 0 ||
      o.random_candidates > 1 << 16) {
    return absl::InvalidArgumentError(
        "bo tuner: grid_points_per_dim must be in [2, 256], random_candidates in [0, 65536]");
  }
  if (o.quantum_bytes == 0) return absl::InvalidArgumentError("bo tuner: quantum_bytes is 0");
  BoTuner tuner(bounds, seed, options);
  if (absl::Status s = tuner.Plan(); !s.ok()) return s;
  return tuner;
}

BoTuner::BoTuner(const TunerBounds& bounds, uint64_t seed, const BoTunerOptions& options)
    : bounds_(bounds), options_(options) {
  std::mt19937_64 rng(seed);
  // Latin hypercube: each knob's range is cut into `initial_trials` strata and every stratum is
  // tried once, so even a 5-point design spans both axes.
  const int m = options_.initial_trials;
  std::array<std::vector<int>, 2> perm;
  for (auto& p : perm) {
    p.resize(m);
    for (int i = 0; i < m; ++i) p[i] = i;
    for (int i = m - 1; i > 0; --i) std::swap(p[i], p[rng() % static_cast<uint64_t>(i + 1)]);
  }
  for (int i = 0; i < m; ++i) {
    GpPoint u;
    for (int d = 0; d < 2; ++d) u[d] = (perm[d][i] + UnitDouble(rng)) / m;
    initial_design_.push_back(u);
  }
  const int g = options_.grid_points_per_dim;
  for (int i = 0; i < g; ++i) {
    for (int j = 0; j < g; ++j) {
      candidates_.push_back({static_cast<double>(i) / (g - 1), static_cast<double>(j) / (g - 1)});
    }
  }
  for (int i = 0; i < options_.random_candidates; ++i) {
    const double a = UnitDouble(rng);
    candidates_.push_back({a, UnitDouble(rng)});
  }
  for (int i = 0; i < kLocalCandidates; ++i) {
    const double r = i % 2 == 0 ? 0.03 : 0.1;
    const double a = (2 * UnitDouble(rng) - 1) * r;
    local_offsets_.push_back({a, (2 * UnitDouble(rng) - 1) * r});
  }
}

GpPoint BoTuner::ToUnit(const TunerParams& p) const {
  auto unit = [](uint64_t v, uint64_t lo, uint64_t hi) {
    if (hi == lo) return 0.0;
    const double u = (std::log2(static_cast<double>(v)) - std::log2(static_cast<double>(lo))) /
                     (std::log2(static_cast<double>(hi)) - std::log2(static_cast<double>(lo)));
    return std::clamp(u, 0.0, 1.0);
  };
  return {unit(p.partition_bytes, bounds_.min_partition_bytes, bounds_.max_partition_bytes),
          unit(p.credit_bytes, bounds_.min_credit_bytes, bounds_.max_credit_bytes)};
}

TunerParams BoTuner::FromUnit(const GpPoint& u) const {
  const uint64_t q = options_.quantum_bytes;
  auto bytes = [q](double t, uint64_t lo, uint64_t hi) {
    const double llo = std::log2(static_cast<double>(lo));
    const double lhi = std::log2(static_cast<double>(hi));
    const double v = std::exp2(llo + std::clamp(t, 0.0, 1.0) * (lhi - llo));
    const double rounded = std::round(v / static_cast<double>(q)) * static_cast<double>(q);
    // Compare in double before converting: a value at 2^64 does not fit the integer.
    if (rounded >= static_cast<double>(hi)) return hi;
    if (rounded <= static_cast<double>(lo)) return lo;
    return static_cast<uint64_t>(rounded);
  };
  return {bytes(u[0], bounds_.min_partition_bytes, bounds_.max_partition_bytes),
          bytes(u[1], bounds_.min_credit_bytes, bounds_.max_credit_bytes)};
}

absl::Status BoTuner::Observe(const TunerParams& params, double speed) {
  if (!std::isfinite(speed) || !(speed > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bo tuner: speed must be finite and > 0, got ", speed));
  }
  if (params.partition_bytes < bounds_.min_partition_bytes ||
      params.partition_bytes > bounds_.max_partition_bytes ||
      params.credit_bytes < bounds_.min_credit_bytes ||
      params.credit_bytes > bounds_.max_credit_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bo tuner: (partition ", params.partition_bytes,
                                                   ", credit ", params.credit_bytes,
                                                   ") outside the bounds"));
  }
  if (trials_.size() >= static_cast<size_t>(kMaxObservations)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("bo tuner: already ", kMaxObservations, " observations"));
  }
  trials_.push_back({params, speed});
  absl::Status s = Plan();
  if (!s.ok()) trials_.pop_back();  // leave the tuner as it was before the call
  return s;
}

absl::Status BoTuner::Plan() {
  const int n = static_cast<int>(trials_.size());
  if (n > 0) {
    std::vector<GpPoint> x(n);
    std::vector<double> y(n);
    for (int i = 0; i < n; ++i) {
      x[i] = ToUnit(trials_[i].params);
      y[i] = std::log(trials_[i].speed);
    }
    std::optional<GaussianProcess> best_fit;
    if (n < kMinObservationsToFit) {
      absl::StatusOr<GaussianProcess> gp = GaussianProcess::Fit(x, y, GpHyperparameters{});
      if (!gp.ok()) return gp.status();
      best_fit = *std::move(gp);
    } else {
      for (const GpHyperparameters& h : GpHyperparameterGrid()) {
        absl::StatusOr<GaussianProcess> gp = GaussianProcess::Fit(x, y, h);
        if (!gp.ok()) continue;  // this θ cannot explain the data; others may
        // Strictly greater: ties keep the earlier grid entry, for determinism.
        if (!best_fit.has_value() ||
            gp->log_marginal_likelihood() > best_fit->log_marginal_likelihood()) {
          best_fit = *std::move(gp);
        }
      }
      if (!best_fit.has_value()) {
        return absl::FailedPreconditionError("bo tuner: no hyperparameters fit the data");
      }
    }
    model_ = std::move(best_fit);
  }

  if (n < options_.initial_trials) {
    next_ = FromUnit(initial_design_[n]);
    next_ei_ = kInf;
    return absl::OkStatus();
  }

  // EI is evaluated on the GP's standardised scale so that ξ is in standard deviations of the
  // observed log speeds (see the header), then reported back in log-speed units.
  double best = std::log(trials_.front().speed);
  GpPoint incumbent = ToUnit(trials_.front().params);
  for (const TunerTrial& t : trials_) {
    if (std::log(t.speed) > best) {
      best = std::log(t.speed);
      incumbent = ToUnit(t.params);
    }
  }
  const double scale = model_->y_scale();

  GpPoint arg{};
  double best_ei = -1;
  auto consider = [&](const GpPoint& c) {
    const GpPrediction p = model_->Predict(c);
    const double ei = ExpectedImprovement(p.mean / scale, std::sqrt(p.variance) / scale,
                                          best / scale, options_.xi);
    if (ei > best_ei) {
      best_ei = ei;
      arg = c;
    }
  };
  for (const GpPoint& c : candidates_) consider(c);
  for (const GpPoint& off : local_offsets_) {
    consider(
        {std::clamp(incumbent[0] + off[0], 0.0, 1.0), std::clamp(incumbent[1] + off[1], 0.0, 1.0)});
  }
  next_ = FromUnit(arg);
  next_ei_ = best_ei * scale;
  return absl::OkStatus();
}

absl::StatusOr<TunerTrial> BoTuner::Best() const {
  if (trials_.empty()) return absl::NotFoundError("bo tuner: no observations yet");
  const TunerTrial* best = &trials_.front();
  for (const TunerTrial& t : trials_) {
    if (t.speed > best->speed) best = &t;
  }
  return *best;
}

bool BoTuner::Done() const {
  const int n = static_cast<int>(trials_.size());
  if (n >= options_.max_trials) return true;
  if (n < options_.min_trials || n < options_.initial_trials) return false;
  return next_ei_ < options_.min_relative_ei;
}

}  // namespace gradlane::sched
