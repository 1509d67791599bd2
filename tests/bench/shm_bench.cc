// shm_bench — data-path overheads of the shared-memory queue (docs/design.md §5.3), as a plain
// timing program (percentiles, which Google Benchmark does not report):
//   1. ring post-to-visible latency between two processes, consumer spinning;
//   2. the same with the consumer asleep on its doorbell (eventfd wake-up included);
//   3. ring throughput, descriptors per second, producer and consumer in two processes;
//   4. libgradlane round trip (gl_post -> in-process session server -> completion seen by
//      gl_poll/gl_wait), server spinning and server sleeping; and its pipelined throughput.
// Usage: shm_bench [--quick]. Figures depend on the machine and on what else runs on it.
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/session_server.h"
#include "libclient/gradlane.h"
#include "shm/arena.h"
#include "shm/doorbell.h"
#include "shm/ring.h"

namespace {

using namespace gradlane::shm;

int64_t Now() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void BusyUntil(int64_t t) {
  while (Now() < t) {
  }
}

struct Summary {
  double median_ns, p99_ns;
};
Summary Summarise(std::vector<int64_t>& v) {
  std::sort(v.begin(), v.end());
  return {static_cast<double>(v[v.size() / 2]), static_cast<double>(v[v.size() * 99 / 100])};
}

void PrintLatency(const char* what, std::vector<int64_t>& v) {
  const Summary s = Summarise(v);
  std::printf("%-58s median %8.2f us   p99 %8.2f us   (n=%zu)\n", what, s.median_ns / 1e3,
              s.p99_ns / 1e3, v.size());
}

struct SharedRing {
  explicit SharedRing(uint32_t slots) : n(slots) {
    auto a = Arena::Create("bench", kPageSize + RingBytes<gl_sqe>(slots));
    if (!a.ok()) std::abort();
    arena = std::move(*a);
    header = static_cast<gl_ring_header*>(arena.At(kPageSize, sizeof(gl_ring_header)));
    if (header == nullptr) std::abort();
    slots_ptr = reinterpret_cast<gl_sqe*>(header + 1);
    InitRing(header, slots_ptr, n);
    efd = std::move(*CreateEventFd());
  }
  uint32_t n;
  Arena arena;
  gl_ring_header* header;
  gl_sqe* slots_ptr;
  UniqueFd efd;
};

// The producer (a child process) stamps each descriptor with CLOCK_MONOTONIC just before the
// push; the consumer (this process) subtracts it from the time it sees the entry. Closed
// loop: the producer waits until the entry was consumed before the gap and the next one, so a
// descheduled consumer spoils one sample, not the thousands an open loop would queue up.
std::vector<int64_t> RingLatency(bool sleeping_consumer, int count, int64_t gap_ns) {
  SharedRing ring(1024);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    RingProducer<gl_sqe> p(ring.header, ring.slots_ptr, ring.n);
    Doorbell bell(ring.header, ring.efd.get());
    BusyUntil(Now() + 20'000'000);  // let the consumer settle
    for (int i = 0; i < count; ++i) {
      BusyUntil(Now() + gap_ns);  // an empty ring: the consumer is spinning or asleep
      gl_sqe e{};
      e.user_data = static_cast<uint64_t>(Now());
      while (p.TryPush(e) != RingResult::kOk) {
      }
      bell.NotifyIfArmed();
      while (Shared(ring.header->head).load(std::memory_order_acquire) < p.tail()) {
      }
    }
    ::_exit(0);
  }
  RingConsumer<gl_sqe> c(ring.header, ring.slots_ptr, ring.n);
  Doorbell bell(ring.header, ring.efd.get());
  std::vector<int64_t> lat;
  lat.reserve(count);
  while (static_cast<int>(lat.size()) < count) {
    gl_sqe e;
    if (c.TryPop(&e) == RingResult::kOk) {
      lat.push_back(Now() - static_cast<int64_t>(e.user_data));
      continue;
    }
    if (!sleeping_consumer) continue;
    bell.Arm();
    if (!c.HasEntry()) bell.Wait(1000);
    bell.Drain();
    bell.Disarm();
  }
  ::waitpid(pid, nullptr, 0);
  return lat;
}

double RingThroughput(uint64_t count) {
  SharedRing ring(1024);
  std::atomic_ref<uint32_t> go(ring.header->reserved0);  // start flag in a spare header word
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    RingProducer<gl_sqe> p(ring.header, ring.slots_ptr, ring.n);
    Doorbell bell(ring.header, ring.efd.get());
    while (go.load() == 0) {
    }
    gl_sqe e{};
    for (uint64_t i = 0; i < count;) {
      e.user_data = i;
      if (p.TryPush(e) == RingResult::kOk) {
        bell.NotifyIfArmed();  // as gl_post does: a fence and a load per post
        ++i;
      } else {
        ::sched_yield();  // full: if the consumer shares our core, let it run
      }
    }
    ::_exit(0);
  }
  RingConsumer<gl_sqe> c(ring.header, ring.slots_ptr, ring.n);
  gl_sqe batch[64];
  uint64_t got = 0, bad = 0;
  const int64_t t0 = Now();
  go.store(1);
  while (got < count) {
    RingResult r;
    const uint32_t n = c.TryPopBatch(batch, 64, &r);
    for (uint32_t k = 0; k < n; ++k) bad += batch[k].user_data != got + k;
    got += n;
    if (n == 0) ::sched_yield();  // empty: same reason
  }
  const int64_t t1 = Now();
  ::waitpid(pid, nullptr, 0);
  if (bad != 0) std::printf("ERROR: %llu out-of-order descriptors\n", (unsigned long long)bad);
  return static_cast<double>(count) / ((t1 - t0) / 1e9);
}

