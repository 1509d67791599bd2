// The engine end to end with the fake transport: W engines in one process (driven by one
// thread, as the fake requires), real libgradlane clients on their own threads talking to each
// engine over its Unix socket and shared memory. Results are compared bit for bit with a
// reference reduction computed here (rank order, f16/bf16 widened to f32 and rounded once).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/ps/half.h"
#include "libclient/cuda_driver.h"
#include "libclient/gradlane.h"
#include "libclient/gradlane_testing.h"
#include "sched/policies/gradlane_selector.h"
#include "shm/uds.h"
#include "tests/fakes/fake_cuda_counts.h"
#include "tests/fakes/fake_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/verbs/registration_cache.h"

namespace gradlane::daemon {
namespace {

using transport::fake::FakeNetwork;
using transport::fake::FakeTransport;
using FakeEngine = Engine;  // over FakeTransport
using Clock = std::chrono::steady_clock;

constexpr uint64_t kPartition = 4096;

std::string Addr(int i) { return absl::StrCat("h", i, ":1"); }

// A MemoryRegistrar as the verbs backend's (counted pins of ranges), recording on which threads
// it was called; `refuse` makes Pin fail as a device over RLIMIT_MEMLOCK does.
class TestRegistrar final : public transport::MemoryRegistrar {
 public:
  absl::Status Pin(void* base, uint64_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    if (refuse_) {
      return absl::UnavailableError(
          transport::verbs::RegistrationErrorText(bytes, ENOMEM, uint64_t{65536}));
    }
    ++pins_;
    ++pinned_[{base, bytes}];
    threads_.push_back(std::this_thread::get_id());
    return absl::OkStatus();
  }
  void Unpin(void* base, uint64_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pinned_.find({base, bytes});
    EXPECT_NE(it, pinned_.end()) << "unpinned a range that is not pinned";
    if (it != pinned_.end() && --it->second == 0) pinned_.erase(it);
    ++unpins_;
    threads_.push_back(std::this_thread::get_id());
  }
  bool Pinned(void* base, uint64_t bytes) {
    std::lock_guard<std::mutex> l(mu_);
    return pinned_.contains({base, bytes});
  }
  void set_refuse(bool refuse) {
    std::lock_guard<std::mutex> l(mu_);
    refuse_ = refuse;
  }
  int pins() {
    std::lock_guard<std::mutex> l(mu_);
    return pins_;
  }
  int unpins() {
    std::lock_guard<std::mutex> l(mu_);
    return unpins_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> l(mu_);
    return threads_;
  }

 private:
  std::mutex mu_;
  bool refuse_ = false;
  int pins_ = 0, unpins_ = 0;
  std::map<std::pair<void*, uint64_t>, int> pinned_;
  std::vector<std::thread::id> threads_;
};

// A transport that hands out `registrar` and counts, on the engine thread, which regions it was
// asked to register were pinned already (a lookup for verbs) and which not (device work there).
class RegisteringTransport final : public transport::Transport {
 public:
  RegisteringTransport(std::unique_ptr<transport::Transport> inner, TestRegistrar* registrar)
      : inner_(std::move(inner)), registrar_(registrar) {}
  transport::TransportCapabilities capabilities() const override { return inner_->capabilities(); }
  std::string_view backend_name() const override { return inner_->backend_name(); }
  absl::StatusOr<uint16_t> Listen_st() override { return inner_->Listen_st(); }
  absl::Status AddJob_st(const transport::JobCredentials& job) override {
    return inner_->AddJob_st(job);
  }
  absl::Status RemoveJob_st(uint64_t job_id) override { return inner_->RemoveJob_st(job_id); }
  absl::StatusOr<transport::PeerHandle> Connect_st(const transport::JobCredentials& job,
                                                   std::string_view address,
                                                   sched::TimeNs now) override {
    return inner_->Connect_st(job, address, now);
  }
  void Disconnect_st(transport::PeerHandle peer, sched::TimeNs now) override {
    inner_->Disconnect_st(peer, now);
  }
  absl::StatusOr<transport::RegionId> RegisterRegion_st(void* base, uint64_t bytes) override {
    engine_thread_ = std::this_thread::get_id();
    if (bytes > 0) ++(registrar_->Pinned(base, bytes) ? found_ : registered_);
    return inner_->RegisterRegion_st(base, bytes);
  }
  absl::Status UnregisterRegion_st(transport::RegionId region) override {
    return inner_->UnregisterRegion_st(region);
  }
  absl::Status PostSend_st(transport::PeerHandle peer, const transport::SendSpec& spec) override {
    return inner_->PostSend_st(peer, spec);
  }
  int Progress_st(sched::TimeNs now, int wait_ms) override {
    return inner_->Progress_st(now, wait_ms);
  }
  bool HasDeferredWork_st() const override { return inner_->HasDeferredWork_st(); }
  transport::TransportStats Stats() const override { return inner_->Stats(); }
  transport::PeerStats PeerStatsOf(transport::PeerHandle peer) const override {
    return inner_->PeerStatsOf(peer);
  }
  transport::MemoryRegistrar* registrar() override { return registrar_; }

  std::atomic<int> found_{0}, registered_{0};
  std::atomic<std::thread::id> engine_thread_{};

 private:
  std::unique_ptr<transport::Transport> inner_;
  TestRegistrar* registrar_;
};

// W engines on one FakeNetwork, polled by one driver thread.
class Cluster {
 public:
  // `tweak` adjusts engine i's options (daemons configured differently).
  // With `registrar`, every engine's transport hands it out (RegisteringTransport).
  Cluster(int n, EngineOptions base, const std::string& tag,
          std::function<void(int, EngineOptions&)> tweak = nullptr,
          TestRegistrar* registrar = nullptr)
      : base_(std::move(base)), tag_(tag), tweak_(std::move(tweak)), registrar_(registrar) {
    for (int i = 0; i < n; ++i) AddEngine(i);
    driver_ = std::thread([this] { Loop(); });
  }
  ~Cluster() {
    stop_.store(true);
    driver_.join();
    engines_.clear();
  }

  // Receive targets that ask for pieces get them `bytes` at a time (FakeNetwork::set_piece_bytes).
  void SetPieceBytes(uint32_t bytes) {
    OnDriver([&] { net_.set_piece_bytes(bytes); });
  }
  // Every data frame's header passes through `tamper` (a hostile but authenticated peer).
  void TamperFrames(std::function<void(transport::FrameHeader&)> tamper) {
    OnDriver([&] { net_.set_tamper(std::move(tamper)); });
  }
  const std::string& socket(int i) const { return sockets_[i]; }
  EngineStats Stats(int i) const { return engines_[i]->Stats(); }
  RegisteringTransport* registering(int i) const { return registering_[i]; }
  // Engine i's fake transport (the driver thread's: read it through OnDriver).
  FakeTransport* fake(int i) const { return fakes_[i]; }

  // Runs `fn` on the driver thread (the only thread that may touch engines and the network).
  void OnDriver(std::function<void()> fn) {
    std::promise<void> done;
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back([&] {
        fn();
        done.set_value();
      });
    }
    done.get_future().wait();
  }
  // kill -9 of daemon i: it vanishes from the network and is never polled again.
  void Kill(int i, bool silent) {
    OnDriver([&] {
      net_.Kill(Addr(i), silent);
      alive_[i] = false;
    });
  }
  // A fresh daemon at the same address (a restart), with a new client socket.
  void Restart(int i) {
    OnDriver([&] {
      engines_[i].reset();  // the killed endpoint leaves the network with it
      AddEngine(i);
    });
  }
  void ShutdownEngine(int i) {
    OnDriver([&] { engines_[i]->Shutdown_st(); });
  }

