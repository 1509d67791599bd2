#include "sched/model_profile.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

using ::testing::HasSubstr;

constexpr char kThreeLayers[] = R"({
  "model": "toy", "batch_size": 8, "reference": "hand-written",
  "layers": [
    {"name": "a", "param_bytes": 100, "fwd_us": 1, "bwd_us": 2},
    {"name": "b", "param_bytes": 0, "fwd_us": 3.5, "bwd_us": 4},
    {"name": "c", "param_bytes": 300, "fwd_us": 5, "bwd_us": 6}
  ]})";

TEST(ModelProfileTest, ParsesFieldsAndDerivesReadyTimesFromTheLastLayerDown) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(kThreeLayers);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model, "toy");
  EXPECT_EQ(p->batch_size, 8);
  EXPECT_EQ(p->reference, "hand-written");
  ASSERT_EQ(p->layers.size(), 3u);
  EXPECT_EQ(p->layers[1].name, "b");
  EXPECT_EQ(p->layers[2].param_bytes, 300u);
  EXPECT_EQ(p->layers[1].fwd_ns, 3500);
  EXPECT_FALSE(p->explicit_ready_times);
  // Backward runs c, b, a: c's gradient after 6 µs, b's after 10, a's after 12.
  EXPECT_EQ(p->layers[2].ready_ns, 6000);
  EXPECT_EQ(p->layers[1].ready_ns, 10000);
  EXPECT_EQ(p->layers[0].ready_ns, 12000);
  EXPECT_EQ(p->ForwardNs(), 9500);
  EXPECT_EQ(p->BackwardNs(), 12000);
  EXPECT_EQ(p->ComputeNs(), 21500);
  EXPECT_EQ(p->TotalParamBytes(), 400u);
}

TEST(ModelProfileTest, ExplicitStepwiseReadyTimesAreKept) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(R"({"model": "m", "layers": [
    {"name": "a", "param_bytes": 4, "fwd_us": 1, "bwd_us": 2, "ready_us": 7},
    {"name": "b", "param_bytes": 4, "fwd_us": 1, "bwd_us": 2, "ready_us": 3},
    {"name": "c", "param_bytes": 4, "fwd_us": 1, "bwd_us": 2, "ready_us": 3}]})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->explicit_ready_times);
  EXPECT_EQ(p->layers[0].ready_ns, 7000);
  EXPECT_EQ(p->layers[1].ready_ns, 3000);
  EXPECT_EQ(p->layers[2].ready_ns, 3000);
  // The last gradient (7 µs) comes after the sum of bwd (6 µs): backward lasts until it.
  EXPECT_EQ(p->BackwardNs(), 7000);
}

TEST(ModelProfileTest, IgnoresUnknownFieldsAndAcceptsWholeFloatSizes) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(R"({"model": "m", "extra": [1, 2],
    "layers": [{"name": "a", "param_bytes": 4096.0, "fwd_us": 1, "bwd_us": 2,
                "type": "conv", "shape": [3, 3]}]})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->layers[0].param_bytes, 4096u);
  EXPECT_EQ(p->batch_size, 0);  // absent
}

struct BadCase {
  const char* json;
  const char* message;
};

TEST(ModelProfileTest, RejectsEveryMalformedInputWithAClearError) {
  const BadCase cases[] = {
      {"", "not valid JSON"},
      {"{\"model\": \"m\", \"layers\": [", "not valid JSON"},
      {"[1, 2]", "top level must be an object"},
      {R"({"layers": []})", "missing field \"model\""},
      {R"({"model": 3, "layers": []})", "\"model\" must be a string"},
      {R"({"model": "m"})", "missing field \"layers\""},
      {R"({"model": "m", "layers": {}})", "\"layers\" must be an array"},
      {R"({"model": "m", "layers": []})", "\"layers\" is empty"},
      {R"({"model": "m", "batch_size": -1, "layers": []})", "batch_size"},
      {R"({"model": "m", "batch_size": "8", "layers": []})", "batch_size"},
      {R"({"model": "m", "reference": 1, "layers": []})", "\"reference\" must be a string"},
      {R"({"model": "m", "layers": [3]})", "layers[0] must be an object"},
      {R"({"model": "m", "layers": [{"param_bytes": 1, "fwd_us": 1, "bwd_us": 1}]})",
       "layers[0]: missing field \"name\""},
      {R"({"model": "m", "layers": [{"name": 7, "param_bytes": 1, "fwd_us": 1, "bwd_us": 1}]})",
       "\"name\" must be a string"},
      {R"({"model": "m", "layers": [{"name": "a", "fwd_us": 1, "bwd_us": 1}]})",
       "layers[0] (\"a\"): missing field \"param_bytes\""},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": -4, "fwd_us": 1, "bwd_us": 1}]})",
       "\"param_bytes\" must be >= 0"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1.5, "fwd_us": 1, "bwd_us": 1}]})",
       "non-negative whole number"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": "1", "fwd_us": 1, "bwd_us": 1}]})",
       "\"param_bytes\" must be a non-negative integer, got string"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "bwd_us": 1}]})",
       "missing field \"fwd_us\""},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "fwd_us": 1}]})",
       "missing field \"bwd_us\""},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "fwd_us": -1, "bwd_us": 1}]})",
       "\"fwd_us\" must be >= 0"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "fwd_us": 1, "bwd_us": null}]})",
       "\"bwd_us\" must be a number, got null"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "fwd_us": 1, "bwd_us": 1,
          "ready_us": "soon"}]})",
       "\"ready_us\" must be a number"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "fwd_us": 1, "bwd_us": 1,
          "ready_us": -2}]})",
       "\"ready_us\" must be >= 0"},
      {R"({"model": "m", "layers": [{"name": "a", "param_bytes": 1, "fwd_us": 1e300, "bwd_us": 1}]})",
       "implausibly large"},
      {R"({"model": "m", "layers": [
          {"name": "a", "param_bytes": 1, "fwd_us": 6e11, "bwd_us": 1},
          {"name": "b", "param_bytes": 1, "fwd_us": 6e11, "bwd_us": 1}]})",
       "total fwd_us + bwd_us is implausibly large"},
      {R"({"model": "m", "layers": [
          {"name": "a", "param_bytes": 1, "fwd_us": 1, "bwd_us": 1, "ready_us": 2},
          {"name": "b", "param_bytes": 1, "fwd_us": 1, "bwd_us": 1}]})",
       "ready_us is given for 1 of 2 layers; give it for all or none (first missing: layers[1]"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<ModelProfile> p = ParseModelProfile(c.json);
    ASSERT_FALSE(p.ok()) << c.json;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(c.message)) << c.json;
  }
}

TEST(ModelProfileTest, EveryCheckedInProfileParses) {
  const char* root = std::getenv("GRADLANE_SOURCE_ROOT");
  ASSERT_NE(root, nullptr) << "meson sets GRADLANE_SOURCE_ROOT";
  const std::filesystem::path dir = std::filesystem::path(root) / "tests/data/models";
  int parsed = 0;
  // Recursive: the held-out profiles (held-out/) are read by no other unit test.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<ModelProfile> p = ParseModelProfile(text.str());
    ASSERT_TRUE(p.ok()) << entry.path() << ": " << p.status();
    EXPECT_GT(p->TotalParamBytes(), 0u) << entry.path();
    EXPECT_GT(p->ComputeNs(), 0) << entry.path();
    ++parsed;
  }
  EXPECT_GT(parsed, 0) << "no profiles in " << dir;
}

}  // namespace
}  // namespace gradlane::sched
