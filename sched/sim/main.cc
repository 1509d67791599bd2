// gradlane-sim — runs communication-scheduling policies and the ideal bound over a model
// profile in the discrete-event simulator (sched/sim/simulator.h) and prints one row per policy.
//
//   gradlane-sim --profile tests/data/models/resnet50.json --bandwidth 3gbit --workers 3
//                --policy all --format csv [--mode allreduce]
//
// --mode ps (the default) simulates co-located parameter servers; --mode allreduce ring
// all-reduce, with its own ideal bound (sched/sim/simulator.h); the csv then ends with a `mode`
// column and the table's footer names the mode.
//
// Exit codes: 0 success; 2 bad input (flags, profile file, a policy's knobs) with a message on
// stderr; 1 a simulation failure (a policy broke the Policy contract or stalled).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "sched/dag.h"
#include "sched/model_profile.h"
#include "sched/policies/gradlane_selector.h"
#include "sched/policy.h"
#include "sched/priority.h"
#include "sched/profile_priorities.h"
#include "sched/sim/simulator.h"

ABSL_FLAG(std::string, profile, "", "model profile JSON file (docs/design.md §5 format); required");
ABSL_FLAG(std::string, bandwidth, "10gbit",
          "per-host link bandwidth per direction: Nkbit, Nmbit, Ngbit or plain bits/s");
ABSL_FLAG(int, workers, 3, "number of hosts W (each a worker and a PS shard, or a ring member)");
ABSL_FLAG(std::string, mode, "ps",
          "ps (co-located parameter servers) or allreduce (ring all-reduce: reduce-scatter then "
          "all-gather per partition, each partition in W chunks)");
ABSL_FLAG(
    std::string, policy, "all",
    "'all' or a comma-separated list of policies (fifo, p3, bytescheduler, prophet, gradlane)");
ABSL_FLAG(std::string, format, "csv", "csv (for tools) or table (for people)");
// Default: SimConfig::overhead_ns (gradlaned's θ over TCP, measured by tests/bench/theta.sh).
ABSL_FLAG(double, overhead_us, 3, "per-message overhead θ on the sender's link, µs");
ABSL_FLAG(double, latency_us, 25, "one-way latency, µs");
ABSL_FLAG(double, aggregation_gbytes_per_s, 50,
          "shard summing rate over input bytes, GB/s; 0 = instantaneous");
ABSL_FLAG(int, iterations, 10, "measured iterations");
// 104: the gradlane policy tries its eight candidate schedules in iterations 1..24 (after one
// warm-up iteration, kTrialIterations = 3 each: sched/policies/gradlane_selector.h), runs
// those too close to the best for their own spread again from 25 (kRunoffIterations = 9 each:
// choice at 43, 52 or 61 for two, three or four of them; all eight, kLatestChoiceIteration,
// 97; 104 is the next multiple of kTrialAlignIterations), and runs its choice from then on; that
// iteration still holds the last trial's backlog, and the choice takes a few iterations to settle
// into its own steady state (up to six on the small models at W = 8). A job runs thousands of
// iterations, so what it keeps is what its users get. The trials' own cost: docs/simulator.md. Long
// enough for gradlane's trials and the largest runoff, so that the measured window is its choice's
// (every policy gets the same warm-up).
constexpr int kDefaultWarmup = 104;
static_assert(kDefaultWarmup >= gradlane::sched::kLatestChoiceIteration);
ABSL_FLAG(int, warmup, kDefaultWarmup, "warm-up iterations (simulated, not measured)");
ABSL_FLAG(double, start_skew_us, 0,
          "host w starts its first iteration at w times this (µs; 0: every host at once, "
          "as before; daemons never start in step)");
ABSL_FLAG(int64_t, partition_bytes, 0, "partition size δ for every policy; 0 = each one's default");
ABSL_FLAG(int64_t, credit_bytes, 0, "credit window for every policy; 0 = each one's default");
ABSL_FLAG(int64_t, shard_partition_bytes, 4 << 20,
          "granularity of the key-to-shard assignment (ps); the ring's partition size, each cut "
          "into W chunks (allreduce)");
ABSL_FLAG(bool, balance_shards, true,
          "ps: cut keys finer than --shard_partition_bytes where the shards would otherwise be "
          "unevenly loaded, as the daemon does (sched/shard_balance.h); false: the plain map");
ABSL_FLAG(int64_t, ideal_granularity_bytes, 0,
          "piece size of the ideal bound; 0 = 20 µs of link time in [16 KiB, 1 MiB]");