  // Waits (up to `timeout`) until pred(stats of engine i) holds.
  bool WaitFor(int i, const std::function<bool(const EngineStats&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (pred(Stats(i))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return pred(Stats(i));
  }

 private:
  void AddEngine(int i) {
    EngineOptions o = base_;
    if (tweak_) tweak_(i, o);
    o.sessions.socket_path = absl::StrCat("/tmp/gl-engine-test-", ::getpid(), "-", tag_, "-", i,
                                          "-", generation_++, ".sock");
    o.transport.listen_address = absl::StrCat("h", i);
    o.transport.listen_port = 1;
    if (static_cast<int>(engines_.size()) <= i) {
      engines_.resize(i + 1);
      sockets_.resize(i + 1);
      alive_.resize(i + 1, true);
      registering_.resize(i + 1);
      fakes_.resize(i + 1);
    }
    auto e = FakeEngine::Create(
        o,
        [this, i](const transport::TransportOptions& to, transport::TransportHandler* h)
            -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
          auto t = FakeTransport::Create(to, h, &net_);
          if (!t.ok()) return t.status();
          fakes_[i] = t->get();
          if (registrar_ == nullptr) return std::unique_ptr<transport::Transport>(std::move(*t));
          auto r = std::make_unique<RegisteringTransport>(std::move(*t), registrar_);
          registering_[i] = r.get();
          return std::unique_ptr<transport::Transport>(std::move(r));
        });
    EXPECT_TRUE(e.ok()) << e.status();
    engines_[i] = std::move(*e);
    sockets_[i] = o.sessions.socket_path;
    alive_[i] = true;
  }

  void Loop() {
    while (!stop_.load()) {
      std::deque<std::function<void()>> q;
      {
        std::lock_guard<std::mutex> l(mu_);
        q.swap(queue_);
      }
      for (auto& f : q) f();
      const sched::TimeNs now = SessionServer::MonotonicNow();
      int work = 0;
      for (size_t i = 0; i < engines_.size(); ++i) {
        if (alive_[i] && engines_[i] != nullptr) work += engines_[i]->PollOnce_st(now);
      }
      if (work == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  EngineOptions base_;
  std::string tag_;
  std::function<void(int, EngineOptions&)> tweak_;
  int generation_ = 0;
  TestRegistrar* registrar_;
  FakeNetwork net_;
  std::vector<std::unique_ptr<FakeEngine>> engines_;
  std::vector<RegisteringTransport*> registering_;
  std::vector<FakeTransport*> fakes_;
  std::vector<std::string> sockets_;
  std::vector<bool> alive_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  std::thread driver_;
};

struct TensorDef {
  std::string name;
  uint64_t bytes;
  gl_dtype dtype;
  int32_t priority;
};

// Awkward sizes in every dtype: one element, one element past a partition boundary, a count
// that is not a multiple of any vector width, several partitions; mixed given/auto priorities.
std::vector<TensorDef> AwkwardTensors() {
  return {
      {"f32_one", 4, GL_DTYPE_F32, 3},
      {"f16_one", 2, GL_DTYPE_F16, GL_PRIORITY_AUTO},
      {"bf16_one", 2, GL_DTYPE_BF16, 0},
      {"f32_past_boundary", kPartition + 4, GL_DTYPE_F32, 1},
      {"f16_past_boundary", kPartition + 2, GL_DTYPE_F16, 2},
      {"bf16_past_boundary", kPartition + 2, GL_DTYPE_BF16, GL_PRIORITY_AUTO},
      {"f32_odd", 37 * 4, GL_DTYPE_F32, 5},
      {"f16_odd", 37 * 2, GL_DTYPE_F16, 4},
      {"bf16_odd", 1001 * 2, GL_DTYPE_BF16, 6},
      {"f32_multi", 3 * kPartition + 12, GL_DTYPE_F32, GL_PRIORITY_AUTO},
  };
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A seed with this bit asks for small whole numbers instead: their sums are exact in every dtype
// and every order, for tests whose chunking (fusion) the reference cannot know.
constexpr uint64_t kIntegerValues = 1ull << 63;

// A value whose magnitude varies over decades, so the order of additions shows in the bits.
float Value(uint64_t seed, int rank, int64_t iter, size_t tensor, size_t i) {
  const uint64_t h =
      SplitMix(seed ^ SplitMix(rank * 1000003ull + iter * 7919ull + tensor * 131ull + i));
  if ((seed & kIntegerValues) != 0) return static_cast<float>(static_cast<int>(h % 17) - 8);
  const double unit = static_cast<double>(h >> 11) / static_cast<double>(1ull << 53) * 2 - 1;
  const int exp = static_cast<int>((h >> 3) % 12) - 6;
  return static_cast<float>(unit * std::ldexp(1.0, exp));
}

void Fill(const TensorDef& t, void* buf, uint64_t seed, int rank, int64_t iter, size_t ti) {
  const size_t elem = t.dtype == GL_DTYPE_F32 ? 4 : 2;
  for (size_t i = 0; i < t.bytes / elem; ++i) {
    const float v = Value(seed, rank, iter, ti, i);
    if (t.dtype == GL_DTYPE_F32) {
      std::memcpy(static_cast<char*>(buf) + 4 * i, &v, 4);
    } else {
      const uint16_t h = t.dtype == GL_DTYPE_F16 ? ps::F32ToF16(v) : ps::F32ToBf16(v);
      std::memcpy(static_cast<char*>(buf) + 2 * i, &h, 2);
    }
  }
}

// Element i of a buffer of `dtype`, rounded once from f32.
void StoreElement(gl_dtype dtype, float v, uint8_t* out, size_t i) {
  if (dtype == GL_DTYPE_F32) {
    std::memcpy(out + 4 * i, &v, 4);
  } else {
    const uint16_t h = dtype == GL_DTYPE_F16 ? ps::F32ToF16(v) : ps::F32ToBf16(v);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// The reduction as the contract defines it, computed independently of the daemon.
std::vector<uint8_t> Reference(const TensorDef& t, uint64_t seed, int world, int64_t iter,
                               size_t ti, bool mean) {
  const size_t elem = t.dtype == GL_DTYPE_F32 ? 4 : 2;
  std::vector<uint8_t> out(t.bytes);
  for (size_t i = 0; i < t.bytes / elem; ++i) {
    float acc = 0;
    for (int r = 0; r < world; ++r) {
      float v = Value(seed, r, iter, ti, i);
      if (t.dtype == GL_DTYPE_F16) v = ps::F16ToF32(ps::F32ToF16(v));
      if (t.dtype == GL_DTYPE_BF16) v = ps::Bf16ToF32(ps::F32ToBf16(v));
      acc = r == 0 ? v : acc + v;
    }
    if (mean) acc = acc / static_cast<float>(world);
    StoreElement(t.dtype, acc, out.data(), i);
  }
  return out;
}

struct JobSpec {
  std::string job_id;
  int world = 3;
  std::string policy;
  std::string token = "secret";
  std::vector<TensorDef> tensors;
  uint64_t seed = 1;
  std::vector<std::string> peers;  // empty: the fake addresses h0:1, h1:1, ...
  gl_job_mode mode = GL_MODE_PS;
};

float Rounded(gl_dtype dt, float v) {
  if (dt == GL_DTYPE_F16) return ps::F16ToF32(ps::F32ToF16(v));
  if (dt == GL_DTYPE_BF16) return ps::Bf16ToF32(ps::F32ToBf16(v));
  return v;
}

// The ring all-reduce's order (daemon/ring_role.h), computed independently of the daemon: an
// element in chunk c of its partition is summed c, c+1, ..., c+W-1, each partial sum rounded to
// the dtype (it travels in it), the last addition divided by W for a mean. The daemons run
// TestOptions (partitions of kPartition bytes) and the job names its policy.
std::vector<uint8_t> RingReference(const JobSpec& job, int64_t iter, size_t ti, bool mean) {
  const TensorDef& t = job.tensors[ti];
  const size_t elem = t.dtype == GL_DTYPE_F32 ? 4 : 2;
  const auto dtype = static_cast<sched::DType>(t.dtype);
  const sched::PartitionPlan plan = sched::PartitionPlan::Make(
      t.bytes, dtype, EnginePartitionBytes(job.policy, kPartition, dtype));
  const uint64_t part_elems = plan.partition_bytes() / elem;
  const uint64_t w = static_cast<uint64_t>(job.world);
  std::vector<uint8_t> out(t.bytes);
  for (uint64_t i = 0; i < t.bytes / elem; ++i) {
    const uint64_t k = i / part_elems;
    const uint64_t n = std::min(part_elems, t.bytes / elem - k * part_elems);
    const uint64_t e = i - k * part_elems;
    uint64_t c = 0;
    while ((c + 1) * n / w <= e) ++c;
    float acc = 0;
    for (uint64_t j = 0; j < w; ++j) {
      const int r = static_cast<int>((c + j) % w);
      const float v = Rounded(t.dtype, Value(job.seed, r, iter, ti, i));
      if (j == 0) {
        acc = v;
      } else if (j + 1 < w) {
        acc = Rounded(t.dtype, acc + v);
      } else {
        acc = acc + v;
        if (mean) acc = acc / static_cast<float>(w);
      }
    }
    StoreElement(t.dtype, acc, out.data(), i);
  }
  return out;
}

// Registers `job` for `rank` on `c` (peers: the job's, or the fake addresses h0:1, h1:1, ...).
int RegisterJobFor(gl_client* c, const JobSpec& job, int rank, const std::string& token) {
  std::vector<std::string> peers;
  for (int r = 0; r < job.world; ++r) {
    peers.push_back(job.peers.empty() ? Addr(r) : job.peers[r]);
  }
  std::vector<const char*> pp;
  for (auto& p : peers) pp.push_back(p.c_str());
  gl_job_info info{};
  info.job_id = job.job_id.c_str();
  info.rank = rank;
  info.world_size = job.world;
  info.peers = pp.data();
  info.num_peers = job.world;
  info.policy = job.policy.empty() ? nullptr : job.policy.c_str();
  info.auth_token = token.c_str();
  return gl_register_job_mode(c, &info, job.mode);
}

// One rank's client.
class RankClient {
 public:
  ~RankClient() { Close(); }
  void Close() {
    if (c_ != nullptr) gl_close(c_);
    c_ = nullptr;
  }

  int Setup(const std::string& socket, const JobSpec& job, int rank,
            const std::string& token_override = "") {
    gl_connect_options o{};
    o.socket_path = socket.c_str();
    uint64_t tensor_bytes = 0;
    for (const TensorDef& t : job.tensors) tensor_bytes += t.bytes;
    o.arena_bytes = (4 << 20) + 2 * tensor_bytes;  // room for alignment between tensors
    o.timeout_ms = 10000;
    int s = gl_connect(&o, &c_);
    if (s != GL_OK) return s;
    s = RegisterJobFor(c_, job, rank, token_override.empty() ? job.token : token_override);
    if (s != GL_OK) return s;
    for (const TensorDef& t : job.tensors) {
      uint32_t id = 0;
      void* buf = nullptr;
      s = gl_register_tensor(c_, t.name.c_str(), t.bytes, t.dtype, t.priority, &id, &buf);
      if (s != GL_OK) return s;
      ids_.push_back(id);
      bufs_.push_back(buf);
    }
    return GL_OK;
  }

  // Fills and posts tensors [first, last) of `iter`; the last multi-partition tensor is posted
  // in two ranges split inside a partition. Returns the number of posts made.
  int Post(const JobSpec& job, int rank, int64_t iter, size_t first, size_t last) {
    int posts = 0;
    for (size_t ti = first; ti < last; ++ti) {
      const TensorDef& t = job.tensors[ti];
      Fill(t, bufs_[ti], job.seed, rank, iter, ti);
      const uint64_t elem = t.dtype == GL_DTYPE_F32 ? 4 : 2;
      if (t.bytes >= 2 * kPartition) {
        const uint64_t half = (t.bytes / elem / 2) * elem + elem;  // not partition-aligned
        EXPECT_EQ(gl_post(c_, ids_[ti], iter, 0, half, ti), GL_OK);
        EXPECT_EQ(gl_post(c_, ids_[ti], iter, half, GL_WHOLE_TENSOR, ti), GL_OK);
        posts += 2;
      } else {
        EXPECT_EQ(gl_post(c_, ids_[ti], iter, 0, GL_WHOLE_TENSOR, ti), GL_OK);
        posts += 1;
      }
    }
    return posts;
  }

  // Fills tensor `ti` with this rank's values of `iter` and posts bytes [offset, offset+length).
  int PostRange(const JobSpec& job, int rank, int64_t iter, size_t ti, uint64_t offset,
                uint64_t length) {
    Fill(job.tensors[ti], bufs_[ti], job.seed, rank, iter, ti);
    return gl_post(c_, ids_[ti], iter, offset, length, ti);
  }
  bool ResultIsExact(const JobSpec& job, int64_t iter, size_t ti, bool mean) const {
    const auto want = job.mode == GL_MODE_ALLREDUCE && (job.seed & kIntegerValues) == 0
                          ? RingReference(job, iter, ti, mean)
                          : Reference(job.tensors[ti], job.seed, job.world, iter, ti, mean);
    return std::memcmp(want.data(), bufs_[ti], job.tensors[ti].bytes) == 0;
  }

  // Waits for `n` completions; returns their statuses (fewer if the timeout passed).
  std::vector<int> Wait(int n, int timeout_ms = 15000) {
    std::vector<int> statuses;
    const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (static_cast<int>(statuses.size()) < n && Clock::now() < end) {
      gl_completion cs[64];
      uint32_t count = 0;
      const int s = gl_wait(c_, cs, 64, &count, 100);
      if (s == GL_E_DISCONNECTED) break;
      for (uint32_t k = 0; k < count; ++k) statuses.push_back(cs[k].status);
    }
    return statuses;
  }

  // One iteration of every tensor; checks each result bit for bit.
  bool Iterate(const JobSpec& job, int rank, int64_t iter, bool mean) {
    const int n = Post(job, rank, iter, 0, job.tensors.size());
    const std::vector<int> st = Wait(n);
    EXPECT_EQ(static_cast<int>(st.size()), n) << "rank " << rank << " iteration " << iter;
    bool ok = static_cast<int>(st.size()) == n;
    for (int s : st) {
      EXPECT_EQ(s, GL_OK) << gl_strerror(s) << " rank " << rank << " iteration " << iter;
      ok = ok && s == GL_OK;
    }
    if (!ok) return false;
    for (size_t ti = 0; ti < job.tensors.size(); ++ti) {
      const TensorDef& t = job.tensors[ti];
      const auto want = job.mode == GL_MODE_ALLREDUCE && (job.seed & kIntegerValues) == 0
                            ? RingReference(job, iter, ti, mean)
                            : Reference(t, job.seed, job.world, iter, ti, mean);
      if (std::memcmp(want.data(), bufs_[ti], t.bytes) != 0) {
        ADD_FAILURE() << "rank " << rank << " iteration " << iter << " tensor " << t.name
                      << ": result differs from the rank-ordered reference";
        ok = false;
      }
    }
    return ok;
  }

  gl_client* c() { return c_; }

 private:
  gl_client* c_ = nullptr;
  std::vector<uint32_t> ids_;
  std::vector<void*> bufs_;
};

EngineOptions TestOptions(const std::string& policy = "bytescheduler") {
  EngineOptions o;
  o.default_policy = policy;
  o.partition_bytes = kPartition;
  o.transport.peer_timeout = 1 * sched::kSecond;
  o.transport.connect_deadline = 10 * sched::kSecond;
  o.sessions.control_interval = sched::kMillisecond;
  return o;
}

// Runs `iterations` of `job` on the cluster, one client thread per rank.
template <class C>
void RunJob(C& cluster, const JobSpec& job, int iterations, bool mean) {
  std::vector<std::thread> threads;
  for (int r = 0; r < job.world; ++r) {
    threads.emplace_back([&, r] {
      RankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r), GL_OK);
      for (int64_t it = 0; it < iterations; ++it) {
        if (!c.Iterate(job, r, it, mean)) break;
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Every rank posts iteration 0 of every tensor once, from its own client thread, and collects
// as many completion statuses as it posted (in arrival order). `wrong_token_rank` (if >= 0)
// registers with `wrong_token` instead of the job's.
template <class C>
std::vector<std::vector<int>> PostOneIterationPerRank(C& cluster, const JobSpec& job,
                                                      int wrong_token_rank = -1,
                                                      const std::string& wrong_token = "") {
  std::vector<std::vector<int>> statuses(job.world);
  std::vector<std::thread> threads;
  for (int r = 0; r < job.world; ++r) {
    threads.emplace_back([&, r] {
      RankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r, r == wrong_token_rank ? wrong_token : ""),
                GL_OK);
      const int n = c.Post(job, r, 0, 0, job.tensors.size());
      statuses[r] = c.Wait(n);
      EXPECT_EQ(static_cast<int>(statuses[r].size()), n) << "rank " << r;
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

TEST(EngineTest, APushWhoseKeyNamesAnotherPartitionIsRejected) {
  // Frames are placed by offset, so a key whose partition bits disagree with the offset (here
  // partition 5 of a one-partition tensor) must be refused, not reduced into partition 0.
  Cluster cluster(2, TestOptions(), "keypart");
  cluster.TamperFrames([](transport::FrameHeader& h) {
    if (h.direction == static_cast<uint8_t>(sched::Direction::kPush) &&
        sched::KeyTensor(h.key) == 0) {
      h.key = sched::MakeKey(0, 5);
    }
  });
  JobSpec job{"keypart", 2, "bytescheduler", "secret", {{"one", 64, GL_DTYPE_F32, 0}}, 31};
  const std::vector<std::vector<int>> st = PostOneIterationPerRank(cluster, job);
  for (int r = 0; r < 2; ++r) {
    for (int s : st[r]) EXPECT_NE(s, GL_OK) << "rank " << r;
  }
  EXPECT_GT(cluster.Stats(0).segments_rejected + cluster.Stats(1).segments_rejected, 0u);
}

TEST(EngineTest, FifoTensorsBeyondOneEnginePartitionAreExact) {
  // fifo sends whole tensors, but the engine cuts every tensor into parts of at most
  // kMaxEnginePartitionBytes, each a shard key of its own; a segment past the first part must
  // travel under its part's key, which the receiver checks against the offset, not under the
  // policy's one-partition key (vgg16's 400 MB tensor failed every fifo job this way).
  Cluster cluster(2, TestOptions("fifo"), "fifobig");
  JobSpec job{"fifobig",
              2,
              "fifo",
              "secret",
              {{"big", kMaxEnginePartitionBytes + 4096, GL_DTYPE_F32, 0},
               {"small", 4096, GL_DTYPE_F32, 1}},
              7};
  RunJob(cluster, job, 2, /*mean=*/false);
  for (int i = 0; i < 2; ++i) {
    const EngineStats s = cluster.Stats(i);
    EXPECT_EQ(s.jobs_failed, 0u) << "daemon " << i;
    EXPECT_EQ(s.segments_rejected, 0u) << "daemon " << i;
    EXPECT_GT(s.rounds_reduced, 0u) << "daemon " << i;
  }
}

TEST(EngineTest, BalancedKeysOnlyWhereThePolicyPartitionsLeaveShardsUnevenOrTensorsUnspread) {
  std::vector<TensorInfo> one_tensor(1);
  one_tensor[0].bytes = 3ull << 20;  // one 4 MiB key: a single shard would carry all of it
  JobPlan plan;
  plan.world = 3;
  plan.policy_name = "gradlane";
  EXPECT_EQ(BalancedKeyBytes(one_tensor, plan, 0), 1ull << 20);  // three keys of 1 MiB
  plan.policy_name = "bytescheduler";
  EXPECT_EQ(BalancedKeyBytes(one_tensor, plan, 0), 1ull << 20);
  // Not for fifo (whole tensors by definition), a configured size, W = 1, or all-reduce.
  plan.policy_name = "fifo";
  EXPECT_EQ(BalancedKeyBytes(one_tensor, plan, 0), 0u);
  plan.policy_name = "gradlane";
  EXPECT_EQ(BalancedKeyBytes(one_tensor, plan, 4ull << 20), 0u);
  plan.mode = GL_MODE_ALLREDUCE;
  EXPECT_EQ(BalancedKeyBytes(one_tensor, plan, 0), 0u);
  plan.mode = GL_MODE_PS;
  plan.world = 1;
  EXPECT_EQ(BalancedKeyBytes(one_tensor, plan, 0), 0u);
  // Already even and spread at the policy's size (every tensor three keys or more): 0, the
  // policy's partitions are kept.
  std::vector<TensorInfo> even(6);
  for (TensorInfo& t : even) t.bytes = 12ull << 20;
  plan.world = 3;
  EXPECT_EQ(BalancedKeyBytes(even, plan, 0), 0u);
  // Even but unspread (each 4 MiB tensor one key, pushed into one shard's downlink): cut until
  // every tensor crosses every shard, 1 MiB (four keys each).
  std::vector<TensorInfo> unspread(6);
  for (TensorInfo& t : unspread) t.bytes = 4ull << 20;
  EXPECT_EQ(BalancedKeyBytes(unspread, plan, 0), 1ull << 20);
  // The fingerprint changes only where the keys did.
  EXPECT_EQ(Fingerprint(even, 3, "gradlane", 0, ps::ReduceOp::kSum),
            Fingerprint(even, 3, "gradlane", 0, ps::ReduceOp::kSum, GL_MODE_PS, 0, 0));
  EXPECT_NE(Fingerprint(one_tensor, 3, "gradlane", 0, ps::ReduceOp::kSum),
            Fingerprint(one_tensor, 3, "gradlane", 0, ps::ReduceOp::kSum, GL_MODE_PS, 0,
                        1ull << 20));
}

// With the policies' own 4 MiB partitions a 3 MiB tensor is one key, reduced by one daemon
// while the other two only push and pull; the balance rule cuts it into three 1 MiB keys, one per
// shard, and the result stays bit-exact.
class BalancedKeysTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BalancedKeysTest, ASmallModelIsReducedByEveryShardBitExact) {
  EngineOptions options = TestOptions(GetParam());
  options.partition_bytes = 0;  // the policy's defaults: the balance rule applies
  Cluster cluster(3, options, "bal-" + GetParam());
  constexpr int kIterations = 3;
  JobSpec job{
      "bal-" + GetParam(), 3, GetParam(), "secret", {{"w", 3ull << 20, GL_DTYPE_F32, 0}}, 9};
  RunJob(cluster, job, kIterations, /*mean=*/false);
  for (int i = 0; i < 3; ++i) {
    const EngineStats s = cluster.Stats(i);
    EXPECT_EQ(s.jobs_failed, 0u) << "daemon " << i;
    EXPECT_EQ(s.segments_rejected, 0u) << "daemon " << i;
    // One 1 MiB key per shard and iteration.
    EXPECT_EQ(s.rounds_reduced, static_cast<uint64_t>(kIterations)) << "daemon " << i;
  }
}

// p3's 50,000-element slices are already fine enough to spread (unevenly: 16 keys on 3 shards).
INSTANTIATE_TEST_SUITE_P(PoliciesWithPartitions, BalancedKeysTest,
                         ::testing::Values("bytescheduler", "prophet", "gradlane"));

class PolicyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PolicyTest, ThreeRanksEveryDtypeAwkwardSizesBitExact) {
  Cluster cluster(3, TestOptions(), "pol-" + GetParam());
  JobSpec job{"job-" + GetParam(), 3, GetParam(), "secret", AwkwardTensors(), 42};
  RunJob(cluster, job, 4, /*mean=*/false);
  for (int i = 0; i < 3; ++i) {
    const EngineStats s = cluster.Stats(i);
    EXPECT_EQ(s.jobs_failed, 0u);
    EXPECT_GT(s.rounds_reduced, 0u);
    EXPECT_GT(s.segments_sent, 0u);
    EXPECT_EQ(s.segments_rejected, 0u);
  }
  // The clients closed: every job and arena mapping is released.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(cluster.WaitFor(i, [](const EngineStats& s) {
      return s.jobs_active == 0 && s.arena_aliases == 0;
    }));
  }
}

// gradlane's choice among schedules is made by rank 0 and travels in the data frames' flags
// (sched/policies/gradlane_selector.h): over a job long enough for every trial, rank 0's frames
// name several schedules, and once it has chosen, every rank's frames carry its decision,
// in parameter-server and all-reduce mode, with bit-exact results throughout.
class ScheduleAgreementTest : public ::testing::TestWithParam<gl_job_mode> {};

TEST_P(ScheduleAgreementTest, EveryRankRunsRankZerosChoice) {
  const bool ring = GetParam() == GL_MODE_ALLREDUCE;
  const std::string tag = ring ? "agree-ar" : "agree-ps";
  // Declared before the cluster: its threads stamp frames until it is destroyed.
  std::mutex mu;
  std::map<int64_t, std::set<std::pair<uint16_t, uint8_t>>> seen;  // iteration → (rank, byte)
  Cluster cluster(3, TestOptions("gradlane"), tag);
  cluster.TamperFrames([&](transport::FrameHeader& h) {
    std::lock_guard<std::mutex> l(mu);
    seen[h.iteration].insert(
        {h.sender_rank, static_cast<uint8_t>(h.flags >> transport::kFlagScheduleShift)});
  });
  JobSpec job{tag,
              3,
              "gradlane",
              "secret",
              {{"a", 300 << 10, GL_DTYPE_F32, 0}, {"b", 70000, GL_DTYPE_BF16, 1}},
              5};
  job.mode = GetParam();
  // One warm-up iteration, three for each of eight candidates, then from 25 on the choice or a
  // runoff of those too close to call: either way one decision that every rank runs.
  constexpr int kIterations = 29;
  RunJob(cluster, job, kIterations, /*mean=*/false);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u) << "daemon " << i;
  std::lock_guard<std::mutex> l(mu);
  // Frames that no policy sent (manifests, leave) carry 0, as does a follower's before it has
  // heard rank 0.
  std::set<uint8_t> leader_bytes;
  for (const auto& [it, stamps] : seen) {
    for (const auto& [rank, byte] : stamps) {
      if (rank == 0 && byte != 0) leader_bytes.insert(byte);
    }
  }
  EXPECT_GE(leader_bytes.size(), std::size(sched::kGradlaneCandidates))
      << "rank 0 tried every candidate";
  for (int64_t it = kIterations - 2; it < kIterations; ++it) {
    std::set<uint8_t> bytes;
    std::set<uint16_t> ranks;
    for (const auto& [rank, byte] : seen[it]) {
      if (byte == 0) continue;
      bytes.insert(byte);
      ranks.insert(rank);
    }
    EXPECT_EQ(bytes.size(), 1u) << "iteration " << it << ": ranks disagree";
    EXPECT_EQ(ranks.size(), 3u) << "iteration " << it << ": a rank sent no decision";
  }
}

// The followers run what rank 0's frames say, not a choice of their own: every frame of rank 0
// is made to name fifo (candidate 3, one epoch on), and every other rank's frames must relay
// exactly that from their first decision on, over a job long enough for a round of trials of
// their own (a rank that decided for itself would stamp its trials' epochs and candidates).
TEST_P(ScheduleAgreementTest, FollowersRelayWhatRankZeroSays) {
  const bool ring = GetParam() == GL_MODE_ALLREDUCE;
  const std::string tag = ring ? "follow-ar" : "follow-ps";
  const uint8_t fifo = sched::kDecisionValid | 1 << sched::kEpochShift | 3;
  ASSERT_EQ(sched::kGradlaneCandidates[3], "fifo");
  // Declared before the cluster: its threads stamp frames until it is destroyed.
  std::mutex mu;
  std::map<uint16_t, std::set<uint8_t>> stamped;  // by sender rank
  Cluster cluster(3, TestOptions("gradlane"), tag);
  cluster.TamperFrames([&](transport::FrameHeader& h) {
    if (h.type != static_cast<uint8_t>(transport::FrameType::kData)) return;
    const uint8_t byte = static_cast<uint8_t>(h.flags >> transport::kFlagScheduleShift);
    if (h.sender_rank == 0 && byte != 0) {
      h.flags = static_cast<uint16_t>(fifo << transport::kFlagScheduleShift);
    }
    std::lock_guard<std::mutex> l(mu);
    stamped[h.sender_rank].insert(static_cast<uint8_t>(h.flags >> transport::kFlagScheduleShift));
  });
  JobSpec job{tag,
              3,
              "gradlane",
              "secret",
              {{"a", 300 << 10, GL_DTYPE_F32, 0}, {"b", 70000, GL_DTYPE_BF16, 1}},
              6};
  job.mode = GetParam();
  RunJob(cluster, job, 24, /*mean=*/false);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u) << "daemon " << i;
  std::lock_guard<std::mutex> l(mu);
  for (uint16_t rank = 1; rank < 3; ++rank) {
    std::set<uint8_t> bytes = stamped[rank];
    bytes.erase(0);  // before it heard, and the manifest and leave frames
    EXPECT_EQ(bytes, std::set<uint8_t>{fifo}) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ScheduleAgreementTest,
                         ::testing::Values(GL_MODE_PS, GL_MODE_ALLREDUCE),
                         [](const ::testing::TestParamInfo<gl_job_mode>& info) {
                           return info.param == GL_MODE_PS ? "ps" : "allreduce";
                         });

INSTANTIATE_TEST_SUITE_P(AllPolicies, PolicyTest,
                         ::testing::Values("fifo", "p3", "bytescheduler", "prophet", "gradlane"));

// All-reduce: W = 2, 3, 4 ranks, every policy, every dtype with awkward sizes (tensors of fewer
// elements than ranks leave chunks empty), bit-exact to the ring's order on every rank, for
// several iterations (a rank may run one iteration ahead of its right neighbour).
class AllReduceTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(AllReduceTest, RingIsBitExactOnEveryRank) {
  const auto [world, policy] = GetParam();
  const std::string tag = absl::StrCat("ar", world, "-", policy);
  // Unfused: the reference follows each partition's chunks.
  Cluster cluster(world, TestOptions(), tag,
                  [](int, EngineOptions& o) { o.allreduce_fusion = EngineOptions::Fusion::kOff; });
  JobSpec job{"job-" + tag, world, policy, "secret", AwkwardTensors(), 77};
  job.mode = GL_MODE_ALLREDUCE;
  RunJob(cluster, job, 4, /*mean=*/false);
  for (int i = 0; i < world; ++i) {
    const EngineStats s = cluster.Stats(i);
    EXPECT_EQ(s.jobs_failed, 0u);
    EXPECT_GT(s.rounds_reduced, 0u);
    EXPECT_EQ(s.segments_rejected, 0u);
  }
  for (int i = 0; i < world; ++i) {
    EXPECT_TRUE(cluster.WaitFor(i, [](const EngineStats& s) {
      return s.jobs_active == 0 && s.arena_aliases == 0;
    }));
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndPolicies, AllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values("fifo", "p3", "bytescheduler",
                                                              "prophet", "gradlane")),
                         [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
                           return absl::StrCat("W", std::get<0>(info.param), "_",
                                               std::get<1>(info.param));
                         });

TEST(EngineTest, AllReduceMeanIsBitExact) {
  Cluster cluster(3, TestOptions(), "ar-mean", [](int, EngineOptions& o) {
    o.reduce = ps::ReduceOp::kMean;
    o.allreduce_fusion = EngineOptions::Fusion::kOff;
  });
  JobSpec job{"job-ar-mean", 3, "bytescheduler", "secret", AwkwardTensors(), 78};
  job.mode = GL_MODE_ALLREDUCE;
  RunJob(cluster, job, 3, /*mean=*/true);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u);
}

TEST(EngineTest, AllReduceSingleRankCompletesWithItsOwnGradient) {
  Cluster cluster(1, TestOptions(), "ar-single");
  JobSpec job{"job-ar-single", 1, "bytescheduler", "secret", AwkwardTensors(), 79};
  job.mode = GL_MODE_ALLREDUCE;
  RunJob(cluster, job, 2, /*mean=*/false);
  EXPECT_EQ(cluster.Stats(0).jobs_failed, 0u);
}

// Many small tensors of every dtype (and one of several partitions among them): fused into ring
// buckets from the third iteration on, by the same plan on every rank, exact before and after
// (whole-number values: every order sums exactly, so the reference needs no bucket layout), sum
// and mean. Greedy fusion always fuses; PACE's may decide not to, and must be exact either way.
void FusionCase(EngineOptions::Fusion fusion, int world, bool mean, const std::string& tag) {
  Cluster cluster(world, TestOptions(), tag, [&](int, EngineOptions& o) {
    o.allreduce_fusion = fusion;
    if (mean) o.reduce = ps::ReduceOp::kMean;
  });
  std::vector<TensorDef> tensors;
  for (int i = 0; i < 16; ++i) {
    const gl_dtype dt = i % 3 == 0 ? GL_DTYPE_F32 : i % 3 == 1 ? GL_DTYPE_F16 : GL_DTYPE_BF16;
    const uint64_t elem = dt == GL_DTYPE_F32 ? 4 : 2;
    tensors.push_back({absl::StrCat("small", i), elem * (1 + 7 * static_cast<uint64_t>(i)), dt,
                       i % 2 == 0 ? i : GL_PRIORITY_AUTO});
    if (i == 8) tensors.push_back({"big", 3 * kPartition + 8, GL_DTYPE_F32, 20});
  }
  JobSpec job{"job-" + tag, world, "bytescheduler", "secret", tensors, kIntegerValues | 90};
  job.mode = GL_MODE_ALLREDUCE;
  RunJob(cluster, job, 7, mean);
  for (int i = 0; i < world; ++i) {
    const EngineStats s = cluster.Stats(i);
    EXPECT_EQ(s.jobs_failed, 0u) << tag;
    EXPECT_EQ(s.segments_rejected, 0u) << tag;
    if (fusion == EngineOptions::Fusion::kGreedy) {
      EXPECT_GT(s.fusion_buckets, 0u) << tag;
    }
  }
  // Every rank applied the same plan.
  for (int i = 1; i < world; ++i) {
    EXPECT_EQ(cluster.Stats(i).fusion_buckets, cluster.Stats(0).fusion_buckets) << tag;
  }
}

TEST(EngineTest, AllReduceGreedyFusionIsExactOnEveryRank) {
  FusionCase(EngineOptions::Fusion::kGreedy, 3, false, "fuse-greedy3");
  FusionCase(EngineOptions::Fusion::kGreedy, 2, true, "fuse-greedy2-mean");
  FusionCase(EngineOptions::Fusion::kGreedy, 4, false, "fuse-greedy4");
}

TEST(EngineTest, AllReducePaceFusionIsExactOnEveryRank) {
  FusionCase(EngineOptions::Fusion::kPace, 3, false, "fuse-pace3");
}

TEST(EngineTest, DaemonsWithDifferentFusionRefuseTheJob) {
  Cluster cluster(2, TestOptions(), "fuse-knob", [](int i, EngineOptions& o) {
    o.allreduce_fusion = i == 0 ? EngineOptions::Fusion::kPace : EngineOptions::Fusion::kOff;
  });
  JobSpec job{"job-fuse-knob", 2, "bytescheduler", "secret", AwkwardTensors(), 91};
  job.mode = GL_MODE_ALLREDUCE;
  const std::vector<std::vector<int>> st = PostOneIterationPerRank(cluster, job);
  for (int r = 0; r < 2; ++r) {
    for (int s : st[r]) EXPECT_NE(s, GL_OK);
  }
  EXPECT_GT(cluster.Stats(0).manifest_mismatches + cluster.Stats(1).manifest_mismatches, 0u);
}

// Rank 0 registers `job`, rank 1 `other`: every post fails, at least one rank's with
// GL_E_BAD_TENSOR (the one that reads the other's manifest first), and a mismatch is counted.
void ExpectTheJobRefused(Cluster& cluster, const JobSpec& job, const JobSpec& other) {
  std::vector<std::vector<int>> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RankClient c;
      const JobSpec& mine = r == 1 ? other : job;
      ASSERT_EQ(c.Setup(cluster.socket(r), mine, r), GL_OK);
      const int n = c.Post(mine, r, 0, 0, mine.tensors.size());
      st[r] = c.Wait(n);
      EXPECT_EQ(static_cast<int>(st[r].size()), n) << "rank " << r;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(cluster.Stats(0).manifest_mismatches + cluster.Stats(1).manifest_mismatches, 0u);
  bool bad_tensor = false;
  for (int r = 0; r < 2; ++r) {
    for (int s : st[r]) {
      EXPECT_NE(s, GL_OK) << "rank " << r;
      bad_tensor = bad_tensor || s == GL_E_BAD_TENSOR;
    }
  }
  EXPECT_TRUE(bad_tensor);
}

// Ranks that choose different modes fail the job on every rank: the rank that reads the other's
// manifest first with GL_E_BAD_TENSOR (its log names both modes), the other as its peer hangs up.
TEST(EngineTest, RanksThatDisagreeOnTheModeFailTheJob) {
  Cluster cluster(2, TestOptions(), "ar-mismatch");
  JobSpec job{"job-ar-mismatch", 2, "bytescheduler", "secret", AwkwardTensors(), 80};
  JobSpec other = job;
  other.mode = GL_MODE_ALLREDUCE;
  ExpectTheJobRefused(cluster, job, other);
}

// A client that dies in the middle of an all-reduce iteration fails its peers' posts with
// GL_E_DISCONNECTED (no hang), and the next job on the same daemons works.
TEST(EngineTest, AllReduceRankDeathFailsSurvivorsThenTheNextJobWorks) {
  Cluster cluster(3, TestOptions(), "ar-death");
  JobSpec job{"job-ar-death", 3, "bytescheduler", "secret", AwkwardTensors(), 81};
  job.mode = GL_MODE_ALLREDUCE;
  std::vector<std::vector<int>> st(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      RankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r), GL_OK);
      ASSERT_TRUE(c.Iterate(job, r, 0, false));
      if (r == 2) {
        // Posts half of iteration 1, then goes away.
        c.PostRange(job, r, 1, 0, 0, GL_WHOLE_TENSOR);
        c.Close();
        return;
      }
      const int n = c.Post(job, r, 1, 0, job.tensors.size());
      st[r] = c.Wait(n, 20000);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[r].empty()) << "rank " << r;
    bool disconnected = false;
    for (int s : st[r]) disconnected = disconnected || s == GL_E_DISCONNECTED;
    EXPECT_TRUE(disconnected) << "rank " << r;
  }
  JobSpec next = job;
  next.job_id = "job-ar-death-next";
  RunJob(cluster, next, 2, /*mean=*/false);
}

// Pushes folded into the result as their pieces arrive (what the DPDK backend does with each
// packet) give the same bits as the end-of-round reduction, also when a piece ends inside an
// element (odd piece sizes split f32 and f16 values across pieces), for sum and mean.
TEST(EngineTest, PushesFoldedPieceByPieceAreBitExact) {
  for (const int world : {2, 3}) {
    for (const uint32_t piece : {1u, 7u, 1001u, 0u}) {
      for (const bool mean : {false, true}) {
        SCOPED_TRACE(absl::StrCat("W=", world, " piece=", piece, " mean=", mean));
        EngineOptions o = TestOptions();
        if (mean) o.reduce = ps::ReduceOp::kMean;
        Cluster cluster(world, o, absl::StrCat("fold", world, "-", piece, mean ? "m" : "s"));
        cluster.SetPieceBytes(piece);
        JobSpec job{absl::StrCat("job-fold-", world, "-", piece, mean ? "m" : "s"),
                    world,
                    "bytescheduler",
                    "secret",
                    AwkwardTensors(),
                    11};
        RunJob(cluster, job, 3, mean);
        uint64_t folded = 0, reduced = 0;
        for (int i = 0; i < world; ++i) {
          folded += cluster.Stats(i).rounds_folded;
          reduced += cluster.Stats(i).rounds_reduced;
          EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u);
        }
        // A round folds whenever the others complete before the last rank's last piece
        // arrives, which the 3 iterations of every partition give many chances to.
        EXPECT_GT(folded, 0u) << "no round was folded (of " << reduced << ")";
        EXPECT_LE(folded, reduced);
      }
    }
  }
}

// Folding that starts mid-stream: rank 1's push of the first part of a partition owned by rank 0
// arrives (and is placed in its slot) before rank 0 has posted that tensor; rank 0 then posts,
// and the rest of rank 1's push is folded on arrival after the placed prefix is reduced from the
// slot. Deterministic order: each step waits until the previous one shows in the counters.
TEST(EngineTest, FoldingThatStartsMidStreamCatchesUpOnThePlacedPrefix) {
  for (const uint32_t piece : {7u, 0u}) {
    SCOPED_TRACE(absl::StrCat("piece=", piece));
    Cluster cluster(2, TestOptions(), absl::StrCat("foldlate", piece));
    cluster.SetPieceBytes(piece);
    // "warmup" brings the job up on both daemons; "two_parts" has one partition per rank, and
    // the split points fall inside them.
    JobSpec job{absl::StrCat("job-foldlate-", piece),
                2,
                "bytescheduler",
                "secret",
                {{"warmup", 64, GL_DTYPE_F32, 1}, {"two_parts", 2 * kPartition, GL_DTYPE_F32, 1}},
                5};
    RankClient c0, c1;
    ASSERT_EQ(c0.Setup(cluster.socket(0), job, 0), GL_OK);
    ASSERT_EQ(c1.Setup(cluster.socket(1), job, 1), GL_OK);
    ASSERT_EQ(c0.PostRange(job, 0, 0, 0, 0, GL_WHOLE_TENSOR), GL_OK);
    ASSERT_EQ(c1.PostRange(job, 1, 0, 0, 0, GL_WHOLE_TENSOR), GL_OK);
    ASSERT_EQ(c0.Wait(1), std::vector<int>({GL_OK}));
    ASSERT_EQ(c1.Wait(1), std::vector<int>({GL_OK}));
    const EngineStats before = cluster.Stats(0);

    const uint64_t split = 1236;  // bytes into each partition, a whole number of f32 values
    ASSERT_EQ(c1.PostRange(job, 1, 0, 1, 0, split), GL_OK);
    ASSERT_EQ(c1.PostRange(job, 1, 0, 1, kPartition, split), GL_OK);
    // Rank 0 got the first piece of its partition (one segment) and holds it in the slot.
    ASSERT_TRUE(cluster.WaitFor(0, [&](const EngineStats& s) {
      return s.segments_received == before.segments_received + 1;
    }));
    ASSERT_EQ(c0.PostRange(job, 0, 0, 1, 0, GL_WHOLE_TENSOR), GL_OK);
    // Rank 0's post was taken: it pushed rank 1's partition.
    ASSERT_TRUE(cluster.WaitFor(0, [&](const EngineStats& s) {
      return s.segments_sent > before.segments_sent;
    }));
    ASSERT_EQ(c1.PostRange(job, 1, 0, 1, split, kPartition - split), GL_OK);
    ASSERT_EQ(c1.PostRange(job, 1, 0, 1, kPartition + split, kPartition - split), GL_OK);
    ASSERT_EQ(c0.Wait(1), std::vector<int>({GL_OK}));
    ASSERT_EQ(c1.Wait(4), std::vector<int>(4, GL_OK));
    EXPECT_TRUE(c0.ResultIsExact(job, 0, 1, false)) << "rank 0's result differs from the reference";
    EXPECT_TRUE(c1.ResultIsExact(job, 0, 1, false)) << "rank 1's result differs from the reference";
    EXPECT_EQ(cluster.Stats(0).rounds_folded, before.rounds_folded + 1)
        << "rank 0's partition was not folded";
  }
}

TEST(EngineTest, MeanIsBitExact) {
  EngineOptions o = TestOptions();
  o.reduce = ps::ReduceOp::kMean;
  Cluster cluster(3, o, "mean");
  JobSpec job{"job-mean", 3, "", "secret", AwkwardTensors(), 7};
  RunJob(cluster, job, 2, /*mean=*/true);
}

TEST(EngineTest, SingleRankJobCompletesWithItsOwnGradient) {
  Cluster cluster(1, TestOptions(), "w1");
  JobSpec job{"job-w1", 1, "bytescheduler", "", AwkwardTensors(), 3};
  RunJob(cluster, job, 3, /*mean=*/false);
  EXPECT_EQ(cluster.Stats(0).segments_sent, 0u);
  EXPECT_GT(cluster.Stats(0).rounds_reduced, 0u);
}

TEST(EngineTest, BytesSchedulerWithOnlineTuningStaysExact) {
  EngineOptions o = TestOptions();
  o.autotune = true;
  o.autotune_iterations_per_trial = 1;
  Cluster cluster(3, o, "tune");
  JobSpec job{"job-tune", 3, "bytescheduler", "secret", AwkwardTensors(), 11};
  RunJob(cluster, job, 8, /*mean=*/false);
  EXPECT_GT(cluster.Stats(0).tuner_trials + cluster.Stats(1).tuner_trials +
                cluster.Stats(2).tuner_trials,
            0u);
}

// The client arenas are registered with the device by the session server when the session is set
// up, not by the engine thread when the job starts (there it is found), and deregistered off the
// engine thread once the job and the session are both gone.
TEST(EngineTest, ArenasAreRegisteredAndDeregisteredOffTheEngineThread) {
  TestRegistrar registrar;
  {
    Cluster cluster(2, TestOptions(), "pin", nullptr, &registrar);
    JobSpec job{"job-pin", 2, "", "secret", AwkwardTensors(), 5};
    RunJob(cluster, job, 2, /*mean=*/false);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u);
      // The arena (found) and the shard slab and manifests (daemon-owned, registered there).
      EXPECT_EQ(cluster.registering(i)->found_.load(), 1) << "daemon " << i;
      EXPECT_GE(cluster.registering(i)->registered_.load(), 1) << "daemon " << i;
    }
    EXPECT_EQ(registrar.pins(), 2);  // one per session
    // Clients closed: the sessions close, the jobs are released 200 ms later, and the
    // acceptor threads drop the last references.
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (registrar.unpins() < 2 && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(registrar.unpins(), 2);
    const std::thread::id engine = cluster.registering(0)->engine_thread_.load();
    for (std::thread::id t : registrar.threads()) EXPECT_NE(t, engine);
  }
  EXPECT_EQ(registrar.pins(), registrar.unpins());
}

