#include "sched/tictac.h"

#include <algorithm>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

using ::testing::ElementsAre;

DagOp Recv(const char* name, int tensor) { return {name, OpKind::kRecv, 0, tensor, {}}; }
DagOp Compute(const char* name, TimeNs d, std::vector<int32_t> deps) {
  return {name, OpKind::kCompute, d, -1, std::move(deps)};
}

const RecvProperties& PropsOf(const std::vector<RecvProperties>& props, int op) {
  for (const RecvProperties& p : props) {
    if (p.op == op) return p;
  }
  ADD_FAILURE() << "no properties for op " << op;
  return props.front();
}

// Fig. 1a: op1 needs recv1; op2 needs op1 and recv2.
Dag Fig1a(TimeNs op1, TimeNs op2) {
  return *Dag::Create({{"p1", 0, 1}, {"p2", 1, 1}},
                      {Recv("recv1", 0), Recv("recv2", 1), Compute("op1", op1, {0}),
                       Compute("op2", op2, {2, 1})});
}

TEST(TicTacProperties, Fig1aMatchesSection41) {
  const Dag dag = Fig1a(7, 11);
  const auto deps = FindDependencies(dag);
  // §4.1: op2.dep = {recv1, recv2}; a recv depends on itself.
  EXPECT_THAT(deps[3], ElementsAre(0, 1));
  EXPECT_THAT(deps[2], ElementsAre(0));
  EXPECT_THAT(deps[0], ElementsAre(0));

  const std::vector<TimeNs> time = {3, 5, 7, 11};
  const auto props = UpdateProperties(dag, deps, time, {true, true, false, false});
  const RecvProperties& r1 = PropsOf(props, 0);
  const RecvProperties& r2 = PropsOf(props, 1);
  // M = Time(recv); recv1.P = Time(op1), recv2.P = 0; M⁺ = Time(recv1) + Time(recv2) for both.
  EXPECT_EQ(r1.m, 3);
  EXPECT_EQ(r2.m, 5);
  EXPECT_EQ(r1.p, 7);
  EXPECT_EQ(r2.p, 0);
  EXPECT_EQ(r1.m_plus, 3 + 5);
  EXPECT_EQ(r2.m_plus, 3 + 5);

  // Once recv1 is done, op2 depends only on recv2: it becomes recv2's directly-dependent load.
  const auto after = UpdateProperties(dag, deps, time, {false, true, false, false});
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].p, 11);
  EXPECT_EQ(after[0].m_plus, kInfiniteTime);
}

TEST(TicTacTac, Fig1aSendsRecv1First) {
  const Dag dag = Fig1a(7, 11);
  const std::vector<TimeNs> time = {3, 5, 7, 11};
  absl::StatusOr<std::vector<Priority>> prio = TacPriorities(dag, time);
  ASSERT_TRUE(prio.ok()) << prio.status();
  EXPECT_THAT(*prio, ElementsAre(0, 1));
  // And that order is the faster one (§2.2).
  const auto good = SimulateIteration(dag, time, std::vector<int32_t>{0, 1});
  const auto bad = SimulateIteration(dag, time, std::vector<int32_t>{1, 0});
  ASSERT_TRUE(good.ok() && bad.ok());
  EXPECT_LT(good->iteration, bad->iteration);
  // TIC sees no difference in Fig. 1a: both recvs have M⁺ = 2.
  EXPECT_THAT(TicPriorities(dag), ElementsAre(0, 0));
}

// Fig. 5a: two independent branches recvA → opA and recvB → opB.
Dag Fig5a(TimeNs pa, TimeNs pb) {
  return *Dag::Create({{"A", 0, 1}, {"B", 1, 1}},
                      {Recv("recvA", 0), Recv("recvB", 1), Compute("opA", pa, {0}),
                       Compute("opB", pb, {1})});
}

