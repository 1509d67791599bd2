// tests/integration/client_flags.h — the command-line flags and job set-up that gradlane-check
// and gradlane-replay share: `--name=value` or `--name value`, no exceptions, clear errors.
//
// Both tools are test clients, not product code: they parse by hand (no absl flags) so a
// malformed flag is reported with the tool's own usage line and exit code 2.
#ifndef GRADLANE_TESTS_INTEGRATION_CLIENT_FLAGS_H_
#define GRADLANE_TESTS_INTEGRATION_CLIENT_FLAGS_H_

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "libclient/gradlane.h"

namespace gradlane::testing {

// Flags as a name -> value map. Boolean flags (`--expect-failure`) map to "true".
class Flags {
 public:
  // Parses argv. `boolean` names the flags that take no value. On error prints to stderr and
  // returns false.
  bool Parse(int argc, char** argv, const std::vector<std::string>& known,
             const std::vector<std::string>& boolean) {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a.size() < 3 || a.substr(0, 2) != "--") {
        std::fprintf(stderr, "error: unexpected argument '%s'\n", argv[i]);
        return false;
      }
      a.remove_prefix(2);
      std::string name, value;
      const size_t eq = a.find('=');
      bool has_value = eq != std::string_view::npos;
      name = std::string(has_value ? a.substr(0, eq) : a);
      if (has_value) value = std::string(a.substr(eq + 1));
      const bool is_bool = Contains(boolean, name);
      if (!is_bool && !Contains(known, name)) {
        std::fprintf(stderr, "error: unknown flag --%s\n", name.c_str());
        return false;
      }
      if (is_bool) {
        if (!has_value) value = "true";
      } else if (!has_value) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "error: flag --%s needs a value\n", name.c_str());
          return false;
        }
        value = argv[++i];
      }
      values_[name] = value;
    }
    return true;
  }

  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Str(const std::string& name, const std::string& def = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  bool Bool(const std::string& name) const {
    auto it = values_.find(name);
    return it != values_.end() && (it->second == "true" || it->second == "1");
  }
  // Integer flag; on a malformed value prints an error and sets *ok = false.
  int64_t Int(const std::string& name, int64_t def, bool* ok) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    std::optional<int64_t> v = ParseInt(it->second);
    if (!v) {
      std::fprintf(stderr, "error: --%s=%s is not an integer\n", name.c_str(), it->second.c_str());
      *ok = false;
      return def;
    }
    return *v;
  }

  static std::optional<int64_t> ParseInt(std::string_view s) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
    return v;
  }

  static std::vector<std::string> Split(std::string_view s, char sep) {
    std::vector<std::string> out;
    if (s.empty()) return out;
    size_t start = 0;
    while (true) {
      const size_t p = s.find(sep, start);
      out.emplace_back(s.substr(start, p == std::string_view::npos ? s.npos : p - start));
      if (p == std::string_view::npos) break;
      start = p + 1;
    }
    return out;
  }

 private:
  static bool Contains(const std::vector<std::string>& v, const std::string& s) {
    for (const auto& x : v)
      if (x == s) return true;
    return false;
  }
  std::map<std::string, std::string> values_;
};

// The job flags both tools take.
inline const std::vector<std::string>& JobFlagNames() {
  static const std::vector<std::string> k = {"socket", "job",   "rank",       "world",    "peers",
                                             "policy", "token", "timeout_ms", "arena_mb", "mode"};
  return k;
}

struct JobFlags {
  std::string socket;
  std::string job;
  uint32_t rank = 0;
  uint32_t world = 1;
  std::vector<std::string> peers;
  std::string policy;
  std::string token;
  int timeout_ms = 30000;         // control calls and each wait for a completion
  gl_job_mode mode = GL_MODE_PS;  // --mode=ps|allreduce
};