// A device that refuses a session's arena (RLIMIT_MEMLOCK too low) refuses the session with
// GL_E_NO_MEMORY and the reason, and the daemon goes on serving.
TEST(EngineTest, AnArenaTheDeviceRefusesRefusesTheSessionNamingTheLimit) {
  TestRegistrar registrar;
  Cluster cluster(1, TestOptions(), "refuse", nullptr, &registrar);
  registrar.set_refuse(true);
  gl_connect_options o{};
  const std::string socket = cluster.socket(0);
  o.socket_path = socket.c_str();
  o.arena_bytes = 8 << 20;
  o.timeout_ms = 10000;
  gl_client* c = nullptr;
  EXPECT_EQ(gl_connect(&o, &c), GL_E_NO_MEMORY);
  const std::string why = gl_last_error(nullptr);
  EXPECT_EQ(why.rfind("arena: RLIMIT_MEMLOCK is 65536 bytes, too low to pin 8388608", 0), 0u)
      << why;
  EXPECT_EQ(registrar.pins(), 0);
  registrar.set_refuse(false);
  JobSpec job{"job-after-refusal", 1, "", "", AwkwardTensors(), 3};
  RunJob(cluster, job, 1, /*mean=*/false);
  EXPECT_EQ(cluster.Stats(0).jobs_failed, 0u);
}

