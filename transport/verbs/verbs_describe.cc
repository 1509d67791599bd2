#include "transport/verbs/verbs_describe.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>

namespace gradlane::transport::verbs {
namespace {

// The file's one unsigned decimal number, or nothing (missing, unreadable, not a number).
std::optional<uint64_t> ReadNumber(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr == text.data()) return std::nullopt;
  return v;
}

// Names the kernel gives hw_counters files; anything else is skipped (it would become a label).
bool PlainName(std::string_view n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

void AppendVerbsCounters(const VerbsStats& stats, std::vector<BackendCounterValue>& out) {
  for (const CounterInfo<VerbsStats>& c : kVerbsCounters) {
    BackendCounterValue b;
    b.name = std::string("verbs_") + c.name;
    b.type = c.type;
    b.metric = c.metric;
    if (const std::string_view l = c.label; !l.empty()) {
      const size_t eq = l.find('=');
      b.labels.push_back({std::string(l.substr(0, eq)), std::string(l.substr(eq + 1))});
    }
    b.help = c.help;
    b.value = stats.*c.field;
    out.push_back(std::move(b));
  }
}

void AppendPortCounters(std::string_view root, std::string_view device, int port,
                        std::vector<BackendCounterValue>& out) {
  const std::filesystem::path dir =
      std::filesystem::path(root) / std::string(device) / "ports" / std::to_string(port);
  const std::vector<std::pair<std::string, std::string>> labels = {{"device", std::string(device)},
                                                                   {"port", std::to_string(port)}};
  struct Standard {
    const char* file;
    const char* name;
    const char* metric;
    uint64_t scale;
    const char* help;
  };
  static constexpr Standard kStandard[] = {
      {"port_xmit_data", "verbs_port_sent_bytes", "gradlane_verbs_port_sent_bytes_total", 4,
       "bytes the device's port sent, all traffic (port_xmit_data x 4)"},
      {"port_rcv_data", "verbs_port_received_bytes", "gradlane_verbs_port_received_bytes_total", 4,
       "bytes the device's port received, all traffic (port_rcv_data x 4)"},
      {"port_xmit_packets", "verbs_port_sent_packets", "gradlane_verbs_port_sent_packets_total", 1,
       "packets the device's port sent, all traffic"},
      {"port_rcv_packets", "verbs_port_received_packets",
       "gradlane_verbs_port_received_packets_total", 1,
       "packets the device's port received, all traffic"},
  };
  for (const Standard& s : kStandard) {
    const std::optional<uint64_t> v = ReadNumber(dir / "counters" / s.file);
    if (!v.has_value()) continue;
    out.push_back({s.name, CounterType::Counter, s.metric, labels, s.help, *v * s.scale});
  }
  std::error_code ec;
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir / "hw_counters", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::string n = it->path().filename().string();
    if (n != "lifespan" && PlainName(n)) names.push_back(std::move(n));
  }
  std::sort(names.begin(), names.end());  // a stable order for readers
  for (const std::string& n : names) {
    const std::optional<uint64_t> v = ReadNumber(dir / "hw_counters" / n);
    if (!v.has_value()) continue;
    std::vector<std::pair<std::string, std::string>> l = labels;
    l.push_back({"counter", n});
    out.push_back({"verbs_hw_" + n, CounterType::Counter, "gradlane_verbs_hw_counters_total",
                   std::move(l), "the device driver's own counter of this name (hw_counters/)",
                   *v});
  }
}

}  // namespace gradlane::transport::verbs
