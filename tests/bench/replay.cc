// tests/bench/replay.cc — gradlane-replay: emulates one rank of data-parallel training from a
// model profile (docs/design.md §5 format, tests/data/models/*.json) through the real daemons, and
// reports iteration times.
//
// Compute is EMULATED BY SLEEPING: the process sleeps for each layer's fwd_us, and posts each
// gradient at its ready time within backward, with absolute-deadline clock_nanosleep on
// CLOCK_MONOTONIC (timer slack 1 ns) so errors do not accumulate. Like a GPU, the "compute"
// leaves the host CPU to the daemon; unlike a GPU, nothing touches memory bandwidth.
//
// One tensor per layer that has parameters (f32, param_bytes rounded up to whole elements),
// priority = layer index (or --priority=auto: learnt by the daemon; tic, tac, pace: computed from
// the profile's layer chain as gradlane-sim does, sched/profile_priorities.h). Per iteration k:
//   forward:  for layer i = 0..L-1: wait until layer i's result of iteration k-1 is back
//             (k > 0), then sleep fwd_us(i);
//   backward: post layer i's gradient at ready_us(i) after backward began (ready_us from the
//             profile, else the cumulative bwd_us from the last layer down; ties posted in
//             reverse layer order), then sleep until backward's end.
// Iteration k's time runs from the start of its forward to the start of forward k+1, so it
// includes every stall on communication; one extra forward pass after the last iteration
// closes the measurement. The first --warmup iterations are run but not counted.
//
// Output: one line per iteration, then "gradlane-replay: mean X ms ..." (stdout); --csv FILE
// writes iteration,time_ms,stall_ms,warmup,start_ns (start_ns: CLOCK_MONOTONIC at the start of
// the iteration's forward pass — one clock for every process on the machine, network namespaces
// included, so a harness can line the ranks up as the simulator does: tests/bench/run-replay).
// --device=cuda: every gradient lives in GPU 0's memory (cuMemAlloc) and is registered with
// gl_register_device_tensor, so each post and result also crosses PCIe through libgradlane's
// staging (docs/gpu.md); tests/bench/device_goodput.sh compares it with host tensors.
// Exit 0 on success, 1 on any error completion, timeout or daemon failure (message on stderr),
// 2 on bad flags or a bad profile.
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "libclient/cuda_driver.h"
#include "libclient/gradlane.h"
#include "sched/model_profile.h"
#include "sched/priority.h"
#include "sched/profile_priorities.h"
#include "tests/integration/client_flags.h"