TEST(EngineTest, TwoJobsAtOnceStayCorrect) {
  Cluster cluster(3, TestOptions(), "two");
  JobSpec a{"job-a", 3, "bytescheduler", "token-a", AwkwardTensors(), 100};
  std::vector<TensorDef> other = {{"x", 5 * kPartition + 6, GL_DTYPE_F16, 0},
                                  {"y", 123 * 4, GL_DTYPE_F32, 1}};
  JobSpec b{"job-b", 3, "p3", "token-b", other, 200};
  std::thread ta([&] { RunJob(cluster, a, 4, false); });
  std::thread tb([&] { RunJob(cluster, b, 4, false); });
  ta.join();
  tb.join();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u);
}

// fifo's window is unbounded: it hands the transport more segments than a peer's send queue
// holds. That is back-pressure (the rest waits for acks), not a failure.
TEST(EngineTest, SendQueueFullIsBackPressureNotAFailure) {
  EngineOptions o = TestOptions("fifo");
  o.transport.max_pending_sends_per_peer = 2;
  Cluster cluster(3, o, "bp");
  JobSpec job{"job-bp", 3, "fifo", "secret", AwkwardTensors(), 9};
  RunJob(cluster, job, 3, /*mean=*/false);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u);
    EXPECT_GT(cluster.Stats(i).segments_sent, 6u);  // far more than the queue holds
  }
}