ABSL_FLAG(std::string, priorities, "index",
          "tensor priorities: index | auto | tic | tac | pace (DAG modes use the profile's chain)");
ABSL_FLAG(bool, live_link_estimates, true,
          "feed each policy its host's live bandwidth/RTT estimate (sched/bandwidth_estimator.h); "
          "false: only the configured bandwidth and latency");
ABSL_FLAG(double, rho, 0,
          "scale every compute time of the profile (fwd, bwd, ready) by one factor so that ρ = "
          "(2(W-1)/W · model bytes / B) / C takes this value at the given bandwidth and W; "
          "0 = the profile's own times");
ABSL_FLAG(bool, details, false,
          "after the rows, print each policy's per-iteration times and per-host link traffic (and "
          "what gradlane ran when)");
ABSL_FLAG(bool, fluid, false,
          "also print the all-ports fluid priority schedule (a reference, not a bound)");

namespace {

using gradlane::sched::ModelProfile;
using gradlane::sched::Policy;
using gradlane::sched::PolicyConfig;
using gradlane::sched::Priority;
using gradlane::sched::TimeNs;
namespace sim = gradlane::sched::sim;

[[noreturn]] void Fail(int code, absl::string_view message) {
  std::cerr << "gradlane-sim: " << message << "\n";
  std::exit(code);
}

// "3gbit", "100mbit", "1.5Gbit", "2.5e9" -> bits per second.
absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  double scale = 1;
  for (const auto& [suffix, factor] : {std::pair<absl::string_view, double>{"gbit", 1e9},
                                       {"mbit", 1e6},
                                       {"kbit", 1e3},
                                       {"bit", 1}}) {
    if (absl::EndsWith(s, suffix)) {
      s.resize(s.size() - suffix.size());
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (s.empty() || !absl::SimpleAtod(s, &value) || !std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bandwidth: '", text, "' is not a positive bandwidth (e.g. 3gbit, 100mbit, 2.5e9)"));
  }
  return value * scale;
}

// absl's parser exits with status 1 on an unknown flag or a bad value; the contract here is
// exit code 2 for any bad input, so check every flag argument first.
void PrecheckFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // positional: rejected later
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view name = arg.substr(0, arg.find('='));
    std::optional<absl::string_view> value;
    if (arg.find('=') != absl::string_view::npos) value = arg.substr(arg.find('=') + 1);
    // absl's own usage and flag-file flags: left to absl::ParseCommandLine.
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
        name == "version" || name == "only_check_args") {
      continue;
    }
    if (name == "helpon" || name == "helpmatch" || name == "flagfile" || name == "fromenv" ||
        name == "tryfromenv" || name == "undefok") {
      if (!value.has_value()) ++i;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && !flag->IsOfType<bool>()) flag = nullptr;
      if (flag != nullptr) continue;
    }
    if (flag == nullptr) Fail(2, absl::StrCat("unknown flag --", name, " (try --help)"));
    if (flag->IsOfType<bool>()) {
      if (value.has_value()) {
        std::string error;
        if (!flag->ParseFrom(*value, &error)) {
          Fail(2, absl::StrCat("--", name, ": ", error));
        }
      }
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= argc) Fail(2, absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) Fail(2, absl::StrCat("--", name, ": ", error));
  }
}

absl::StatusOr<std::vector<std::string>> PolicyList(absl::string_view text) {
  const std::vector<std::string>& known = gradlane::sched::PolicyNames();
  if (text == "all") return known;
  std::vector<std::string> out;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--policy: unknown policy '", name,
                                                     "' (known: ", absl::StrJoin(known, ", "),
                                                     ", or all)"));
    }
    if (std::find(out.begin(), out.end(), name) == out.end()) out.emplace_back(name);
  }
  if (out.empty()) return absl::InvalidArgumentError("--policy: no policy named");
  return out;
}

// Per-layer priorities for the configured mode (empty: layer index).
absl::StatusOr<std::vector<Priority>> LayerPriorities(const ModelProfile& profile,
                                                      absl::string_view mode_name,
                                                      double bytes_per_s) {
  absl::StatusOr<gradlane::sched::PriorityMode> mode =
      gradlane::sched::ParsePriorityMode(std::string(mode_name));
  if (!mode.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--priorities: ", mode.status().message()));
  }
  return gradlane::sched::ProfileLayerPriorities(profile, *mode, bytes_per_s);
}