// Reads and checks the job flags. Prints the problem and returns false on error.
inline bool ReadJobFlags(const Flags& f, JobFlags* out) {
  bool ok = true;
  out->socket = f.Str("socket");
  out->job = f.Str("job");
  const int64_t rank = f.Int("rank", -1, &ok);
  const int64_t world = f.Int("world", -1, &ok);
  out->peers = Flags::Split(f.Str("peers"), ',');
  out->policy = f.Str("policy");
  out->token = f.Str("token");
  out->timeout_ms = static_cast<int>(f.Int("timeout_ms", 30000, &ok));
  if (!ok) return false;
  const std::string mode = f.Str("mode", "ps");
  if (mode != "ps" && mode != "allreduce") {
    std::fprintf(stderr, "error: --mode must be ps or allreduce (got '%s')\n", mode.c_str());
    return false;
  }
  out->mode = mode == "allreduce" ? GL_MODE_ALLREDUCE : GL_MODE_PS;
  if (out->socket.empty() || out->job.empty()) {
    std::fprintf(stderr, "error: --socket and --job are required\n");
    return false;
  }
  if (world < 1 || rank < 0 || rank >= world) {
    std::fprintf(stderr, "error: need 0 <= --rank < --world (got rank %lld, world %lld)\n",
                 static_cast<long long>(rank), static_cast<long long>(world));
    return false;
  }
  out->rank = static_cast<uint32_t>(rank);
  out->world = static_cast<uint32_t>(world);
  if (!out->peers.empty() && out->peers.size() != out->world) {
    std::fprintf(stderr, "error: --peers lists %zu addresses, --world is %u\n", out->peers.size(),
                 out->world);
    return false;
  }
  if (out->timeout_ms <= 0) {
    std::fprintf(stderr, "error: --timeout_ms must be positive\n");
    return false;
  }
  return true;
}

// Connects and registers the job. On failure prints "<what>: <status> (<detail>)" to stderr and
// returns the gl_status (non-zero); *client is then closed/null. *connected tells whether the
// failure came after a successful connect (i.e. the daemon refused the job).
inline int ConnectAndRegister(const JobFlags& jf, uint64_t arena_bytes, gl_client** client,
                              bool* connected) {
  *client = nullptr;
  *connected = false;
  gl_connect_options o{};
  o.socket_path = jf.socket.c_str();
  o.arena_bytes = arena_bytes;
  o.timeout_ms = jf.timeout_ms;
  gl_client* c = nullptr;
  int s = gl_connect(&o, &c);
  if (s != GL_OK) {
    std::fprintf(stderr, "error: gl_connect(%s): %s (%s)\n", jf.socket.c_str(), gl_strerror(s),
                 gl_last_error(nullptr));
    return s;
  }
  *connected = true;
  std::vector<const char*> peers;
  for (const auto& p : jf.peers) peers.push_back(p.c_str());
  gl_job_info info{};
  info.job_id = jf.job.c_str();
  info.rank = jf.rank;
  info.world_size = jf.world;
  info.peers = peers.empty() ? nullptr : peers.data();
  info.num_peers = static_cast<uint32_t>(peers.size());
  info.policy = jf.policy.empty() ? nullptr : jf.policy.c_str();
  info.auth_token = jf.token.empty() ? nullptr : jf.token.c_str();
  s = gl_register_job_mode(c, &info, jf.mode);
  if (s != GL_OK) {
    std::fprintf(stderr,
                 "error: gl_register_job(job %s, rank %u/%u, policy %s, mode %s): %s (%s)\n",
                 jf.job.c_str(), jf.rank, jf.world, jf.policy.c_str(),
                 jf.mode == GL_MODE_ALLREDUCE ? "allreduce" : "ps", gl_strerror(s),
                 gl_last_error(c));
    gl_close(c);
    return s;
  }
  *client = c;
  return GL_OK;
}

}  // namespace gradlane::testing

#endif  // GRADLANE_TESTS_INTEGRATION_CLIENT_FLAGS_H_