// Iteration 0 runs on all ranks; then `fault` happens and ranks in `survivors` post iteration 1.
// Returns, per survivor, the statuses of its iteration-1 posts and the time they took.
struct SurvivorResult {
  std::vector<int> statuses;
  int expected = 0;
};

// Every rank's client in its own thread: sets up, runs iteration 0 (bit-exact), counts itself
// in `done0`, then runs `then(rank, client)`, which waits on whatever signal its test needs.
// Returns once every thread has ended.
template <class C>
void AfterIterationZero(C& cluster, const JobSpec& job, std::atomic<int>& done0,
                        const std::function<void(int, RankClient&)>& then) {
  std::vector<std::thread> threads;
  for (int r = 0; r < job.world; ++r) {
    threads.emplace_back([&, r] {
      RankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r), GL_OK);
      ASSERT_TRUE(c.Iterate(job, r, 0, false));
      done0.fetch_add(1);
      then(r, c);
    });
  }
  for (auto& t : threads) t.join();
}

// Posts all of iteration 1 and collects a status per post. A survivor's posts must all be
// answered (the Wait limit only ends a hang): by an error, since a rank is missing.
void PostIterationOne(const JobSpec& job, int rank, RankClient& c, SurvivorResult& out) {
  out.expected = c.Post(job, rank, 1, 0, job.tensors.size());
  out.statuses = c.Wait(out.expected, 30000);
}

void WaitUntil(const std::function<bool()>& pred) {
  while (!pred()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(EngineTest, ClientDeathMidIterationFailsPeersAndFreesResources) {
  Cluster cluster(3, TestOptions(), "death");
  JobSpec job{"job-death", 3, "bytescheduler", "secret", AwkwardTensors(), 5};
  std::vector<SurvivorResult> res(3);
  std::atomic<int> done0{0};
  AfterIterationZero(cluster, job, done0, [&](int r, RankClient& c) {
    WaitUntil([&] { return done0.load() == 3; });
    if (r == 1) {
      // Dies with half of its gradients posted.
      c.Post(job, r, 1, 0, job.tensors.size() / 2);
      c.Close();
      return;
    }
    PostIterationOne(job, r, c, res[r]);
  });
  for (int r : {0, 2}) {
    EXPECT_EQ(static_cast<int>(res[r].statuses.size()), res[r].expected) << "rank " << r;
    int errors = 0;
    for (int s : res[r].statuses) errors += s != GL_OK;
    EXPECT_GT(errors, 0) << "rank " << r;
  }
  EXPECT_TRUE(cluster.WaitFor(1, [](const EngineStats& s) {
    return s.jobs_active == 0 && s.arena_aliases == 0 && s.jobs_released == 1;
  }));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(cluster.WaitFor(i, [](const EngineStats& s) { return s.jobs_active == 0; }));
  }
  // The daemons live on: a new job works.
  JobSpec next{"job-after-death", 3, "p3", "secret", AwkwardTensors(), 6};
  RunJob(cluster, next, 2, false);
}

// A client that closes between iterations (nothing posted) leaves the job cleanly; the ranks
// that go on to the next iteration can never complete it, and must be told so with
// GL_E_DISCONNECTED on every post: not a refused iteration, not a protocol fault, not a hang.
// `wait_for_leave`: the survivors post only once the leaving daemon has released the job (they
// know of the departure); otherwise they post while the departure is under way.
void LeaveBetweenIterationsCase(const std::string& tag, bool wait_for_leave) {
  Cluster cluster(3, TestOptions(), tag);
  JobSpec job{"job-" + tag, 3, "bytescheduler", "secret", AwkwardTensors(), 41};
  std::vector<SurvivorResult> res(3);
  std::atomic<int> done0{0};
  std::atomic<bool> left{false};
  AfterIterationZero(cluster, job, done0, [&](int r, RankClient& c) {
    WaitUntil([&] { return done0.load() == 3; });
    if (r == 1) {
      c.Close();
      left.store(true);
      return;
    }
    if (wait_for_leave) {
      WaitUntil([&] { return left.load(); });
      EXPECT_TRUE(cluster.WaitFor(
          1, [](const EngineStats& s) { return s.jobs_released == 1; }, std::chrono::seconds(30)));
    }
    PostIterationOne(job, r, c, res[r]);
  });
  for (int r : {0, 2}) {
    EXPECT_EQ(static_cast<int>(res[r].statuses.size()), res[r].expected) << "rank " << r;
    for (int s : res[r].statuses) {
      EXPECT_EQ(s, GL_E_DISCONNECTED) << "rank " << r << ": " << gl_strerror(s);
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(cluster.WaitFor(i, [](const EngineStats& s) { return s.jobs_active == 0; }));
  }
}

TEST(EngineTest, RankThatLeftBetweenIterationsFailsTheNextOneWithDisconnected) {
  LeaveBetweenIterationsCase("leave-known", true);
}

TEST(EngineTest, RankLeavingWhileOthersPostTheNextIterationFailsItWithDisconnected) {
  for (int k = 0; k < 5; ++k) LeaveBetweenIterationsCase(absl::StrCat("leave-race", k), false);
}

TEST(EngineTest, ClientKilledWithSigkillMidIteration) {
  Cluster cluster(3, TestOptions(), "sigkill");
  JobSpec job{"job-sigkill", 3, "bytescheduler", "secret", AwkwardTensors(), 31};
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 1 in its own process: posts half of iteration 0, says so, and waits to be killed.
    ::close(pipefd[0]);
    RankClient c;
    if (c.Setup(cluster.socket(1), job, 1) != GL_OK) ::_exit(2);
    c.Post(job, 1, 0, 0, job.tensors.size() / 2);
    const char one = 1;
    (void)::write(pipefd[1], &one, 1);
    for (;;) ::pause();
  }
  ::close(pipefd[1]);
  std::vector<SurvivorResult> res(3);
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      RankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r), GL_OK);
      res[r].expected = c.Post(job, r, 0, 0, job.tensors.size());
      res[r].statuses = c.Wait(res[r].expected);
    });
  }
  char b = 0;
  ASSERT_EQ(::read(pipefd[0], &b, 1), 1);
  ::close(pipefd[0]);
  // Mid-iteration: its daemon has taken the posts and the job is running.
  EXPECT_TRUE(cluster.WaitFor(1, [](const EngineStats& s) { return s.jobs_active == 1; }));
  ::kill(child, SIGKILL);
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  for (auto& t : threads) t.join();
  for (int r : {0, 2}) {
    EXPECT_EQ(static_cast<int>(res[r].statuses.size()), res[r].expected) << "rank " << r;
    int errors = 0;
    for (int s : res[r].statuses) errors += s != GL_OK;
    EXPECT_GT(errors, 0) << "rank " << r;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(cluster.WaitFor(i, [](const EngineStats& s) {
      return s.jobs_active == 0 && s.arena_aliases == 0;
    }));
  }
  JobSpec next{"job-after-sigkill", 3, "fifo", "secret", AwkwardTensors(), 32};
  RunJob(cluster, next, 2, false);
}