// libgradlane against the in-process session server. `spinning_server`: the server thread
// calls PollOnce_st in a loop; otherwise it sleeps in Wait_st() whenever idle (the default Run_st).
struct ClientBench {
  explicit ClientBench(bool spinning_server, bool yield_when_idle = false)
      : yield(yield_when_idle) {
    char tmpl[] = "/tmp/gradlane-bench-XXXXXX";
    dir = ::mkdtemp(tmpl);
    gradlane::daemon::SessionServerOptions o;
    o.socket_path = dir + "/gradlaned.sock";
    o.loopback_complete = true;
    server = std::move(*gradlane::daemon::SessionServer::Create(o));
    thread = std::thread([this, spinning_server] {
      if (!spinning_server) return server->Run_st(stop, 100);
      while (!stop.load(std::memory_order_relaxed)) {
        if (server->PollOnce_st(gradlane::daemon::SessionServer::MonotonicNow()) == 0 && yield) {
          ::sched_yield();
        }
      }
    });
    gl_connect_options co{};
    co.socket_path = server->socket_path().c_str();
    co.ring_slots = 1024;
    if (gl_connect(&co, &c) != GL_OK) std::abort();
    gl_job_info job{"bench", 0, 1, nullptr, 0, "fifo", nullptr};
    if (gl_register_job(c, &job) != GL_OK) std::abort();
    void* buf;
    if (gl_register_tensor(c, "t", 1 << 20, GL_DTYPE_F32, 0, &id, &buf) != GL_OK) std::abort();
  }
  ~ClientBench() {
    gl_close(c);
    stop.store(true);
    thread.join();
    server.reset();
    ::rmdir(dir.c_str());
  }
  std::string dir;
  std::unique_ptr<gradlane::daemon::SessionServer> server;
  std::atomic<bool> stop{false};
  bool yield = false;  // throughput runs: an idle spinner yields its core
  std::thread thread;
  gl_client* c = nullptr;
  uint32_t id = 0;
};

std::vector<int64_t> ClientRoundTrip(bool spinning_server, int count, int64_t gap_ns) {
  ClientBench b(spinning_server);
  std::vector<int64_t> lat;
  lat.reserve(count);
  gl_completion out;
  for (int i = 0; i < count; ++i) {
    BusyUntil(Now() + gap_ns);
    const int64_t t0 = Now();
    if (gl_post(b.c, b.id, i, 0, 4096, i) != GL_OK) std::abort();  // each byte once per iteration
    uint32_t n = 0;
    if (gl_wait(b.c, &out, 1, &n, 1000) != GL_OK || n != 1 || out.status != GL_OK) std::abort();
    lat.push_back(Now() - t0);
  }
  return lat;
}

double ClientThroughput(uint64_t count) {
  ClientBench b(true, true);
  gl_completion out[256];
  uint64_t posted = 0, done = 0;
  const int64_t t0 = Now();
  while (done < count) {
    while (posted < count && gl_post(b.c, b.id, static_cast<int64_t>(posted / 256),
                                     (posted % 256) * 4096, 4096, posted) == GL_OK) {
      ++posted;
    }
    uint32_t n = 0;
    gl_poll(b.c, out, 256, &n);
    done += n;
    if (n == 0) ::sched_yield();
  }
  return static_cast<double>(count) / ((Now() - t0) / 1e9);
}

double LoadAverage() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int lat_n = quick ? 20'000 : 200'000;
  const int sleep_n = quick ? 2'000 : 20'000;
  const uint64_t tput_n = quick ? 2'000'000 : 20'000'000;
  // Spinning figures mean something only with a free core per spinner: report the load.
  std::printf("gradlane shm_bench (%u CPUs online, load average %.2f)\n",
              std::thread::hardware_concurrency(), LoadAverage());

  auto spin = RingLatency(false, lat_n, 2'000);
  PrintLatency("ring post-to-visible, consumer spinning (2 processes)", spin);
  auto sleep = RingLatency(true, sleep_n, 100'000);
  PrintLatency("ring post-to-visible, consumer sleeping (eventfd wake)", sleep);
  std::printf("%-58s %8.1f M descriptors/s\n", "ring throughput (2 processes, 1024 slots)",
              RingThroughput(tput_n) / 1e6);

  auto rt_spin = ClientRoundTrip(true, lat_n / 4, 2'000);
  PrintLatency("libgradlane post -> completion, server spinning", rt_spin);
  auto rt_sleep = ClientRoundTrip(false, sleep_n, 100'000);
  PrintLatency("libgradlane post -> completion, server sleeping", rt_sleep);
  std::printf("%-58s %8.1f M descriptors/s\n", "libgradlane pipelined post+complete (loopback)",
              ClientThroughput(tput_n / 4) / 1e6);
  return 0;
}
