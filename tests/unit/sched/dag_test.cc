#include "sched/dag.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

using ::testing::HasSubstr;

constexpr char kExample[] = R"({
  "tensors": [
    {"name": "conv1.w", "bytes": 37632, "id": 7},
    {"name": "fc.w", "bytes": 4096}
  ],
  "ops": [
    {"name": "fc", "kind": "compute", "duration_us": 12.5, "deps": ["conv1", "recv.fc"]},
    {"name": "recv.conv1", "kind": "recv", "tensor": "conv1.w"},
    {"name": "recv.fc", "kind": "recv", "tensor": "fc.w"},
    {"name": "conv1", "kind": "compute", "duration_us": 410, "deps": ["recv.conv1"]},
    {"name": "grad", "kind": "compute", "duration_us": 820, "deps": ["fc"]},
    {"name": "send.conv1", "kind": "send", "tensor": "conv1.w", "deps": ["grad"]}
  ]
})";

TEST(DagParse, ReadsExample) {
  absl::StatusOr<Dag> dag = ParseDagJson(kExample);
  ASSERT_TRUE(dag.ok()) << dag.status();
  ASSERT_EQ(dag->num_tensors(), 2);
  ASSERT_EQ(dag->num_ops(), 6);
  EXPECT_EQ(dag->tensors()[0].id, 7u);
  EXPECT_EQ(dag->tensors()[1].id, 1u);  // defaults to its position
  EXPECT_EQ(dag->tensors()[0].bytes, 37632u);

  const int fc = *dag->FindOp("fc");
  EXPECT_EQ(dag->ops()[fc].kind, OpKind::kCompute);
  EXPECT_EQ(dag->ops()[fc].duration, 12500);  // µs in the file, ns in memory
  // A dep may name an op listed later in the file.
  EXPECT_THAT(dag->ops()[fc].deps,
              ::testing::ElementsAre(*dag->FindOp("conv1"), *dag->FindOp("recv.fc")));

  EXPECT_EQ(dag->recv_of(0), *dag->FindOp("recv.conv1"));
  EXPECT_EQ(dag->send_of(0), *dag->FindOp("send.conv1"));
  EXPECT_EQ(dag->send_of(1), -1);
  EXPECT_EQ(dag->FindTensorById(7), 0);
  EXPECT_FALSE(dag->FindTensorById(0).has_value());

  // The topological order puts every op after its deps and lists each op once.
  std::vector<int> pos(dag->num_ops(), -1);
  for (size_t k = 0; k < dag->topo_order().size(); ++k) pos[dag->topo_order()[k]] = k;
  for (int i = 0; i < dag->num_ops(); ++i) {
    ASSERT_GE(pos[i], 0);
    for (int d : dag->ops()[i].deps) EXPECT_LT(pos[d], pos[i]);
    for (int s : dag->successors(i)) EXPECT_GT(pos[s], pos[i]);
  }
}

// The example in docs/dag-format.md parses, so the documentation cannot drift from the parser.
TEST(DagParse, DocumentedExampleParses) {
  const char* root = std::getenv("GRADLANE_SOURCE_ROOT");
  if (root == nullptr) GTEST_SKIP() << "GRADLANE_SOURCE_ROOT not set (run through meson test)";
  std::ifstream in(std::string(root) + "/docs/dag-format.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const size_t begin = doc.find("```json\n");
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc.find("```", begin + 8);
  absl::StatusOr<Dag> dag = ParseDagJson(doc.substr(begin + 8, end - begin - 8));
  ASSERT_TRUE(dag.ok()) << dag.status();
  EXPECT_EQ(dag->num_tensors(), 2);
  EXPECT_EQ(dag->num_ops(), 9);
  EXPECT_EQ(dag->ops()[*dag->FindOp("fc")].duration, 95500);
}

struct BadCase {
  const char* what;
  std::string json;
  const char* message;
};

class DagParseError : public ::testing::TestWithParam<BadCase> {};

TEST_P(DagParseError, IsInvalidArgumentWithClearMessage) {
  absl::StatusOr<Dag> dag = ParseDagJson(GetParam().json);
  ASSERT_FALSE(dag.ok()) << GetParam().what;
  EXPECT_EQ(dag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dag.status().message()), HasSubstr(GetParam().message));
}