TEST(TicTacFig5, Case1ComparatorPicksTheShorterOrder) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(0, 20);
  int decided = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const TimeNs ma = d(rng) + 1, pa = d(rng), mb = d(rng) + 1, pb = d(rng);
    const Dag dag = Fig5a(pa, pb);
    const std::vector<TimeNs> time = {ma, mb, pa, pb};
    const auto ab = SimulateIteration(dag, time, std::vector<int32_t>{0, 1});
    const auto ba = SimulateIteration(dag, time, std::vector<int32_t>{1, 0});
    ASSERT_TRUE(ab.ok() && ba.ok());
    // The paper's T(A→B) = M_A + max{P_A, M_B} + P_B, on one link and one compute device.
    ASSERT_EQ(ab->iteration, ma + std::max(pa, mb) + pb);
    ASSERT_EQ(ba->iteration, mb + std::max(pb, ma) + pa);

    const auto props =
        UpdateProperties(dag, FindDependencies(dag), time, {true, true, false, false});
    const RecvProperties& a = PropsOf(props, 0);
    const RecvProperties& b = PropsOf(props, 1);
    if (ab->iteration != ba->iteration) {
      ++decided;
      EXPECT_EQ(TacBefore(a, b), ab->iteration < ba->iteration)
          << "M_A=" << ma << " P_A=" << pa << " M_B=" << mb << " P_B=" << pb;
      EXPECT_EQ(TacBefore(b, a), ba->iteration < ab->iteration);
      const auto prio = TacPriorities(dag, time);
      ASSERT_TRUE(prio.ok());
      EXPECT_EQ((*prio)[0] < (*prio)[1], ab->iteration < ba->iteration);
    }
  }
  EXPECT_GT(decided, 100);  // the random cases exercise both outcomes, not just ties
}

TEST(TicTacFig5, Case1Eq2NotTheReversedComparator) {
  // A unlocks a lot of compute and transfers fast; B unlocks nothing. Eq. 2 says A first
  // (min{P_B, M_A} = 0 < min{P_A, M_B} = 10); Alg. 3's comparator as printed would pick B.
  const Dag dag = Fig5a(/*pa=*/10, /*pb=*/0);
  const std::vector<TimeNs> time = {1, 10, 10, 0};
  const auto prio = TacPriorities(dag, time);
  ASSERT_TRUE(prio.ok());
  EXPECT_THAT(*prio, ElementsAre(0, 1));
  EXPECT_EQ(SimulateIteration(dag, time, std::vector<int32_t>{0, 1})->iteration, 11);
  EXPECT_EQ(SimulateIteration(dag, time, std::vector<int32_t>{1, 0})->iteration, 21);
}

// Fig. 5b: no recv unblocks anything alone (all P = 0); op1 needs A and B, op2 needs op1 and C,
// op3 needs op2 and D. Ops are listed D, C, B, A so index order cannot produce the answer.
Dag Fig5b(TimeNs compute) {
  return *Dag::Create({{"D", 0, 1}, {"C", 1, 1}, {"B", 2, 1}, {"A", 3, 1}},
                      {Recv("recvD", 0), Recv("recvC", 1), Recv("recvB", 2), Recv("recvA", 3),
                       Compute("op1", compute, {3, 2}), Compute("op2", compute, {4, 1}),
                       Compute("op3", compute, {5, 0})});
}

TEST(TicTacFig5, Case2BreaksTiesByImpendingLoad) {
  const Dag dag = Fig5b(4);
  const std::vector<TimeNs> time = {/*D*/ 2, /*C*/ 9, /*B*/ 3, /*A*/ 6, 4, 4, 4};
  const auto props = UpdateProperties(dag, FindDependencies(dag), time,
                                      {true, true, true, true, false, false, false});
  for (const RecvProperties& p : props) EXPECT_EQ(p.p, 0);
  // recvA.M⁺ = recvB.M⁺ = Time(A) + Time(B) < recvC.M⁺ < recvD.M⁺.
  EXPECT_EQ(PropsOf(props, 3).m_plus, 6 + 3);
  EXPECT_EQ(PropsOf(props, 2).m_plus, 6 + 3);
  EXPECT_EQ(PropsOf(props, 1).m_plus, 6 + 3 + 9);
  EXPECT_EQ(PropsOf(props, 0).m_plus, 6 + 3 + 9 + 2);
  EXPECT_TRUE(TacBefore(PropsOf(props, 3), PropsOf(props, 1)));
  EXPECT_TRUE(TacBefore(PropsOf(props, 2), PropsOf(props, 0)));
  EXPECT_FALSE(TacBefore(PropsOf(props, 1), PropsOf(props, 2)));

  const auto prio = TacPriorities(dag, time);
  ASSERT_TRUE(prio.ok());
  // A and B first (in either order), then C, then D.
  EXPECT_THAT(std::vector<Priority>({(*prio)[3], (*prio)[2]}),
              ::testing::UnorderedElementsAre(0, 1));
  EXPECT_EQ((*prio)[1], 2);
  EXPECT_EQ((*prio)[0], 3);
  // TIC gets the same from structure alone (M⁺ counted in transfers: 2, 2, 3, 4).
  EXPECT_THAT(TicPriorities(dag), ElementsAre(2, 1, 0, 0));
}

