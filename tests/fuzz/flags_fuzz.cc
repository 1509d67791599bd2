// Fuzz target: gradlaned's flag values (daemon/config.h) — what an operator's command line or
// --flagfile, possibly templated by deploy tooling, hands the daemon. Each input line
// "name=value" is parsed into the named flag the way absl's command-line parser does
// (CommandLineFlag::ParseFrom, which reports a bad value instead of exiting), then the daemon's
// own validation runs: OptionsFromFlags and TransportFromFlags, whose contract is an
// InvalidArgument naming the flag for every bad combination, never an exit or a crash. Every
// value also goes through the address parsers behind --listen / --metrics_address and the DPDK
// peers (ParseHostPort, ParseIpv4Endpoint).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "daemon/config.h"
#include "transport/datagram/datagram_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // absl::string_view throughout: this absl's flag and string APIs predate std::string_view.
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::FlagSaver restore;  // each input starts from the defaults
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (++lines > 64) break;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    while (!line.empty() && line.front() == '-') line.remove_prefix(1);  // "--name=value" too
    const size_t eq = line.find('=');
    const absl::string_view name = line.substr(0, eq);
    const absl::string_view value =
        eq == absl::string_view::npos ? absl::string_view() : line.substr(eq + 1);
    (void)gradlane::daemon::ParseHostPort(value);
    (void)gradlane::transport::datagram::ParseIpv4Endpoint(
        std::string_view(value.data(), value.size()));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string error;
    (void)flag->ParseFrom(value, &error);
  }
  auto options = gradlane::daemon::OptionsFromFlags();
  if (!options.ok() && !absl::IsInvalidArgument(options.status())) std::abort();
  if (options.ok()) {
    if (options->sessions.socket_path.empty() || options->transport.peer_timeout <= 0 ||
        options->transport.connect_deadline <= 0 ||
        options->sessions.default_arena_bytes > options->sessions.max_arena_bytes) {
      std::abort();  // accepted what the contract refuses
    }
  }
  auto transport = gradlane::daemon::TransportFromFlags();
  if (!transport.ok() && !absl::IsInvalidArgument(transport.status())) std::abort();
  return 0;
}
