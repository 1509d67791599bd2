// daemon/config.h — gradlaned's configuration: absl flags (and --flagfile, absl's built-in),
// validated into an EngineOptions.
//
// Flags (the contract other tools are written against; see docs/daemon.md):
//   --socket=PATH            client Unix socket (default /run/gradlane/gradlaned.sock)
//   --listen=HOST:PORT       peer port (default 0.0.0.0:7610; port 0 picks a free one)
//   --peer_timeout=10s       a peer silent this long with work pending is down
//   --connect_timeout=60s    how long a job waits for all its peers to come up
//   --default_policy=gradlane        fifo | p3 | bytescheduler | prophet | gradlane
//   --reduce=sum|mean
//   --allowed_uids= --allowed_gids=  comma-separated; both empty: the daemon's uid and root
//   --arena_bytes            default per-session arena (0: the session server's default)
//   --max_arena_bytes        largest arena a client may ask for
//   --partition_bytes --credit_bytes  policy knobs (0: each policy's default)
//   --autotune               bytescheduler: tune the credit window online (BO)
//
// Guarantees: parsing never exits the process on a bad value; every problem comes back as an
// InvalidArgument status naming the flag. Thread rules: call from main before threads start.
#ifndef GRADLANE_DAEMON_CONFIG_H_
#define GRADLANE_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "daemon/engine.h"
#include "transport/dpdk/dpdk_transport.h"
#include "transport/verbs/verbs_options.h"

namespace gradlane::daemon {

// "host:port" or "[v6]:port" → (host, port). Port must be 0..65535.
absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(absl::string_view s);

// Reads the gradlaned flags (after absl::ParseCommandLine) into engine options.
absl::StatusOr<EngineOptions> OptionsFromFlags();

// --transport=tcp|dpdk|verbs and, for dpdk, the --dpdk_* flags (EAL, port, address, faults),
// for verbs the --verbs_* flags (device, port, GID index).
struct TransportChoice {
  std::string name = "tcp";
  transport::dpdk::DpdkOptions dpdk;
  transport::verbs::VerbsOptions verbs;
};
absl::StatusOr<TransportChoice> TransportFromFlags();

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_CONFIG_H_