namespace {

using gradlane::testing::Flags;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void SleepUntil(int64_t t_ns) {
  timespec ts{static_cast<time_t>(t_ns / 1'000'000'000), static_cast<long>(t_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

struct Layer {
  std::string name;
  int64_t fwd_ns = 0;
  int64_t ready_ns = 0;
  uint64_t bytes = 0;  // registered bytes (0: no parameters, nothing to send)
  uint32_t tensor = 0;
  int64_t done_iter = -1;  // latest iteration whose result is back
};

// --device=cuda: GPU 0's primary context, made current on this (the only) thread, and the
// gradients' device memory, freed after gl_close.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (cuda_ == nullptr) return;
    for (gradlane::client::cu::DevicePtr p : allocations_) cuda_->MemFree(p);
    if (context_retained_) cuda_->DevicePrimaryCtxRelease(device_);
  }

  bool active() const { return cuda_ != nullptr; }

  absl::Status SetUp() {
    namespace cu = gradlane::client::cu;
    absl::StatusOr<const gradlane::client::CudaDriver*> cuda = gradlane::client::LoadCudaDriver();
    if (!cuda.ok()) return cuda.status();
    int count = 0;
    cu::Context ctx = nullptr;
    cu::Result r = (*cuda)->DeviceGetCount(&count);
    if (r == cu::kSuccess && count < 1) return absl::FailedPreconditionError("no GPU");
    if (r == cu::kSuccess) r = (*cuda)->DeviceGet(&device_, 0);
    if (r == cu::kSuccess) r = (*cuda)->DevicePrimaryCtxRetain(&ctx, device_);
    if (r == cu::kSuccess) {
      context_retained_ = true;
      r = (*cuda)->CtxSetCurrent(ctx);
    }
    cuda_ = *cuda;
    if (r != cu::kSuccess) return absl::FailedPreconditionError("GPU 0: " + cuda_->Describe(r));
    return absl::OkStatus();
  }

  // `bytes` of device memory, every f32 element `value`.
  absl::StatusOr<void*> Allocate(uint64_t bytes, float value) {
    namespace cu = gradlane::client::cu;
    cu::DevicePtr p = 0;
    cu::Result r = cuda_->MemAlloc(&p, bytes);
    if (r != cu::kSuccess)
      return absl::ResourceExhaustedError("cuMemAlloc(" + std::to_string(bytes) +
                                          "): " + cuda_->Describe(r));
    allocations_.push_back(p);
    std::vector<float> host(bytes / 4, value);
    r = cuda_->MemcpyHtoD(p, host.data(), bytes);
    if (r != cu::kSuccess) return absl::InternalError("cuMemcpyHtoD: " + cuda_->Describe(r));
    return reinterpret_cast<void*>(p);
  }

 private:
  const gradlane::client::CudaDriver* cuda_ = nullptr;
  gradlane::client::cu::Device device_{};
  bool context_retained_ = false;
  std::vector<gradlane::client::cu::DevicePtr> allocations_;
};

void Usage() {
  std::fprintf(stderr,
               "usage: gradlane-replay --profile=FILE --socket=PATH --job=ID --rank=R --world=W\n"
               "         [--peers=h:p,...] [--policy=NAME] [--token=T] [--iterations=10]\n"
               "         [--warmup=2] [--csv=FILE] [--priority=index|auto|tic|tac|pace]\n"
               "         [--priority_bandwidth=BITS_PER_S (TAC's and PACE's link, 10e9)]\n"
               "         [--mode=ps|allreduce] [--timeout_ms=30000] [--time_scale=1.0] [--quiet]\n"
               "         [--device=host|cuda]\n"
               "Compute is emulated by sleeping (see the header of tests/bench/replay.cc).\n");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  std::vector<std::string> known = gradlane::testing::JobFlagNames();
  known.insert(known.end(), {"profile", "iterations", "warmup", "csv", "priority",
                             "priority_bandwidth", "time_scale", "seed", "device"});
  if (!f.Parse(argc, argv, known, {"quiet"})) {
    Usage();
    return 2;
  }
  gradlane::testing::JobFlags jf;
  if (!gradlane::testing::ReadJobFlags(f, &jf)) {
    Usage();
    return 2;
  }
  bool ok = true;
  const int64_t iterations = f.Int("iterations", 10, &ok);
  const int64_t warmup = f.Int("warmup", 2, &ok);
  const bool quiet = f.Bool("quiet");
  const std::string priority_mode = f.Str("priority", "index");
  const std::string device = f.Str("device", "host");
  if (device != "host" && device != "cuda") {
    std::fprintf(stderr, "error: --device must be host or cuda\n");
    ok = false;
  }
  double time_scale = 1.0;
  if (f.Has("time_scale")) {
    char* end = nullptr;
    const std::string v = f.Str("time_scale");
    time_scale = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(time_scale > 0)) {
      std::fprintf(stderr, "error: --time_scale must be a positive number\n");
      ok = false;
    }
  }
  const double priority_bandwidth =
      static_cast<double>(f.Int("priority_bandwidth", 10'000'000'000, &ok));
  absl::StatusOr<gradlane::sched::PriorityMode> pmode =
      gradlane::sched::ParsePriorityMode(priority_mode);
  if (!ok || iterations < 1 || warmup < 0 || !f.Has("profile") || !pmode.ok() ||
      !(priority_bandwidth > 0)) {
    if (ok)
      std::fprintf(stderr,
                   "error: need --profile, --iterations >= 1, --warmup >= 0, --priority "
                   "index|auto|tic|tac|pace, --priority_bandwidth > 0\n");
    Usage();
    return 2;
  }

  // ---- profile
  const std::string path = f.Str("profile");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot read profile %s\n", path.c_str());
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<gradlane::sched::ModelProfile> profile =
      gradlane::sched::ParseModelProfile(text.str());
  if (!profile.ok()) {
    std::fprintf(stderr, "error: profile %s: %s\n", path.c_str(),
                 std::string(profile.status().message()).c_str());
    return 2;
  }
  // Computed priorities (tic, tac, pace); empty: layer index, or auto.
  std::vector<gradlane::sched::Priority> computed;
  if (*pmode != gradlane::sched::PriorityMode::kAuto) {
    auto pr = gradlane::sched::ProfileLayerPriorities(*profile, *pmode, priority_bandwidth / 8);
    if (!pr.ok()) {
      std::fprintf(stderr, "error: --priority=%s: %s\n", priority_mode.c_str(),
                   std::string(pr.status().message()).c_str());
      return 2;
    }
    computed = std::move(*pr);
  }
  std::vector<Layer> layers(profile->layers.size());
  uint64_t total_bytes = 0, arena = 8ull << 20;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& pl = profile->layers[i];
    layers[i].name = pl.name;
    layers[i].fwd_ns = static_cast<int64_t>(static_cast<double>(pl.fwd_ns) * time_scale);
    layers[i].ready_ns = static_cast<int64_t>(static_cast<double>(pl.ready_ns) * time_scale);
    layers[i].bytes = (pl.param_bytes + 3) / 4 * 4;
    total_bytes += layers[i].bytes;
    arena += (layers[i].bytes + 4095) / 4096 * 4096 + 4096;
  }
  const int64_t backward_ns =
      static_cast<int64_t>(static_cast<double>(profile->BackwardNs()) * time_scale);
  const int64_t compute_ns =
      static_cast<int64_t>(static_cast<double>(profile->ComputeNs()) * time_scale);
  // Backward order: by ready time, ties in reverse layer order (the last layer is first).
  std::vector<size_t> bwd_order;
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].bytes > 0) bwd_order.push_back(i);
  std::stable_sort(bwd_order.begin(), bwd_order.end(), [&](size_t a, size_t b) {
    if (layers[a].ready_ns != layers[b].ready_ns) return layers[a].ready_ns < layers[b].ready_ns;
    return a > b;
  });

