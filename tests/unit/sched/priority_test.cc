#include "sched/priority.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sched/tictac.h"

namespace gradlane::sched {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PriorityMode, ParsesEveryNameAndRoundTrips) {
  for (const char* name : {"index", "auto", "tic", "tac", "pace"}) {
    const auto mode = ParsePriorityMode(name);
    ASSERT_TRUE(mode.ok()) << name;
    EXPECT_EQ(PriorityModeName(*mode), name);
  }
  EXPECT_TRUE(PriorityModeNeedsDag(*ParsePriorityMode("tac")));
  EXPECT_FALSE(PriorityModeNeedsDag(*ParsePriorityMode("auto")));
  for (const char* bad : {"", "TIC", "fifo", "tac "}) {
    const auto mode = ParsePriorityMode(bad);
    ASSERT_FALSE(mode.ok()) << bad;
    EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(mode.status().message()),
                HasSubstr("expected index, auto, tic, tac or pace"));
  }
}

TEST(AutoPriority, LearnsTheReversedReadyOrderOfTheFirstIteration) {
  constexpr int kTensors = 20;
  std::vector<uint32_t> ids(kTensors);
  std::iota(ids.begin(), ids.end(), 100);
  AutoPriority learner;
  for (uint32_t id : ids) learner.Register(id);
  // Before learning: registration order.
  EXPECT_EQ(learner.PriorityOf(100), 0);
  EXPECT_EQ(learner.PriorityOf(119), 19);

  std::mt19937 rng(42);
  std::vector<uint32_t> ready = ids;
  std::shuffle(ready.begin(), ready.end(), rng);
  for (uint32_t id : ready) learner.Observe(id, /*iteration=*/3);
  learner.Observe(ready[0], 3);  // a repeat within the iteration counts once
  EXPECT_FALSE(learner.frozen());
  // The next iteration's first event ends learning.
  std::vector<uint32_t> next = ids;
  std::shuffle(next.begin(), next.end(), rng);
  for (uint32_t id : next) learner.Observe(id, 4);
  EXPECT_TRUE(learner.frozen());

  for (int k = 0; k < kTensors; ++k) {
    EXPECT_EQ(learner.PriorityOf(ready[k]), kTensors - 1 - k) << "tensor " << ready[k];
  }
  // Stable afterwards, whatever later iterations look like.
  for (uint32_t id : ready) learner.Observe(id, 5);
  learner.Freeze();
  for (int k = 0; k < kTensors; ++k) EXPECT_EQ(learner.PriorityOf(ready[k]), kTensors - 1 - k);

  // AssignPriorities reads the learner, in the caller's tensor order.
  std::vector<TensorSpec> specs;
  for (uint32_t id : ids) specs.push_back({id, 4, DType::kF32, 0});
  PriorityOptions options;
  options.auto_learner = &learner;
  const auto prio = AssignPriorities(PriorityMode::kAuto, specs, nullptr, options);
  ASSERT_TRUE(prio.ok());
  for (int i = 0; i < kTensors; ++i) EXPECT_EQ((*prio)[i], learner.PriorityOf(ids[i]));
}

TEST(AutoPriority, HandlesTensorsNeverSeen) {
  AutoPriority learner;
  for (uint32_t id : {1u, 2u, 3u, 4u}) learner.Register(id);
  learner.Observe(3, 0);
  learner.Observe(1, 0);
  learner.Observe(9, 0);  // unregistered: registered on the fly
  learner.Freeze();
  // Seen: 3, 1, 9 → reversed 9, 1, 3. Never seen: 2, 4 in registration order.
  EXPECT_EQ(learner.PriorityOf(9), 0);
  EXPECT_EQ(learner.PriorityOf(1), 1);
  EXPECT_EQ(learner.PriorityOf(3), 2);
  EXPECT_EQ(learner.PriorityOf(2), 3);
  EXPECT_EQ(learner.PriorityOf(4), 4);
  // A tensor met after learning is appended, and keeps its number.
  EXPECT_EQ(learner.PriorityOf(7), 5);  // not recorded by asking
  learner.Register(8);
  learner.Observe(7, 1);
  EXPECT_EQ(learner.PriorityOf(8), 5);
  EXPECT_EQ(learner.PriorityOf(7), 6);
  learner.Observe(2, 2);
  EXPECT_EQ(learner.PriorityOf(2), 3);
}

TEST(AssignPriorities, IndexUsesTheRegisteredPriority) {
  const std::vector<TensorSpec> specs = {
      {5, 8, DType::kF32, 2}, {6, 8, DType::kF16, 0}, {7, 8, DType::kBF16, 1}};
  const auto prio = AssignPriorities(PriorityMode::kIndex, specs, nullptr);
  ASSERT_TRUE(prio.ok());
  EXPECT_THAT(*prio, ElementsAre(2, 0, 1));
  const std::vector<TensorSpec> negative = {{5, 8, DType::kF32, -1}};
  EXPECT_FALSE(AssignPriorities(PriorityMode::kIndex, negative, nullptr).ok());
  // Without a learner, auto answers the provisional order: position.
  EXPECT_THAT(*AssignPriorities(PriorityMode::kAuto, specs, nullptr), ElementsAre(0, 1, 2));
}

TEST(AssignPriorities, DagModesMatchTensorsById) {
  std::vector<ChainLayer> layers;
  for (int i = 0; i < 5; ++i) {
    layers.push_back({"l" + std::to_string(i), uint64_t(4096 * (i + 1)), 40 + i, 70});
  }
  const Dag dag = *BuildChainDag(layers);
  // Registered in a different order than the DAG lists them: matched by id (= layer index).
  std::vector<TensorSpec> specs;
  for (uint32_t id : {3u, 0u, 4u, 1u, 2u}) specs.push_back({id, 4096, DType::kF32, 0});

  const auto tac = AssignPriorities(PriorityMode::kTac, specs, &dag);
  ASSERT_TRUE(tac.ok()) << tac.status();
  EXPECT_THAT(*tac, ElementsAre(3, 0, 4, 1, 2));  // a chain's TAC order is its forward order
  const auto pace = AssignPriorities(PriorityMode::kPace, specs, &dag);
  ASSERT_TRUE(pace.ok());
  EXPECT_THAT(*pace, ElementsAre(3, 0, 4, 1, 2));  // L_i shrinks along the forward order
  const auto tic = AssignPriorities(PriorityMode::kTic, specs, &dag);
  ASSERT_TRUE(tic.ok());
  const std::vector<Priority> by_dag = TicPriorities(dag);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ((*tic)[i], by_dag[specs[i].id]);

  EXPECT_THAT(std::string(AssignPriorities(PriorityMode::kTic, specs, nullptr).status().message()),
              HasSubstr("needs a DAG"));
  specs.push_back({42, 8, DType::kF32, 0});
  EXPECT_THAT(std::string(AssignPriorities(PriorityMode::kPace, specs, &dag).status().message()),
              HasSubstr("tensor id 42 is not in the DAG"));
  PriorityOptions bad;
  bad.link_bytes_per_s = 0;
  specs.pop_back();
  EXPECT_FALSE(AssignPriorities(PriorityMode::kTac, specs, &dag, bad).ok());
}

}  // namespace
}  // namespace gradlane::sched