std::string Fixed(double v, int digits) {
  if (!std::isfinite(v)) return "";
  return absl::StrFormat("%.*f", digits, v);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "simulates communication-scheduling policies over a model profile.\n"
      "  gradlane-sim --profile FILE --bandwidth 3gbit --workers 3 --policy all --format csv");
  // --help lists the flags of the file defining main(); absl's default looks for a file named
  // after the program.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "sim/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  PrecheckFlags(argc, argv);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Fail(2, absl::StrCat("unexpected argument '", rest[1], "'"));

  const std::string path = absl::GetFlag(FLAGS_profile);
  if (path.empty()) Fail(2, "--profile FILE is required");
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(2, absl::StrCat("cannot open profile '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) Fail(2, absl::StrCat("cannot read profile '", path, "'"));
  absl::StatusOr<ModelProfile> profile = gradlane::sched::ParseModelProfile(text.str());
  if (!profile.ok()) Fail(2, absl::StrCat(path, ": ", profile.status().message()));

  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "csv" && format != "table") {
    Fail(2, absl::StrCat("--format: '", format, "' is not csv or table"));
  }
  absl::StatusOr<double> bandwidth = ParseBandwidth(absl::GetFlag(FLAGS_bandwidth));
  if (!bandwidth.ok()) Fail(2, bandwidth.status().message());

  sim::SimConfig config;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "ps") {
    config.mode = sim::SimMode::kParameterServer;
  } else if (mode == "allreduce") {
    config.mode = sim::SimMode::kAllReduce;
  } else {
    Fail(2, absl::StrCat("--mode: '", mode, "' is not ps or allreduce"));
  }
  const bool allreduce = config.mode == sim::SimMode::kAllReduce;
  if (allreduce && absl::GetFlag(FLAGS_fluid)) {
    Fail(2, "--fluid: the all-ports fluid reference exists in --mode ps only");
  }
  config.workers = absl::GetFlag(FLAGS_workers);
  config.bandwidth_bits_per_s = *bandwidth;
  const double overhead_us = absl::GetFlag(FLAGS_overhead_us);
  const double latency_us = absl::GetFlag(FLAGS_latency_us);
  const double agg = absl::GetFlag(FLAGS_aggregation_gbytes_per_s);
  if (!std::isfinite(overhead_us) || overhead_us < 0 || overhead_us > 1e9) {
    Fail(2, "--overhead_us must be in [0, 1e9]");
  }
  if (!std::isfinite(latency_us) || latency_us < 0 || latency_us > 1e9) {
    Fail(2, "--latency_us must be in [0, 1e9]");
  }
  if (!std::isfinite(agg) || agg < 0 || agg > 1e9) {
    Fail(2, "--aggregation_gbytes_per_s must be in [0, 1e9] (0: instantaneous)");
  }
  config.overhead_ns = static_cast<TimeNs>(std::llround(overhead_us * 1000));
  config.latency_ns = static_cast<TimeNs>(std::llround(latency_us * 1000));
  config.aggregation_bytes_per_s = agg * 1e9;
  config.live_link_estimates = absl::GetFlag(FLAGS_live_link_estimates);
  config.measured_iterations = absl::GetFlag(FLAGS_iterations);
  config.warmup_iterations = absl::GetFlag(FLAGS_warmup);
  const double skew_us = absl::GetFlag(FLAGS_start_skew_us);
  if (!std::isfinite(skew_us) || skew_us < 0 || skew_us > 1e7) {
    Fail(2, "--start_skew_us must be in [0, 1e7]");
  }
  config.start_skew_ns = static_cast<TimeNs>(std::llround(skew_us * 1000));
  const int64_t shard_bytes = absl::GetFlag(FLAGS_shard_partition_bytes);
  const int64_t ideal_bytes = absl::GetFlag(FLAGS_ideal_granularity_bytes);
  const int64_t partition = absl::GetFlag(FLAGS_partition_bytes);
  const int64_t credit = absl::GetFlag(FLAGS_credit_bytes);
  if (shard_bytes <= 0) Fail(2, "--shard_partition_bytes must be > 0");
  if (ideal_bytes < 0) Fail(2, "--ideal_granularity_bytes must be >= 0");
  if (partition < 0) Fail(2, "--partition_bytes must be >= 0");
  if (credit < 0) Fail(2, "--credit_bytes must be >= 0");
  config.shard_partition_bytes = static_cast<uint64_t>(shard_bytes);
  config.balance_shards = absl::GetFlag(FLAGS_balance_shards);
  config.ideal_granularity_bytes = static_cast<uint64_t>(ideal_bytes);
  if (const double rho = absl::GetFlag(FLAGS_rho); rho != 0) {
    if (!std::isfinite(rho) || rho < 1e-3 || rho > 1e3)
      Fail(2, "--rho must be 0 or in [0.001, 1000]");
    if (!sim::ScaleComputeToRho(*profile, config, rho)) {
      Fail(2, "--rho: the profile has no compute time to scale");
    }
  }
  absl::StatusOr<std::vector<Priority>> priorities =
      LayerPriorities(*profile, absl::GetFlag(FLAGS_priorities), *bandwidth / 8);
  if (!priorities.ok()) Fail(2, priorities.status().message());
  config.priorities = *std::move(priorities);
  if (absl::Status s = sim::ValidateConfig(*profile, config); !s.ok()) Fail(2, s.message());

  absl::StatusOr<std::vector<std::string>> names = PolicyList(absl::GetFlag(FLAGS_policy));
  if (!names.ok()) Fail(2, names.status().message());

  // As in the daemon, a policy whose own partitions are coarser than the balanced keys cuts at
  // the keys (its partitions are the keys there); fifo keeps whole tensors.
  const uint64_t shard_unit = sim::ShardUnitBytes(*profile, config);
  auto factory_for = [&](const std::string& name) {
    uint64_t policy_partition = static_cast<uint64_t>(partition);
    if (policy_partition == 0 && config.mode == sim::SimMode::kParameterServer &&
        shard_unit < config.shard_partition_bytes &&
        shard_unit < gradlane::sched::DefaultPartitionBytes(name, gradlane::sched::DType::kF32)) {
      policy_partition = shard_unit;
    }
    return [name, policy_partition, credit, bandwidth = *bandwidth,
            overhead_ns = config.overhead_ns]() {
      PolicyConfig pc;
      pc.name = name;
      pc.partition_bytes = policy_partition;
      pc.credit_bytes = static_cast<uint64_t>(credit);
      pc.initial_bandwidth_bytes_per_s = bandwidth / 8;
      pc.per_message_overhead_ns = overhead_ns;
      return gradlane::sched::MakePolicy(pc);
    };
  };
  // Bad knobs are input errors: find them before simulating anything.
  for (const std::string& name : *names) {
    absl::StatusOr<std::unique_ptr<Policy>> probe = factory_for(name)();
    if (!probe.ok()) Fail(2, absl::StrCat("policy ", name, ": ", probe.status().message()));
  }

  std::vector<sim::SimResult> rows;
  std::optional<sim::SimResult> fifo;
  for (const std::string& name : *names) {
    absl::StatusOr<sim::SimResult> r = sim::Simulate(*profile, config, factory_for(name), name);
    if (!r.ok()) Fail(1, absl::StrCat("policy ", name, ": ", r.status().message()));
    if (name == "fifo") fifo = *r;
    rows.push_back(*std::move(r));
  }
  if (!fifo.has_value()) {  // the speedup column is relative to fifo even when it is not shown
    absl::StatusOr<sim::SimResult> r = sim::Simulate(*profile, config, factory_for("fifo"), "fifo");
    if (r.ok()) fifo = *std::move(r);
  }
  absl::StatusOr<sim::SimResult> ideal = sim::SimulateIdeal(*profile, config);
  if (!ideal.ok()) Fail(1, absl::StrCat("ideal: ", ideal.status().message()));
  rows.push_back(*ideal);
  if (absl::GetFlag(FLAGS_fluid)) {
    absl::StatusOr<sim::SimResult> fluid = sim::SimulateFluid(*profile, config);
    if (!fluid.ok()) Fail(1, absl::StrCat("fluid: ", fluid.status().message()));
    rows.push_back(*std::move(fluid));
  }

  std::vector<std::string> header = {"policy",
                                     "iteration_ms",
                                     "speedup_vs_fifo",
                                     "ratio_to_ideal",
                                     "gpu_idle_pct",
                                     "alpha",
                                     "rho",
                                     "compute_ms",
                                     "comm_ms",
                                     "max_link_mb",
                                     "messages",
                                     "bandwidth_gbit",
                                     "workers",
                                     "model"};
  // ps output stays as it always was; all-reduce rows say so.
  if (allreduce) header.push_back("mode");
  std::vector<std::vector<std::string>> cells;
  for (const sim::SimResult& r : rows) {
    double max_link = 0, messages = 0;
    for (const sim::LinkStats& l : r.links) {
      max_link = std::max({max_link, l.up_bytes, l.down_bytes});
      messages += l.up_messages;
    }
    const bool is_bound = r.policy == "ideal" || r.policy == "fluid";
    cells.push_back({
        r.policy,
        Fixed(r.mean_iteration_ns / 1e6, 3),
        fifo.has_value() ? Fixed(fifo->mean_iteration_ns / r.mean_iteration_ns, 3) : "",
        Fixed(r.mean_iteration_ns / ideal->mean_iteration_ns, 3),
        Fixed(100 * r.gpu_idle_share, 1),
        Fixed(r.alpha, 3),
        Fixed(r.rho, 3),
        Fixed(r.compute_ns / 1e6, 3),
        Fixed(r.comm_ns / 1e6, 3),
        Fixed(max_link / 1e6, 3),
        is_bound ? "" : Fixed(messages, 0),
        Fixed(config.bandwidth_bits_per_s / 1e9, 3),
        absl::StrCat(config.workers),
        profile->model,
    });
    if (allreduce) cells.back().emplace_back(sim::SimModeName(config.mode));
  }
  if (format == "csv") {
    std::cout << absl::StrJoin(header, ",") << "\n";
    for (const auto& row : cells) std::cout << absl::StrJoin(row, ",") << "\n";
  } else {
    std::vector<size_t> width(header.size());
    for (size_t c = 0; c < header.size(); ++c) {
      width[c] = header[c].size();
      for (const auto& row : cells) width[c] = std::max(width[c], row[c].size());
    }
    auto print = [&](const std::vector<std::string>& row) {
      for (size_t c = 0; c < row.size(); ++c) {
        std::cout << (c ? "  " : "")
                  << (c == 0 ? absl::StrFormat("%-*s", width[c], row[c])
                             : absl::StrFormat("%*s", width[c], row[c]));
      }
      std::cout << "\n";
    };
    print(header);
    for (const auto& row : cells) print(row);
    // One footer for both modes: what differs is the mode's name and what the bound is.
    const std::string skew_note =
        skew_us > 0 ? absl::StrFormat(", host w starting at w × %g µs", skew_us) : "";
    const std::string bound_note =
        allreduce
            ? absl::StrCat("ideal = the all-reduce bound (", ideal->variant, ")")
            : absl::StrFormat("ideal bound from the %s (single-port relaxations alone: %.3f ms)",
                              ideal->variant, ideal->single_port_mean_ns / 1e6);
    std::cout << absl::StrFormat(
        "\n%s%s, W=%d, %.3g Gbit/s, θ=%.0f µs, latency=%.0f µs, %d+%d iterations%s; %s\n",
        profile->model, allreduce ? ", mode allreduce (ring)" : "", config.workers,
        config.bandwidth_bits_per_s / 1e9, overhead_us, latency_us, config.warmup_iterations,
        config.measured_iterations, skew_note, bound_note);
  }
  if (absl::GetFlag(FLAGS_details)) {
    std::cout << "\n# per-iteration times (ms) and per-host traffic (MB per iteration)\n";
    for (const sim::SimResult& r : rows) {
      std::cout << r.policy << (r.variant.empty() ? "" : absl::StrCat(" (", r.variant, ")"))
                << ": iterations";
      for (TimeNs t : r.iteration_ns) std::cout << absl::StrFormat(" %.3f", t / 1e6);
      std::cout << "\n";
      // What gradlane ran when: its trials, any runoff, and its choice.
      if (r.schedules.size() > 1) {
        std::cout << "  host 0 ran";
        for (const sim::ScheduleChange& c : r.schedules) {
          std::cout << " " << c.schedule << " from " << c.iteration;
        }
        std::cout << "\n";
      }
      for (size_t h = 0; h < r.links.size(); ++h) {
        const sim::LinkStats& l = r.links[h];
        std::cout << absl::StrFormat(
            "  host %d: up %.3f MB (busy %.3f ms, %.0f messages), down %.3f MB (busy %.3f ms)\n", h,
            l.up_bytes / 1e6, l.up_busy_ns / 1e6, l.up_messages, l.down_bytes / 1e6,
            l.down_busy_ns / 1e6);
      }
    }
  }
  return 0;
}