  // ---- daemon
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  gl_client* c = nullptr;
  bool connected = false;
  if (gradlane::testing::ConnectAndRegister(jf, arena, &c, &connected) != GL_OK) return 1;
  DeviceMemory gpu;
  if (device == "cuda") {
    if (absl::Status s = gpu.SetUp(); !s.ok()) {
      std::fprintf(stderr, "error: --device=cuda: %s\n", std::string(s.message()).c_str());
      gl_close(c);
      return 1;
    }
  }
  std::vector<size_t> layer_of_tensor;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].bytes == 0) continue;
    void* buf = nullptr;
    const int32_t prio = *pmode == gradlane::sched::PriorityMode::kAuto ? GL_PRIORITY_AUTO
                         : computed.empty()                             ? static_cast<int32_t>(i)
                                            : static_cast<int32_t>(computed[i]);
    int s;
    if (gpu.active()) {
      absl::StatusOr<void*> dptr = gpu.Allocate(layers[i].bytes, 1.0f / static_cast<float>(i + 1));
      if (!dptr.ok()) {
        std::fprintf(stderr, "error: %s: %s\n", layers[i].name.c_str(),
                     std::string(dptr.status().message()).c_str());
        gl_close(c);
        return 1;
      }
      s = gl_register_device_tensor(c, layers[i].name.c_str(), *dptr, layers[i].bytes, GL_DTYPE_F32,
                                    prio, &layers[i].tensor);
    } else {
      s = gl_register_tensor(c, layers[i].name.c_str(), layers[i].bytes, GL_DTYPE_F32, prio,
                             &layers[i].tensor, &buf);
    }
    if (s != GL_OK) {
      std::fprintf(stderr, "error: gl_register_tensor(%s, %" PRIu64 " bytes): %s (%s)\n",
                   layers[i].name.c_str(), layers[i].bytes, gl_strerror(s), gl_last_error(c));
      gl_close(c);
      return 1;
    }
    if (layers[i].tensor >= layer_of_tensor.size())
      layer_of_tensor.resize(layers[i].tensor + 1, SIZE_MAX);
    layer_of_tensor[layers[i].tensor] = i;
    // A deterministic gradient; the values do not matter to the timing.
    if (buf != nullptr)
      std::fill_n(static_cast<float*>(buf), layers[i].bytes / 4, 1.0f / static_cast<float>(i + 1));
  }
  if (!quiet) {
    std::printf(
        "gradlane-replay: model=%s policy=%s rank=%u/%u layers=%zu tensors=%zu bytes=%" PRIu64
        " compute=%.1fms (fwd %.1f + bwd %.1f) iterations=%" PRId64 " warmup=%" PRId64
        " device=%s\n",
        profile->model.c_str(), jf.policy.empty() ? "(default)" : jf.policy.c_str(), jf.rank,
        jf.world, layers.size(), bwd_order.size(), total_bytes,
        static_cast<double>(compute_ns) / 1e6, static_cast<double>(compute_ns - backward_ns) / 1e6,
        static_cast<double>(backward_ns) / 1e6, iterations, warmup, device.c_str());
    std::fflush(stdout);
  }

  // ---- the loop
  const int64_t total_iters = warmup + iterations;
  const int64_t timeout_ns = int64_t{jf.timeout_ms} * 1'000'000;
  std::vector<int64_t> fwd_start(total_iters + 1), stall(total_iters + 1, 0);
  std::vector<gl_completion> comp(256);
  int rc = 0;
  uint64_t outstanding = 0;
  // Consumes completions; blocks up to `wait_ms` for the first. Returns false on error.
  auto drain = [&](int wait_ms) -> bool {
    uint32_t n = 0;
    const int s = wait_ms > 0
                      ? gl_wait(c, comp.data(), static_cast<uint32_t>(comp.size()), &n, wait_ms)
                      : gl_poll(c, comp.data(), static_cast<uint32_t>(comp.size()), &n);
    if (s == GL_E_TIMEOUT) return true;
    if (s != GL_OK) {
      std::fprintf(stderr, "error: rank %u: waiting for completions: %s (%s)\n", jf.rank,
                   gl_strerror(s), gl_last_error(c));
      return false;
    }
    for (uint32_t k = 0; k < n; ++k) {
      const gl_completion& e = comp[k];
      const size_t li =
          e.tensor_id < layer_of_tensor.size() ? layer_of_tensor[e.tensor_id] : SIZE_MAX;
      if (e.status != GL_OK || li == SIZE_MAX) {
        std::fprintf(stderr,
                     "error: rank %u: completion for tensor %u (%s) iteration %" PRId64
                     ": %s (%s)\n",
                     jf.rank, e.tensor_id, li == SIZE_MAX ? "?" : layers[li].name.c_str(),
                     e.iteration, gl_strerror(e.status), gl_last_error(c));
        return false;
      }
      layers[li].done_iter = std::max(layers[li].done_iter, e.iteration);
      --outstanding;
    }
    return true;
  };

  int64_t prev_end = NowNs();  // when the previous backward's compute was due to end
  for (int64_t k = 0; k <= total_iters && rc == 0; ++k) {
    fwd_start[k] = prev_end;
    // Forward. `t` is when the emulated compute is due to finish; it only moves past the ideal
    // schedule when a wait for a result made us late, so sleep overheads do not add up.
    int64_t t = fwd_start[k];
    for (size_t i = 0; i < layers.size() && rc == 0; ++i) {
      if (k > 0 && layers[i].bytes > 0) {
        if (layers[i].done_iter < k - 1 && !drain(0)) rc = 1;  // catch up without blocking
        const int64_t w0 = NowNs();
        const bool waited = layers[i].done_iter < k - 1;
        while (rc == 0 && layers[i].done_iter < k - 1) {
          if (NowNs() - w0 > timeout_ns) {
            std::fprintf(stderr,
                         "error: rank %u: layer %zu (%s) of iteration %" PRId64
                         " not back after %d ms\n",
                         jf.rank, i, layers[i].name.c_str(), k - 1, jf.timeout_ms);
            rc = 1;
            break;
          }
          if (!drain(100)) rc = 1;
          if (rc) break;
        }
        if (waited) {
          const int64_t w1 = NowNs();
          stall[k] += w1 - w0;
          t = std::max(t, w1);
        }
      }
      if (rc) break;
      t += layers[i].fwd_ns;
      SleepUntil(t);
    }
    if (rc || k == total_iters) break;
    // Backward starts when forward's compute is due to end.
    const int64_t b0 = t;
    for (size_t i : bwd_order) {
      SleepUntil(b0 + layers[i].ready_ns);
      int s;
      const int64_t p0 = NowNs();
      while ((s = gl_post(c, layers[i].tensor, k, 0, GL_WHOLE_TENSOR, i)) == GL_E_AGAIN) {
        if (!drain(1) || NowNs() - p0 > timeout_ns) {
          s = GL_E_TIMEOUT;
          break;
        }
      }
      if (s != GL_OK) {
        std::fprintf(stderr, "error: rank %u: gl_post(%s, iteration %" PRId64 "): %s (%s)\n",
                     jf.rank, layers[i].name.c_str(), k, gl_strerror(s), gl_last_error(c));
        rc = 1;
        break;
      }
      ++outstanding;
      if (!drain(0)) {
        rc = 1;
        break;
      }
    }
    if (rc) break;
    prev_end = b0 + backward_ns;
    SleepUntil(prev_end);
  }
  // Let the last results land so the peers' daemons are not left with a half-finished
  // iteration (bounded).
  const int64_t d0 = NowNs();
  while (rc == 0 && outstanding > 0 && NowNs() - d0 < timeout_ns) {
    if (!drain(100)) rc = 1;
  }
  gl_close(c);
  if (rc) return rc;

  // ---- report
  std::FILE* csv = nullptr;
  if (f.Has("csv")) {
    csv = std::fopen(f.Str("csv").c_str(), "w");
    if (!csv) {
      std::fprintf(stderr, "error: cannot write %s\n", f.Str("csv").c_str());
      return 1;
    }
    std::fprintf(csv, "iteration,time_ms,stall_ms,warmup,start_ns\n");
  }
  double sum = 0, mn = 1e300, mx = 0;
  for (int64_t k = 0; k < total_iters; ++k) {
    const double ms = static_cast<double>(fwd_start[k + 1] - fwd_start[k]) / 1e6;
    const double st = static_cast<double>(stall[k]) / 1e6;
    const bool wu = k < warmup;
    if (!wu) {
      sum += ms;
      mn = std::min(mn, ms);
      mx = std::max(mx, ms);
    }
    if (!quiet) {
      std::printf("iteration %" PRId64 "%s: %.2f ms (waiting for results %.2f ms)\n", k,
                  wu ? " (warm-up)" : "", ms, st);
    }
    if (csv) {
      std::fprintf(csv, "%" PRId64 ",%.3f,%.3f,%d,%" PRId64 "\n", k, ms, st, wu ? 1 : 0,
                   fwd_start[k]);
    }
  }
  if (csv) std::fclose(csv);
  std::printf("gradlane-replay: model=%s policy=%s rank=%u mean %.2f ms over %" PRId64
              " iterations (min %.2f, max %.2f); compute alone %.2f ms\n",
              profile->model.c_str(), jf.policy.empty() ? "(default)" : jf.policy.c_str(), jf.rank,
              sum / static_cast<double>(iterations), iterations, mn, mx,
              static_cast<double>(compute_ns) / 1e6);
  return 0;
}