TEST(TicTacChain, TacFollowsForwardOrderTicPairsTheFirstTwo) {
  std::vector<ChainLayer> layers;
  for (int i = 0; i < 6; ++i) {
    layers.push_back({"l" + std::to_string(i), uint64_t(1000 * (6 - i)), 50 + 10 * i, 90});
  }
  const Dag dag = *BuildChainDag(layers);
  const auto time = LinkTimeOracle(dag, 1e8);
  ASSERT_TRUE(time.ok());
  const auto tac = TacPriorities(dag, *time);
  ASSERT_TRUE(tac.ok());
  EXPECT_THAT(*tac, ElementsAre(0, 1, 2, 3, 4, 5));
  // M⁺ of layer i's recv is the number of recvs fwd.l(max(i,1)) needs: 2, 2, 3, 4, 5, 6.
  EXPECT_THAT(TicPriorities(dag), ElementsAre(0, 0, 1, 2, 3, 4));
}

TEST(TicTacMetrics, OverlapAndUtilizationAgreeWithSection32) {
  EXPECT_DOUBLE_EQ(OverlapCoefficient(10, 20, 20), 1.0);  // comm fully hidden
  EXPECT_DOUBLE_EQ(OverlapCoefficient(10, 20, 30), 0.0);  // no overlap
  EXPECT_DOUBLE_EQ(OverlapCoefficient(10, 20, 25), 0.5);
  EXPECT_DOUBLE_EQ(OverlapCoefficient(0, 20, 20), 1.0);
  EXPECT_DOUBLE_EQ(Utilization(20, 25), 0.8);
  // U = C/T = 1 / (1 + ρ − α·min(ρ, 1)) for every consistent (N, C, T).
  std::mt19937 rng(32);
  std::uniform_int_distribution<int> d(1, 1000);
  for (int i = 0; i < 200; ++i) {
    const TimeNs n = d(rng), c = d(rng);
    const TimeNs t = std::max(n, c) + d(rng) % (std::min(n, c) + 1);
    const double alpha = OverlapCoefficient(n, c, t);
    EXPECT_GE(alpha, 0.0);
    EXPECT_LE(alpha, 1.0);
    EXPECT_NEAR(Utilization(c, t), UtilizationFromRatio(double(n) / c, alpha), 1e-12);
  }
}

TEST(TicTacSimulate, CountsCommAndComputeAndServesSends) {
  const Dag dag = *BuildChainDag(std::vector<ChainLayer>{{"a", 100, 5, 7}, {"b", 300, 11, 13}});
  const auto time = LinkTimeOracle(dag, 1e9 / 2);  // 2 ns per byte
  ASSERT_TRUE(time.ok());
  const auto it = SimulateIteration(dag, *time, std::vector<int32_t>{0, 1});
  ASSERT_TRUE(it.ok());
  EXPECT_EQ(it->compute, 5 + 11 + 7 + 13);
  EXPECT_EQ(it->comm, 2 * 2 * (100 + 300));
  // recvs end at 200 and 800; fwd.a 200..205, fwd.b 800..811, bwd.b ..824, bwd.a ..831;
  // send.b 824..1424, then send.a 1424..1624.
  EXPECT_EQ(it->iteration, 1624);
}

TEST(TicTacErrors, RejectBadInputs) {
  const Dag dag = Fig1a(1, 1);
  EXPECT_FALSE(LinkTimeOracle(dag, 0).ok());
  EXPECT_FALSE(TacPriorities(dag, std::vector<TimeNs>{1, 2}).ok());
  EXPECT_FALSE(TacPriorities(dag, std::vector<TimeNs>{1, -2, 1, 1}).ok());
  const std::vector<TimeNs> time = {1, 1, 1, 1};
  EXPECT_FALSE(SimulateIteration(dag, time, std::vector<int32_t>{0}).ok());
  EXPECT_FALSE(SimulateIteration(dag, time, std::vector<int32_t>{0, 0}).ok());
  EXPECT_FALSE(SimulateIteration(dag, time, std::vector<int32_t>{0, 5}).ok());
}

}  // namespace
}  // namespace gradlane::sched
