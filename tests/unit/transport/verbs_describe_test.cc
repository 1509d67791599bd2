// What the verbs backend shows readers (transport/verbs/verbs_describe.h): its counters as rows,
// and the RDMA device's port counters read from a sysfs-like tree the test writes: the four
// InfiniBand port counters (data in 4-byte words, reported as bytes), every hw_counters file but
// the `lifespan` setting, each labelled with the device and port; missing and malformed files are
// absent, never an error.
#include "transport/verbs/verbs_describe.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace gradlane::transport::verbs {
namespace {

class PortCountersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gl-port-counters-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    const std::filesystem::path p = root_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::map<std::string, BackendCounterValue> Read(const std::string& device, int port) {
    std::vector<BackendCounterValue> out;
    AppendPortCounters(root_.string(), device, port, out);
    std::map<std::string, BackendCounterValue> by_name;
    for (BackendCounterValue& c : out) {
      EXPECT_TRUE(by_name.emplace(c.name, c).second) << "twice: " << c.name;
    }
    return by_name;
  }
  std::filesystem::path root_;
};

TEST(VerbsCountersTest, EveryCounterBecomesARowNamedVerbsWithItsMetricAndLabel) {
  VerbsStats v;
  v.eager_sends = 3;
  v.clear_to_send = 5;
  v.registered_bytes = 1 << 20;
  std::vector<BackendCounterValue> rows;
  AppendVerbsCounters(v, rows);
  ASSERT_EQ(rows.size(), std::size(kVerbsCounters));
  std::map<std::string, BackendCounterValue> by_name;
  for (const BackendCounterValue& r : rows) {
    EXPECT_TRUE(by_name.emplace(r.name, r).second) << r.name;
    EXPECT_EQ(r.name.rfind("verbs_", 0), 0u) << r.name;
    EXPECT_LE(r.name.size(), 28u) << r.name << ": wider than gradlanectl's counters column";
    EXPECT_FALSE(r.help.empty()) << r.name;
    if (r.metric.empty()) continue;
    EXPECT_EQ(r.metric.rfind("gradlane_verbs_", 0), 0u) << r.metric;
    const bool total = r.metric.size() > 6 && r.metric.substr(r.metric.size() - 6) == "_total";
    EXPECT_EQ(total, r.type == CounterType::Counter) << r.metric;
  }
  EXPECT_EQ(by_name.at("verbs_eager_sends").value, 3u);
  EXPECT_EQ(by_name.at("verbs_registered_bytes").value, 1u << 20);
  EXPECT_EQ(by_name.at("verbs_registered_bytes").type, CounterType::Gauge);
  const BackendCounterValue& cts = by_name.at("verbs_clear_to_send");
  EXPECT_EQ(cts.value, 5u);
  EXPECT_EQ(cts.metric, "gradlane_verbs_rendezvous_total");
  const std::vector<std::pair<std::string, std::string>> step = {{"step", "clear_to_send"}};
  EXPECT_EQ(cts.labels, step);
}

TEST_F(PortCountersTest, PortCountersInBytesAndHwCountersByName) {
  Write("mlx5_0/ports/1/counters/port_xmit_data", "100\n");
  Write("mlx5_0/ports/1/counters/port_rcv_data", "7\n");
  Write("mlx5_0/ports/1/counters/port_xmit_packets", "3\n");
  Write("mlx5_0/ports/1/counters/port_rcv_packets", "not a number\n");  // absent
  Write("mlx5_0/ports/1/hw_counters/rcvd_pkts", "5\n");
  Write("mlx5_0/ports/1/hw_counters/rcvd_rnr_err", "0\n");
  Write("mlx5_0/ports/1/hw_counters/lifespan", "10\n");      // a setting, not a counter
  Write("mlx5_0/ports/2/counters/port_xmit_data", "999\n");  // another port
  const auto c = Read("mlx5_0", 1);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c.at("verbs_port_sent_bytes").value, 400u);
  EXPECT_EQ(c.at("verbs_port_sent_bytes").metric, "gradlane_verbs_port_sent_bytes_total");
  EXPECT_EQ(c.at("verbs_port_received_bytes").value, 28u);
  EXPECT_EQ(c.at("verbs_port_sent_packets").value, 3u);
  EXPECT_FALSE(c.contains("verbs_port_received_packets"));
  const BackendCounterValue& hw = c.at("verbs_hw_rcvd_pkts");
  EXPECT_EQ(hw.value, 5u);
  EXPECT_EQ(hw.metric, "gradlane_verbs_hw_counters_total");
  EXPECT_EQ(hw.type, CounterType::Counter);
  const std::vector<std::pair<std::string, std::string>> labels = {
      {"device", "mlx5_0"}, {"port", "1"}, {"counter", "rcvd_pkts"}};
  EXPECT_EQ(hw.labels, labels);
  EXPECT_EQ(c.at("verbs_hw_rcvd_rnr_err").value, 0u);
  EXPECT_FALSE(c.contains("verbs_hw_lifespan"));
}

TEST_F(PortCountersTest, SoftRoceHasOnlyHwCountersAndAMissingDeviceHasNothing) {
  Write("rxe0/ports/1/hw_counters/sent_pkts", "12\n");
  const auto c = Read("rxe0", 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c.at("verbs_hw_sent_pkts").value, 12u);
  EXPECT_TRUE(Read("rxe0", 2).empty());
  EXPECT_TRUE(Read("no_such_device", 1).empty());
}

}  // namespace
}  // namespace gradlane::transport::verbs