void PeerDownCase(bool silent, gl_job_mode mode = GL_MODE_PS) {
  const std::string tag =
      absl::StrCat(silent ? "silent" : "loud", mode == GL_MODE_ALLREDUCE ? "-ar" : "");
  Cluster cluster(3, TestOptions(), tag);
  JobSpec job{"job-" + tag, 3, "bytescheduler", "secret", AwkwardTensors(), 9};
  job.mode = mode;
  std::vector<SurvivorResult> res(3);
  std::atomic<int> done0{0};
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    WaitUntil([&] { return done0.load() == 3; });
    cluster.Kill(2, silent);
    killed.store(true);
  });
  AfterIterationZero(cluster, job, done0, [&](int r, RankClient& c) {
    WaitUntil([&] { return killed.load(); });
    if (r == 2) return;  // its daemon is gone
    PostIterationOne(job, r, c, res[r]);
  });
  killer.join();
  for (int r : {0, 1}) {
    EXPECT_EQ(static_cast<int>(res[r].statuses.size()), res[r].expected) << "rank " << r;
    int errors = 0;
    for (int s : res[r].statuses) errors += s != GL_OK;
    // Every post answered: the loud kill is seen at once, the silent one by the peer timeout
    // (1 s); without either the posts would wait for ever.
    EXPECT_GT(errors, 0) << "rank " << r;
  }
  for (int i : {0, 1}) {
    EXPECT_TRUE(cluster.WaitFor(i, [](const EngineStats& s) {
      return s.jobs_active == 0 && s.arena_aliases == 0;
    }));
  }
  // The dead daemon restarts; a new job over all three works.
  cluster.Restart(2);
  JobSpec next{"job-" + tag + "-2", 3, "prophet", "secret", AwkwardTensors(), 10};
  next.mode = mode;
  RunJob(cluster, next, 2, false);
}

TEST(EngineTest, PeerDaemonKilledFailsPendingPostsThenRestartWorks) { PeerDownCase(false); }
TEST(EngineTest, SilentPeerFailsWithinTheTimeoutThenRestartWorks) { PeerDownCase(true); }
TEST(EngineTest, AllReducePeerDaemonKilledFailsPendingPostsThenRestartWorks) {
  PeerDownCase(false, GL_MODE_ALLREDUCE);
}
TEST(EngineTest, AllReduceSilentPeerFailsWithinTheTimeoutThenRestartWorks) {
  PeerDownCase(true, GL_MODE_ALLREDUCE);
}

TEST(EngineTest, WrongTokenIsRejected) {
  EngineOptions o = TestOptions();
  o.transport.connect_deadline = 2 * sched::kSecond;
  Cluster cluster(3, o, "token");
  JobSpec job{"job-token", 3, "bytescheduler", "right-token", AwkwardTensors(), 12};
  const std::vector<std::vector<int>> st = PostOneIterationPerRank(cluster, job, 1, "wrong-token");
  for (int r = 0; r < 3; ++r) {
    int errors = 0;
    for (int s : st[r]) errors += s != GL_OK;
    EXPECT_EQ(errors, static_cast<int>(st[r].size())) << "rank " << r;
  }
  // The rank whose dial is refused sees GL_E_PERMISSION; which rank dials first is a race (the
  // other may find the job already gone and time out), so at least one of them does.
  bool permission = false;
  for (auto& v : st) permission = permission || (!v.empty() && v[0] == GL_E_PERMISSION);
  EXPECT_TRUE(permission);
}

TEST(EngineTest, TensorListMismatchIsAClearError) {
  Cluster cluster(2, TestOptions(), "mismatch");
  JobSpec job{"job-mismatch", 2, "bytescheduler", "secret", AwkwardTensors(), 13};
  JobSpec other = job;
  other.tensors[3].bytes += 4;  // rank 1 registers a different size
  ExpectTheJobRefused(cluster, job, other);
}

TEST(EngineTest, DaemonsWithDifferentPartitionSizesOrReduceOpsRefuseTheJob) {
  for (int variant = 0; variant < 2; ++variant) {
    Cluster cluster(2, TestOptions(), absl::StrCat("knobs", variant), [&](int i, EngineOptions& o) {
      if (i != 1) return;
      if (variant == 0) o.partition_bytes = 2 * kPartition;
      if (variant == 1) o.reduce = ps::ReduceOp::kMean;
    });
    JobSpec job{
        absl::StrCat("job-knobs", variant), 2, "bytescheduler", "secret", AwkwardTensors(), 16};
    const std::vector<std::vector<int>> st = PostOneIterationPerRank(cluster, job);
    for (int r = 0; r < 2; ++r) {
      for (int s : st[r]) EXPECT_NE(s, GL_OK) << "variant " << variant;
    }
    EXPECT_GT(cluster.Stats(0).manifest_mismatches + cluster.Stats(1).manifest_mismatches, 0u);
  }
}

TEST(EngineTest, ShutdownFailsPendingPostsAndUnmaps) {
  Cluster cluster(2, TestOptions(), "shutdown");
  JobSpec job{"job-shutdown", 2, "bytescheduler", "secret", AwkwardTensors(), 14};
  RankClient c;
  ASSERT_EQ(c.Setup(cluster.socket(0), job, 0), GL_OK);
  const int n = c.Post(job, 0, 0, 0, job.tensors.size());  // rank 1 never comes
  ASSERT_TRUE(cluster.WaitFor(0, [](const EngineStats& s) { return s.jobs_active == 1; }));
  cluster.ShutdownEngine(0);
  // Every post ends in an error completion, or the session is closed under the client.
  std::vector<int> st = c.Wait(n, 5000);
  for (int s : st) EXPECT_NE(s, GL_OK);
  EXPECT_EQ(cluster.Stats(0).arena_aliases, 0u);
  EXPECT_EQ(cluster.Stats(0).jobs_active, 0u);
  gl_completion cs[4];
  uint32_t count = 0;
  EXPECT_EQ(gl_wait(c.c(), cs, 4, &count, 2000), GL_E_DISCONNECTED);
}

TEST(EngineTest, PostsBeforeTheJobAndOfLateTensorsAreRefused) {
  Cluster cluster(1, TestOptions(), "late");
  JobSpec job{"job-late", 1, "fifo", "", {{"a", 64, GL_DTYPE_F32, 0}}, 15};
  RankClient c;
  ASSERT_EQ(c.Setup(cluster.socket(0), job, 0), GL_OK);
  ASSERT_TRUE(c.Iterate(job, 0, 0, false));
  // A tensor registered after the first post is outside the frozen job.
  uint32_t id = 0;
  void* buf = nullptr;
  ASSERT_EQ(gl_register_tensor(c.c(), "late", 64, GL_DTYPE_F32, 0, &id, &buf), GL_OK);
  ASSERT_EQ(gl_post(c.c(), id, 0, 0, GL_WHOLE_TENSOR, 0), GL_OK);
  std::vector<int> st = c.Wait(1);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0], GL_E_BAD_TENSOR);
}

// One rank per daemon per job: a second client of the same job id on the same daemon is refused
// before the engine maps anything of it, and the job it collided with carries on.
TEST(EngineTest, ASecondRankOfAJobOnTheSameDaemonIsRefusedFirst) {
  Cluster cluster(2, TestOptions(), "dup");
  JobSpec job{"job-dup", 2, "bytescheduler", "secret", {{"a", 256, GL_DTYPE_F32, 0}}, 21};
  RankClient first, second, other;
  ASSERT_EQ(first.Setup(cluster.socket(0), job, 0), GL_OK);
  ASSERT_EQ(first.Post(job, 0, 0, 0, 1), 1);
  ASSERT_TRUE(cluster.WaitFor(0, [](const EngineStats& s) { return s.arena_aliases == 1; }));
  ASSERT_EQ(second.Setup(cluster.socket(0), job, 1), GL_OK);
  ASSERT_EQ(second.Post(job, 1, 0, 0, 1), 1);
  const std::vector<int> refused = second.Wait(1);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0], GL_E_ALREADY_EXISTS);
  EXPECT_EQ(cluster.Stats(0).arena_aliases, 1u);  // only the first job's arena is mapped
  second.Close();
  // Rank 1 where it belongs: the first job completes, exact.
  std::thread t([&] {
    ASSERT_EQ(other.Setup(cluster.socket(1), job, 1), GL_OK);
    EXPECT_TRUE(other.Iterate(job, 1, 0, false));
  });
  const std::vector<int> done = first.Wait(1);
  t.join();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0], GL_OK);
  EXPECT_TRUE(first.ResultIsExact(job, 0, 0, false));
}

// ---- the same engine over kernel TCP on loopback: one engine thread per daemon.

using TcpEngine = Engine;  // over TcpTransport

class TcpCluster {
 public:
  TcpCluster(int n, EngineOptions base, const std::string& tag) {
    for (int i = 0; i < n; ++i) {
      EngineOptions o = base;
      o.sessions.socket_path =
          absl::StrCat("/tmp/gl-engine-tcp-", ::getpid(), "-", tag, "-", i, ".sock");
      o.transport.listen_address = "127.0.0.1";
      o.transport.listen_port = 0;
      auto e = TcpEngine::Create(o, [](const transport::TransportOptions& to,
                                       transport::TransportHandler* h) {
        return transport::tcp::TcpTransport::Create(to, h);
      });
      EXPECT_TRUE(e.ok()) << e.status();
      peers_.push_back(absl::StrCat("127.0.0.1:", (*e)->listen_port()));
      sockets_.push_back(o.sessions.socket_path);
      engines_.push_back(std::move(*e));
      stops_.push_back(std::make_unique<std::atomic<bool>>(false));
    }
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, i] { engines_[i]->Run(*stops_[i]); });
    }
  }
  ~TcpCluster() {
    for (size_t i = 0; i < engines_.size(); ++i) Stop(i);
  }
  // Stops daemon i: Run() returns through Shutdown_st (pending posts failed, peers told).
  void Stop(size_t i) {
    if (!threads_[i].joinable()) return;
    stops_[i]->store(true);
    threads_[i].join();
  }
  const std::string& socket(int i) const { return sockets_[i]; }
  const std::vector<std::string>& peers() const { return peers_; }
  EngineStats Stats(int i) const { return engines_[i]->Stats(); }
  transport::TransportStats TransportStats(int i) { return engines_[i]->transport().Stats(); }
  uint16_t port(int i) const { return engines_[i]->listen_port(); }

 private:
  std::vector<std::unique_ptr<TcpEngine>> engines_;
  std::vector<std::unique_ptr<std::atomic<bool>>> stops_;
  std::vector<std::thread> threads_;
  std::vector<std::string> sockets_;
  std::vector<std::string> peers_;
};