std::string Ops(const std::string& ops,
                const std::string& tensors = R"([{"name":"t","bytes":8}])") {
  return R"({"tensors":)" + tensors + R"(,"ops":[)" + ops + "]}";
}

INSTANTIATE_TEST_SUITE_P(
    AllClasses, DagParseError,
    ::testing::Values(
        BadCase{"not json", "{\"ops\": [", "not valid JSON"},
        BadCase{"not an object", "[1,2]", "must be a JSON object"},
        BadCase{"missing ops", R"({"tensors": []})", "missing 'ops'"},
        BadCase{"ops not array", R"({"ops": {}})", "'ops' must be an array"},
        BadCase{"op missing name", Ops(R"({"kind":"compute","duration_us":1})"), "missing 'name'"},
        BadCase{"op missing kind", Ops(R"({"name":"a","duration_us":1})"), "missing 'kind'"},
        BadCase{"unknown kind", Ops(R"({"name":"a","kind":"matmul"})"), "unknown kind 'matmul'"},
        BadCase{"compute missing duration", Ops(R"({"name":"a","kind":"compute"})"),
                "missing 'duration_us'"},
        BadCase{"duration wrong type", Ops(R"({"name":"a","kind":"compute","duration_us":"5"})"),
                "'duration_us' must be a number"},
        BadCase{"negative duration", Ops(R"({"name":"a","kind":"compute","duration_us":-1})"),
                "negative"},
        BadCase{"recv missing tensor", Ops(R"({"name":"r","kind":"recv"})"), "missing 'tensor'"},
        BadCase{"unknown tensor", Ops(R"({"name":"r","kind":"recv","tensor":"nope"})"),
                "unknown tensor 'nope'"},
        BadCase{"tensor missing bytes", Ops("", R"([{"name":"t"}])"), "missing 'bytes'"},
        BadCase{"negative bytes", Ops("", R"([{"name":"t","bytes":-4}])"), "negative bytes"},
        BadCase{"bytes wrong type", Ops("", R"([{"name":"t","bytes":"4"}])"),
                "non-negative integer"},
        BadCase{"duplicate tensor name",
                Ops("", R"([{"name":"t","bytes":1},{"name":"t","bytes":2}])"),
                "duplicate tensor name 't'"},
        BadCase{"duplicate tensor id",
                Ops("", R"([{"name":"a","bytes":1,"id":3},{"name":"b","bytes":2,"id":3}])"),
                "duplicate tensor id 3"},
        BadCase{"duplicate op name",
                Ops(R"({"name":"a","kind":"compute","duration_us":1},)"
                    R"({"name":"a","kind":"compute","duration_us":2})"),
                "duplicate op name 'a'"},
        BadCase{"unknown dep",
                Ops(R"({"name":"a","kind":"compute","duration_us":1,"deps":["ghost"]})"),
                "depends on unknown op 'ghost'"},
        BadCase{"deps wrong type",
                Ops(R"({"name":"a","kind":"compute","duration_us":1,"deps":"b"})"),
                "'deps' must be an array"},
        BadCase{"self loop", Ops(R"({"name":"a","kind":"compute","duration_us":1,"deps":["a"]})"),
                "cycle: a -> a"},
        BadCase{"cycle",
                Ops(R"({"name":"a","kind":"compute","duration_us":1,"deps":["c"]},)"
                    R"({"name":"b","kind":"compute","duration_us":1,"deps":["a"]},)"
                    R"({"name":"c","kind":"compute","duration_us":1,"deps":["b"]},)"
                    R"({"name":"d","kind":"compute","duration_us":1})"),
                "cycle: a -> b -> c -> a"},
        BadCase{"recv with deps",
                Ops(R"({"name":"a","kind":"compute","duration_us":1},)"
                    R"({"name":"r","kind":"recv","tensor":"t","deps":["a"]})"),
                "recv ops must be roots"},
        BadCase{"dep on a send",
                Ops(R"({"name":"s","kind":"send","tensor":"t"},)"
                    R"({"name":"a","kind":"compute","duration_us":1,"deps":["s"]})"),
                "send ops must be leaves"},
        BadCase{
            "two recvs of a tensor",
            Ops(R"({"name":"r1","kind":"recv","tensor":"t"},{"name":"r2","kind":"recv","tensor":"t"})"),
            "has two recv ops"},
        BadCase{"duration on a recv",
                Ops(R"({"name":"r","kind":"recv","tensor":"t","duration_us":3})"),
                "takes no 'duration_us'"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name = info.param.what;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(DagCreate, RejectsOutOfRangeDepAndMissingTensor) {
  absl::StatusOr<Dag> dag = Dag::Create({}, {{"a", OpKind::kCompute, 1, -1, {3}}});
  ASSERT_FALSE(dag.ok());
  EXPECT_THAT(std::string(dag.status().message()), HasSubstr("unknown op #3"));

  dag = Dag::Create({}, {{"r", OpKind::kRecv, 0, 0, {}}});
  ASSERT_FALSE(dag.ok());
  EXPECT_THAT(std::string(dag.status().message()), HasSubstr("names no valid tensor"));
}

TEST(ChainDag, FollowsTheLayerStructure) {
  const std::vector<ChainLayer> layers = {
      {"conv1", 100, 10, 20}, {"relu", 0, 1, 2}, {"fc", 300, 30, 60}};
  absl::StatusOr<Dag> dag = BuildChainDag(layers);
  ASSERT_TRUE(dag.ok()) << dag.status();
  // Layers without parameters get no tensor; ids are layer indices.
  ASSERT_EQ(dag->num_tensors(), 2);
  EXPECT_EQ(dag->tensors()[0].id, 0u);
  EXPECT_EQ(dag->tensors()[1].id, 2u);
  EXPECT_EQ(dag->tensors()[1].bytes, 300u);

  auto op = [&](const char* name) { return *dag->FindOp(name); };
  auto deps = [&](const char* name) { return dag->ops()[op(name)].deps; };
  using ::testing::UnorderedElementsAre;
  EXPECT_THAT(deps("fwd.conv1"), UnorderedElementsAre(op("recv.conv1")));
  EXPECT_THAT(deps("fwd.relu"), UnorderedElementsAre(op("fwd.conv1")));
  EXPECT_THAT(deps("fwd.fc"), UnorderedElementsAre(op("fwd.relu"), op("recv.fc")));
  EXPECT_THAT(deps("bwd.fc"), UnorderedElementsAre(op("fwd.fc")));
  EXPECT_THAT(deps("bwd.relu"), UnorderedElementsAre(op("bwd.fc")));
  EXPECT_THAT(deps("bwd.conv1"), UnorderedElementsAre(op("bwd.relu")));
  EXPECT_THAT(deps("send.conv1"), UnorderedElementsAre(op("bwd.conv1")));
  EXPECT_THAT(deps("send.fc"), UnorderedElementsAre(op("bwd.fc")));
  EXPECT_EQ(dag->ops()[op("bwd.fc")].duration, 60);
  EXPECT_EQ(dag->ops()[op("fwd.relu")].duration, 1);
  EXPECT_FALSE(dag->FindOp("recv.relu").has_value());
}

TEST(ChainDag, RejectsBadLayers) {
  EXPECT_FALSE(BuildChainDag({}).ok());
  const std::vector<ChainLayer> negative = {{"a", 1, -1, 1}};
  EXPECT_THAT(std::string(BuildChainDag(negative).status().message()), HasSubstr("negative time"));
  const std::vector<ChainLayer> dup = {{"a", 1, 1, 1}, {"a", 1, 1, 1}};
  EXPECT_THAT(std::string(BuildChainDag(dup).status().message()), HasSubstr("duplicate"));
}

}  // namespace
}  // namespace gradlane::sched