TEST(EngineTcpTest, ThreeDaemonsOverLoopbackBitExact) {
  TcpCluster cluster(3, TestOptions(), "exact");
  for (const std::string policy : {"bytescheduler", "prophet", "fifo"}) {
    JobSpec job{"tcp-" + policy, 3, policy, "secret", AwkwardTensors(), 21, cluster.peers()};
    RunJob(cluster, job, 3, false);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u);
    EXPECT_GT(cluster.TransportStats(i).total.acks_received, 0u);
  }
}

TEST(EngineTcpTest, MalformedFramesAndWrongTokenAreRejectedAndCounted) {
  EngineOptions o = TestOptions();
  o.transport.connect_deadline = 2 * sched::kSecond;
  TcpCluster cluster(2, o, "bad");
  // Garbage on the peer port: refused, counted, the daemon carries on.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(cluster.port(0));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    char junk[128];
    std::memset(junk, 0x5a, sizeof(junk));
    ASSERT_EQ(::write(fd, junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
    char buf[512];
    (void)::read(fd, buf, sizeof(buf));  // the reject, then EOF
    ::close(fd);
  }
  const auto end = Clock::now() + std::chrono::seconds(30);  // only a failing run waits it out
  while (cluster.TransportStats(0).malformed() == 0 && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(cluster.TransportStats(0).malformed(), 0u);
  // Wrong token on rank 1: both ranks' posts fail, rank 1's with GL_E_PERMISSION.
  JobSpec job{"tcp-token", 2, "bytescheduler", "right", AwkwardTensors(), 22, cluster.peers()};
  const std::vector<std::vector<int>> st = PostOneIterationPerRank(cluster, job, 1, "wrong");
  bool permission = false;
  for (auto& v : st) permission = permission || (!v.empty() && v[0] == GL_E_PERMISSION);
  EXPECT_TRUE(permission);
  for (int r = 0; r < 2; ++r) {
    for (int s : st[r]) EXPECT_NE(s, GL_OK);
  }
  EXPECT_GT(
      cluster.TransportStats(0).errors[static_cast<size_t>(transport::WireError::kAuthFailed)] +
          cluster.TransportStats(1).errors[static_cast<size_t>(transport::WireError::kAuthFailed)],
      0u);
  // The daemons still serve a correct job.
  JobSpec ok{"tcp-after", 2, "p3", "right", AwkwardTensors(), 23, cluster.peers()};
  RunJob(cluster, ok, 2, false);
}

TEST(EngineTcpTest, AFailedJobIdCanBeRegisteredAgainWhileItsSessionsLinger) {
  EngineOptions o = TestOptions();
  o.transport.connect_deadline = 2 * sched::kSecond;
  TcpCluster cluster(2, o, "again");
  JobSpec job{"tcp-again", 2, "bytescheduler", "right", AwkwardTensors(), 25, cluster.peers()};
  RankClient first[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(first[r].Setup(cluster.socket(r), job, r, r == 1 ? "wrong" : ""), GL_OK);
      const int n = first[r].Post(job, r, 0, 0, job.tensors.size());
      for (int s : first[r].Wait(n)) EXPECT_NE(s, GL_OK);
    });
  }
  for (auto& t : threads) t.join();
  // The failed sessions stay open; the same job id, registered anew, runs bit-exact.
  RunJob(cluster, job, 2, false);
}

TEST(EngineTcpTest, PeerDaemonStoppingFailsPendingPosts) {
  TcpCluster cluster(3, TestOptions(), "stop");
  JobSpec job{"tcp-stop", 3, "bytescheduler", "secret", AwkwardTensors(), 24, cluster.peers()};
  std::vector<SurvivorResult> res(3);
  std::atomic<int> done0{0};
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    WaitUntil([&] { return done0.load() == 3; });
    cluster.Stop(2);
    stopped.store(true);
  });
  AfterIterationZero(cluster, job, done0, [&](int r, RankClient& c) {
    WaitUntil([&] { return stopped.load(); });
    if (r == 2) return;
    PostIterationOne(job, r, c, res[r]);
  });
  stopper.join();
  for (int r : {0, 1}) {
    EXPECT_EQ(static_cast<int>(res[r].statuses.size()), res[r].expected);
    int errors = 0;
    for (int s : res[r].statuses) errors += s != GL_OK;
    EXPECT_EQ(errors, res[r].expected) << "rank " << r;
  }
}

// A dial that is abandoned mid-handshake, after the late rank's job became known: the dialer's
// per-attempt timeout ran out while the acceptor's engine thread was busy activating the job, so
// the acceptor accepts the hello (the inbound connection comes up) and then sees it closed. That
// is not the job's peer going down: the dialer redials, and the job must run.
TEST(EngineTcpTest, DialAbandonedMidHandshakeIsRetriedNotFatal) {
  TcpCluster cluster(2, TestOptions(), "abandon");
  JobSpec job{"tcp-abandon", 2, "bytescheduler", "secret", AwkwardTensors(), 26, cluster.peers()};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    RankClient c;
    ASSERT_EQ(c.Setup(cluster.socket(0), job, 0), GL_OK);
    for (int64_t it = 0; it < 2; ++it) {
      if (!c.Iterate(job, 0, it, false)) break;
    }
  });
  // Rank 0 is active (knows the job); rank 1's daemon does not yet.
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (cluster.Stats(0).jobs_active == 0 && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(cluster.Stats(0).jobs_active, 1u);
  // Two attempts "from rank 1" that send a valid hello and close before any manifest: one
  // after reading the kHelloOk (the inbound connection surely came up), one at once.
  for (const bool read_reply : {true, false}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(cluster.port(0));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    transport::FrameHeader h =
        transport::MakeHeader(transport::FrameType::kHello, WireJobId(job.job_id), 1);
    h.payload_bytes = transport::kHelloBodyBytes;
    transport::HelloBody b;
    std::memset(&b, 0, sizeof(b));
    b.rank = 1;
    b.world_size = 2;
    b.token_bytes = static_cast<uint16_t>(job.token.size());
    std::memcpy(b.token, job.token.data(), job.token.size());
    uint8_t msg[sizeof(h) + sizeof(b)];
    std::memcpy(msg, &h, sizeof(h));
    std::memcpy(msg + sizeof(h), &b, sizeof(b));
    ASSERT_EQ(::write(fd, msg, sizeof(msg)), static_cast<ssize_t>(sizeof(msg)));
    if (read_reply) {
      transport::FrameHeader reply{};
      ASSERT_EQ(::recv(fd, &reply, sizeof(reply), MSG_WAITALL),
                static_cast<ssize_t>(sizeof(reply)));
      ASSERT_EQ(transport::TypeOf(reply), transport::FrameType::kHelloOk);
    }
    ::close(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cluster.Stats(0).jobs_failed, 0u);
  // Rank 1 shows up; the job runs bit-exact on both ranks.
  threads.emplace_back([&] {
    RankClient c;
    ASSERT_EQ(c.Setup(cluster.socket(1), job, 1), GL_OK);
    for (int64_t it = 0; it < 2; ++it) {
      if (!c.Iterate(job, 1, it, false)) break;
    }
  });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(cluster.Stats(i).jobs_failed, 0u) << "daemon " << i;
}

// ---- GPUDirect: device tensors whose pushes the daemon sends from GPU memory -----------------
//
// The fake CUDA driver (GRADLANE_CUDA_LIBRARY) backs each allocation with a memfd and exports it
// as the "dma-buf"; the fake transport maps it and reads it as a NIC would. Every iteration
// writes new values into device memory only: a push read from the arena where the client did
// not stage it, or a local contribution the client failed to stage, sums stale bytes and the
// bit-exact check fails.

using fakes::FakeCudaCounts;

using fakes::FakeCounts;

// One rank whose tensors live in (fake) GPU memory.
class DeviceRankClient {
 public:
  ~DeviceRankClient() {
    if (c_ != nullptr) gl_close(c_);
    for (client::cu::DevicePtr p : allocations_) cuda_->MemFree(p);
  }
  // `one_allocation`: every tensor in one cuMemAlloc, as a caching allocator places them.
  int Setup(const std::string& socket, const JobSpec& job, int rank, bool one_allocation = false) {
    auto d = client::LoadCudaDriver();
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return GL_E_DEVICE;
    cuda_ = *d;
    client::cu::Context ctx = nullptr;
    client::cu::Device dev{};
    EXPECT_EQ(cuda_->DeviceGet(&dev, 0), client::cu::kSuccess);
    EXPECT_EQ(cuda_->DevicePrimaryCtxRetain(&ctx, dev), client::cu::kSuccess);
    EXPECT_EQ(cuda_->CtxSetCurrent(ctx), client::cu::kSuccess);
    gl_connect_options o{};
    o.socket_path = socket.c_str();
    o.arena_bytes = 8 << 20;
    o.timeout_ms = 10000;
    int s = gl_connect(&o, &c_);
    if (s != GL_OK) return s;
    if ((s = RegisterJobFor(c_, job, rank, job.token)) != GL_OK) return s;
    uint64_t total = 0;
    for (const TensorDef& t : job.tensors) total += (t.bytes + 255) / 256 * 256;
    client::cu::DevicePtr shared = 0;
    if (one_allocation) {
      EXPECT_EQ(cuda_->MemAlloc(&shared, total), client::cu::kSuccess);
      allocations_.push_back(shared);
    }
    for (const TensorDef& t : job.tensors) {
      client::cu::DevicePtr p = shared;
      if (one_allocation) {
        shared += (t.bytes + 255) / 256 * 256;
      } else {
        EXPECT_EQ(cuda_->MemAlloc(&p, t.bytes), client::cu::kSuccess);
        allocations_.push_back(p);
      }
      ptrs_.push_back(p);
      uint32_t id = 0;
      s = gl_register_device_tensor(c_, t.name.c_str(), reinterpret_cast<void*>(p), t.bytes,
                                    t.dtype, t.priority, &id);
      if (s != GL_OK) return s;
      ids_.push_back(id);
    }
    return GL_OK;
  }
  // Writes this rank's values of `iter` into device memory, posts every tensor (the larger ones
  // in two ranges split inside a partition), waits, and checks each result in device memory.
  bool Iterate(const JobSpec& job, int rank, int64_t iter) {
    int posts = 0;
    for (size_t ti = 0; ti < job.tensors.size(); ++ti) {
      const TensorDef& t = job.tensors[ti];
      std::vector<uint8_t> v(t.bytes);
      Fill(t, v.data(), job.seed, rank, iter, ti);
      EXPECT_EQ(cuda_->MemcpyHtoD(ptrs_[ti], v.data(), v.size()), client::cu::kSuccess);
      EXPECT_EQ(cuda_->CtxSynchronize(), client::cu::kSuccess);
      const uint64_t elem = t.dtype == GL_DTYPE_F32 ? 4 : 2;
      if (t.bytes >= 2 * kPartition) {
        const uint64_t half = (t.bytes / elem / 2) * elem + elem;
        EXPECT_EQ(gl_post(c_, ids_[ti], iter, 0, half, ti), GL_OK) << gl_last_error(c_);
        EXPECT_EQ(gl_post(c_, ids_[ti], iter, half, GL_WHOLE_TENSOR, ti), GL_OK);
        posts += 2;
      } else {
        EXPECT_EQ(gl_post(c_, ids_[ti], iter, 0, GL_WHOLE_TENSOR, ti), GL_OK) << gl_last_error(c_);
        posts += 1;
      }
    }
    int got = 0;
    const auto end = Clock::now() + std::chrono::seconds(15);
    while (got < posts && Clock::now() < end) {
      gl_completion cs[64];
      uint32_t count = 0;
      if (gl_wait(c_, cs, 64, &count, 100) == GL_E_DISCONNECTED) break;
      for (uint32_t k = 0; k < count; ++k) {
        EXPECT_EQ(cs[k].status, GL_OK) << gl_strerror(cs[k].status) << " rank " << rank;
        ++got;
      }
    }
    EXPECT_EQ(got, posts) << "rank " << rank << " iteration " << iter;
    bool ok = got == posts;
    for (size_t ti = 0; ti < job.tensors.size(); ++ti) {
      const TensorDef& t = job.tensors[ti];
      std::vector<uint8_t> out(t.bytes);
      EXPECT_EQ(cuda_->MemcpyDtoH(out.data(), ptrs_[ti], t.bytes), client::cu::kSuccess);
      if (out != Reference(t, job.seed, job.world, iter, ti, /*mean=*/false)) {
        ADD_FAILURE() << "rank " << rank << " iteration " << iter << " tensor " << t.name
                      << ": result differs from the rank-ordered reference";
        ok = false;
      }
    }
    return ok;
  }
  gl_client* c() { return c_; }
  size_t tensors() const { return ids_.size(); }
  uint32_t id(size_t ti) const { return ids_[ti]; }

 private:
  const client::CudaDriver* cuda_ = nullptr;
  gl_client* c_ = nullptr;
  std::vector<client::cu::DevicePtr> allocations_;  // what to free
  std::vector<client::cu::DevicePtr> ptrs_;         // by tensor
  std::vector<uint32_t> ids_;
};

std::vector<TensorDef> DeviceTensors() {
  return {
      {"f32_multi", 6 * kPartition + 12, GL_DTYPE_F32, 0},
      {"f16_multi", 5 * kPartition + 2, GL_DTYPE_F16, 1},
      {"bf16_odd", 1001 * 2, GL_DTYPE_BF16, 2},
      {"f32_one", 4, GL_DTYPE_F32, 3},
  };
}

struct DeviceRun {
  uint64_t staged = 0, direct = 0, posted = 0;
  int direct_tensors = 0;
  std::string note;
};

// Runs `iterations` of `job` with device tensors, one client thread per rank; each rank calls
// `before_close(rank)` (if given) after its last iteration, while its job is still up.
std::vector<DeviceRun> RunDeviceJob(Cluster& cluster, const JobSpec& job, int iterations,
                                    bool one_allocation = false,
                                    std::function<void(int)> before_close = nullptr) {
  std::vector<DeviceRun> runs(job.world);
  std::vector<std::thread> threads;
  for (int r = 0; r < job.world; ++r) {
    threads.emplace_back([&, r] {
      DeviceRankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r, one_allocation), GL_OK) << gl_last_error(c.c());
      for (int64_t it = 0; it < iterations; ++it) {
        if (!c.Iterate(job, r, it)) break;
      }
      if (before_close) before_close(r);
      const char* note = "";
      for (size_t ti = 0; ti < c.tensors(); ++ti) {
        runs[r].direct_tensors +=
            gl_testing_gpudirect(c.c(), c.id(ti), &runs[r].staged, &runs[r].direct, &note);
      }
      runs[r].note = note;
      for (const TensorDef& t : job.tensors) runs[r].posted += t.bytes * iterations;
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

TEST(EngineGpuDirectTest, PushesGoStraightFromGpuMemoryAndOnlyTheLocalShardIsStaged) {
  Cluster cluster(3, TestOptions(), "gpudirect");
  JobSpec job{"job-gpudirect", 3, "bytescheduler", "secret", DeviceTensors(), 21};
  ASSERT_TRUE(client::LoadCudaDriver().ok());  // so that its counts can be read before the run
  const FakeCudaCounts before = FakeCounts();
  std::vector<uint64_t> eager_refused(3, 1);
  const std::vector<DeviceRun> runs =
      RunDeviceJob(cluster, job, 4, /*one_allocation=*/false, [&](int r) {
        cluster.OnDriver([&] { eager_refused[r] = cluster.fake(r)->device_eager_refused(); });
      });
  const FakeCudaCounts after = FakeCounts();
  // Every segment into GPU memory came flagged for rendezvous (the fake refuses others).
  EXPECT_EQ(eager_refused, std::vector<uint64_t>(3, 0));
  EXPECT_EQ(after.dmabuf_exports - before.dmabuf_exports, 3 * job.tensors.size());
  uint64_t staged = 0;
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(runs[r].direct_tensors, static_cast<int>(job.tensors.size())) << runs[r].note;
    EXPECT_EQ(runs[r].staged + runs[r].direct, runs[r].posted);
    // Iteration 0 is staged whole (the map is published by its first post); after that about a
    // third of the bytes is this host's shard. Some partitions are another host's on every rank.
    EXPECT_GT(runs[r].direct, 0u);
    EXPECT_LT(runs[r].staged, runs[r].posted);
    staged += runs[r].staged;
    const EngineStats st = cluster.Stats(r);
    EXPECT_EQ(st.device_tensors, job.tensors.size());
    EXPECT_EQ(st.device_registrations_refused, 0u);
    EXPECT_EQ(st.jobs_failed, 0u);
  }
  // What the client copied from the GPU is exactly what it says it staged.
  EXPECT_EQ(after.bytes_to_host - before.bytes_to_host, staged);
  // Results: the other shards' NICs wrote theirs into GPU memory; only the local shard's were
  // copied back (every completion came after the map, so less than what was staged, which
  // includes the first iteration whole), and the writes were flushed before each hand-out.
  const uint64_t copied_back = after.bytes_to_device - before.bytes_to_device;
  uint64_t posted = 0;
  for (const DeviceRun& r : runs) posted += r.posted;
  std::cout << "GPUDirect, 3 ranks x 4 iterations: " << posted << " bytes posted, " << staged
            << " staged GPU -> arena, " << copied_back << " copied back arena -> GPU; the rest "
            << "read and written by the (fake) NIC in GPU memory\n";
  EXPECT_GT(copied_back, 0u);
  EXPECT_LT(copied_back, staged);
  EXPECT_GT(after.gpudirect_flushes, before.gpudirect_flushes);
}

// Tensors that share one allocation (a caching allocator's segment) share one export and one
// registration: one dma-buf per client, one device region per daemon, results still exact.
TEST(EngineGpuDirectTest, TensorsInOneAllocationShareOneExportAndOneRegistration) {
  Cluster cluster(3, TestOptions(), "gpudirect-shared");
  JobSpec job{"job-gpudirect-shared", 3, "bytescheduler", "secret", DeviceTensors(), 25};
  ASSERT_TRUE(client::LoadCudaDriver().ok());
  const FakeCudaCounts before = FakeCounts();
  std::vector<size_t> regions(3, 0);
  const std::vector<DeviceRun> runs =
      RunDeviceJob(cluster, job, 3, /*one_allocation=*/true, [&](int r) {
        cluster.OnDriver([&] { regions[r] = cluster.fake(r)->device_regions(); });
      });
  EXPECT_EQ(FakeCounts().dmabuf_exports - before.dmabuf_exports, 3u);  // one per client
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(runs[r].direct_tensors, static_cast<int>(job.tensors.size())) << runs[r].note;
    EXPECT_GT(runs[r].direct, 0u);
    EXPECT_EQ(regions[r], 1u) << "daemon " << r;
    EXPECT_EQ(cluster.Stats(r).device_tensors, job.tensors.size());
  }
}

// A transport that cannot send from GPU memory (the default RegisterDeviceRegion_st, as TCP and
// DPDK) although it said it could: the job registers nothing, every tensor stays staged whole,
// the results are exact, and the refusal is counted.
TEST(EngineGpuDirectTest, ABackendThatRefusesGpuMemoryLeavesTensorsStagedAndExact) {
  TestRegistrar registrar;
  Cluster cluster(2, TestOptions(), "gpudirect-refused", nullptr, &registrar);
  JobSpec job{"job-gpudirect-refused", 2, "bytescheduler", "secret", DeviceTensors(), 22};
  const std::vector<DeviceRun> runs = RunDeviceJob(cluster, job, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[r].direct_tensors, 0);
    EXPECT_EQ(runs[r].direct, 0u);
    EXPECT_EQ(runs[r].staged, runs[r].posted);
    EXPECT_EQ(cluster.Stats(r).device_registrations_refused, job.tensors.size());
    EXPECT_EQ(cluster.Stats(r).device_tensors, 0u);
  }
}

// All-reduce jobs reduce on the CPU at every hop: their device tensors stay staged.
TEST(EngineGpuDirectTest, AllReduceJobsStageDeviceTensors) {
  Cluster cluster(3, TestOptions(), "gpudirect-ar");
  JobSpec job{"job-gpudirect-ar",  3,  "bytescheduler",  "secret", DeviceTensors(),
              23 | kIntegerValues, {}, GL_MODE_ALLREDUCE};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      DeviceRankClient c;
      ASSERT_EQ(c.Setup(cluster.socket(r), job, r), GL_OK);
      EXPECT_TRUE(c.Iterate(job, r, 0));
      for (size_t ti = 0; ti < c.tensors(); ++ti) {
        EXPECT_EQ(gl_testing_gpudirect(c.c(), c.id(ti), nullptr, nullptr, nullptr), 0);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(cluster.Stats(r).device_tensors, 0u);
}

// The daemon's side of GL_MSG_ATTACH_DEVICE: what it refuses, and why, with the session going on.
gl_reply AttachRaw(gl_client* c, uint32_t tensor_id, uint64_t offset, uint64_t bytes,
                   std::span<const int> fds, uint32_t reserved = 0) {
  static std::atomic<uint64_t> next{1000};
  gl_msg_attach_device m{};
  m.header.type = GL_MSG_ATTACH_DEVICE;
  m.header.length = sizeof(m);
  m.header.request_id = next++;
  m.tensor_id = tensor_id;
  m.reserved = reserved;
  m.dmabuf_offset = offset;
  m.dmabuf_bytes = bytes;
  m.device_address = 1 << 20;
  gl_reply r{};
  r.status = -1;
  const int sock = gl_testing_socket_fd(c);
  EXPECT_TRUE(shm::SendMessage(sock, &m, sizeof(m), fds).ok());
  for (int i = 0; i < 100; ++i) {
    if (!shm::WaitReadable(sock, 5000).ok()) break;
    std::array<shm::UniqueFd, shm::kMaxPassedFds> stray;
    auto rx = shm::ReceiveMessage(sock, &r, sizeof(r), stray);
    if (!rx.ok() || rx->eof) break;
    if (r.header.request_id == m.header.request_id) return r;
  }
  ADD_FAILURE() << "no reply to attach_device";
  return r;
}

TEST(EngineGpuDirectTest, AttachRefusalsAreClearAndTheSessionGoesOn) {
  Cluster cluster(1, TestOptions(), "gpudirect-attach");
  RankClient c;
  JobSpec job{"job-attach", 1, "bytescheduler", "secret", DeviceTensors(), 24};
  ASSERT_EQ(c.Setup(cluster.socket(0), job, 0), GL_OK);
  const int memfd = ::memfd_create("dmabuf", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, 1 << 20), 0);
  const uint64_t t0 = job.tensors[0].bytes;
  const int one[1] = {memfd};
  const int two[2] = {memfd, memfd};
  gl_reply r = AttachRaw(c.c(), 0, 0, 1 << 20, {});
  EXPECT_EQ(r.status, GL_E_PROTOCOL) << r.message;
  EXPECT_NE(std::string(r.message).find("0 file descriptors"), std::string::npos) << r.message;
  EXPECT_EQ(AttachRaw(c.c(), 0, 0, 1 << 20, two).status, GL_E_PROTOCOL);
  EXPECT_EQ(AttachRaw(c.c(), 0, 0, 1 << 20, one, /*reserved=*/1).status, GL_E_INVALID_ARGUMENT);
  EXPECT_EQ(AttachRaw(c.c(), 99, 0, 1 << 20, one).status, GL_E_BAD_TENSOR);
  r = AttachRaw(c.c(), 0, (1 << 20) - t0 + 4, 1 << 20, one);  // the tensor runs past the end
  EXPECT_EQ(r.status, GL_E_INVALID_ARGUMENT) << r.message;
  EXPECT_NE(std::string(r.message).find("does not lie in its dma-buf"), std::string::npos);
  EXPECT_EQ(AttachRaw(c.c(), 0, 0, 1 << 20, one).status, GL_OK);
  r = AttachRaw(c.c(), 0, 0, 1 << 20, one);
  EXPECT_EQ(r.status, GL_E_ALREADY_EXISTS) << r.message;
  // The job starts (W = 1: nothing is sent, so the memfd is only registered, never read).
  const int n = c.Post(job, 0, 0, 1, job.tensors.size());
  EXPECT_EQ(c.Wait(n).size(), static_cast<size_t>(n));
  r = AttachRaw(c.c(), 1, 0, 1 << 20, one);
  EXPECT_EQ(r.status, GL_E_PROTOCOL) << r.message;
  EXPECT_NE(std::string(r.message).find("before the job's first post"), std::string::npos)
      << r.message;
  EXPECT_EQ(cluster.Stats(0).device_tensors, 1u);
  ::close(memfd);
}

}  // namespace
}  // namespace gradlane::daemon
