// The admin request parser (daemon/admin_request.h) and the admin server's answers to requests
// whose fields have the wrong JSON type. Before ParseAdminRequest, the server read fields with
// nlohmann's value(), which throws type_error on a wrong type: each of the requests in
// kCrashInputs terminated gradlaned (SIGABRT, exit 134) with every job it served. The server
// test below sends them over a real socket, so on that code it aborts this test binary.
#include "daemon/admin_request.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/admin_server.h"
#include "daemon/telemetry.h"
#include "daemon/telemetry_hub.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace gradlane::daemon {
namespace {

using nlohmann::json;

// Each with a piece of the error message it must get.
struct CrashCase {
  const char* line;
  const char* error;
};
constexpr CrashCase kCrashInputs[] = {
    {R"({"cmd":5})", "\"cmd\" must be a string (got number)"},
    {R"({"cmd":null})", "\"cmd\" must be a string (got null)"},
    {R"({"cmd":true})", "\"cmd\" must be a string (got boolean)"},
    {R"({"cmd":["trace"]})", "\"cmd\" must be a string (got array)"},
    {R"({"cmd":{"x":1}})", "\"cmd\" must be a string (got object)"},
    {R"({"cmd":"trace","job":7})", "\"job\" must be a non-empty string (got number)"},
    {R"({"cmd":"trace","job":"j","iterations":"3"})", "\"iterations\" must be a whole number"},
    {R"({"cmd":"trace","job":"j","timeout_s":"10"})", "\"timeout_s\" must be a number"},
    {R"({"cmd":"trace","job":"j","max_spans":"100"})", "\"max_spans\" must be a whole number"},
    {R"({"cmd":"trace","job":"j","iterations":null})", "\"iterations\""},
    {R"({"cmd":"trace","job":"j","timeout_s":[1]})", "\"timeout_s\""},
    {R"({"cmd":"trace","job":"j","max_spans":{"n":1}})", "\"max_spans\""},
};

AdminLimits Limits() {
  AdminLimits l;
  l.max_trace_spans = 1000;
  return l;
}

TEST(ParseAdminRequestTest, EveryCommand) {
  for (const auto& [line, cmd] :
       {std::pair{"{\"cmd\":\"status\"}", AdminCmd::kStatus},
        {"{\"cmd\":\"jobs\"}\n", AdminCmd::kJobs},
        {"{\"cmd\":\"peers\"}\r\n", AdminCmd::kPeers},
        {"{\"cmd\":\"queues\"}", AdminCmd::kQueues},
        {"{\"cmd\":\"bandwidth\",\"extra\":[1,2]}", AdminCmd::kBandwidth}}) {
    auto r = ParseAdminRequest(line, Limits());
    ASSERT_TRUE(r.ok()) << line << ": " << r.status();
    EXPECT_EQ(r->cmd, cmd);
    EXPECT_EQ(AdminCmdName(cmd), json::parse(line)["cmd"].get<std::string>());
  }
}

TEST(ParseAdminRequestTest, TraceDefaultsAndFields) {
  auto r = ParseAdminRequest(R"({"cmd":"trace","job":"j1"})", Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cmd, AdminCmd::kTrace);
  EXPECT_EQ(r->trace.job, "j1");
  EXPECT_EQ(r->trace.iterations, 1);
  EXPECT_EQ(r->trace.timeout_s, 60);
  EXPECT_EQ(r->trace.max_spans, 1000u);
  r = ParseAdminRequest(
      R"({"cmd":"trace","job":"j1","iterations":3.0,"timeout_s":0.5,"max_spans":10})", Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trace.iterations, 3);
  EXPECT_EQ(r->trace.timeout_s, 0.5);
  EXPECT_EQ(r->trace.max_spans, 10u);
}

TEST(ParseAdminRequestTest, WrongTypesNameTheField) {
  for (const CrashCase& c : kCrashInputs) {
    auto r = ParseAdminRequest(c.line, Limits());
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_NE(r.status().message().find(c.error), std::string::npos)
        << c.line << " → " << r.status().message();
  }
}

TEST(ParseAdminRequestTest, RangesAndShapes) {
  const CrashCase cases[] = {
      {"", "not valid JSON"},
      {"{\"cmd\":", "not valid JSON"},
      {"\"status\"", "must be a JSON object"},
      {"[]", "must be a JSON object"},
      {"{}", "no \"cmd\""},
      {R"({"cmd":"reboot"})", "unknown command \"reboot\""},
      {R"({"cmd":"trace"})", "missing \"job\""},
      {R"({"cmd":"trace","job":""})", "\"job\" must be a non-empty string"},
      {R"({"cmd":"trace","job":"j","iterations":0})", "1..10000"},
      {R"({"cmd":"trace","job":"j","iterations":10001})", "1..10000"},
      {R"({"cmd":"trace","job":"j","iterations":-1})", "1..10000"},
      {R"({"cmd":"trace","job":"j","iterations":2.5})", "whole number"},
      {R"({"cmd":"trace","job":"j","iterations":18446744073709551615})", "1..10000"},
      {R"({"cmd":"trace","job":"j","iterations":1e300})", "1..10000"},
      {R"({"cmd":"trace","job":"j","timeout_s":0})", "(0, 600]"},
      {R"({"cmd":"trace","job":"j","timeout_s":-3})", "(0, 600]"},
      {R"({"cmd":"trace","job":"j","timeout_s":601})", "(0, 600]"},
      {R"({"cmd":"trace","job":"j","max_spans":0})", "1..1000"},
      {R"({"cmd":"trace","job":"j","max_spans":1001})", "1..1000"},
      {R"({"cmd":"trace","job":"j","max_spans":-9223372036854775808})", "1..1000"},
      {"{\"cmd\":\"trace\",\"job\":\"\xff\"}", "not valid JSON"},  // invalid UTF-8
      {R"({"cmd":1e999})", "not valid JSON"},                      // number overflow
  };
  for (const CrashCase& c : cases) {
    auto r = ParseAdminRequest(c.line, Limits());
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos)
        << c.line << " → " << r.status().message();
  }
  AdminLimits small = Limits();
  small.max_request_bytes = 16;
  auto r = ParseAdminRequest(R"({"cmd":"status","pad":"xxxxxxxx"})", small);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("over 16 bytes"), std::string::npos);
}

std::string Ask(const std::string& path, const std::string& line) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  std::string in;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) in.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return in;
}

// The inputs that used to abort the daemon, over the real socket: each gets an error answer
// naming the field, and the server keeps answering afterwards.
TEST(AdminServerTest, WrongTypesAreAnsweredNotFatal) {
  Telemetry telemetry;
  HubSources src;
  src.telemetry = &telemetry;
  src.version = "test";
  TelemetryHub hub(std::move(src));
  char dir[] = "/tmp/gl-admin-req.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  AdminOptions o;
  o.socket_path = std::string(dir) + "/d.admin.sock";
  auto s = AdminServer::Start(o, &hub);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const CrashCase& c : kCrashInputs) {
    const std::string answer = Ask(o.socket_path, std::string(c.line) + "\n");
    json r = json::parse(answer, nullptr, false);
    ASSERT_TRUE(r.is_object()) << c.line << " → " << answer;
    EXPECT_EQ(r["ok"], false) << c.line;
    ASSERT_TRUE(r["error"].is_string()) << answer;
    EXPECT_NE(r["error"].get<std::string>().find(c.error), std::string::npos)
        << c.line << " → " << answer;
  }
  json r = json::parse(Ask(o.socket_path, "{\"cmd\":\"status\"}\n"), nullptr, false);
  EXPECT_EQ(r["ok"], true);
  EXPECT_EQ(r["version"], "test");
  (*s)->Stop();
  ::rmdir(dir);
}

TEST(AdminCommandTest, TypedAndUntypedAgree) {
  Telemetry telemetry;
  HubSources src;
  src.telemetry = &telemetry;
  TelemetryHub hub(std::move(src));
  AdminOptions o;
  EXPECT_EQ(AdminCommand(hub, o, json{{"cmd", 5}})["ok"], false);
  EXPECT_EQ(AdminCommand(hub, o, json{{"cmd", "jobs"}})["ok"], true);
  EXPECT_EQ(AdminCommand(hub, o, AdminCmd::kPeers)["ok"], true);
  EXPECT_EQ(AdminCommand(hub, o, json{{"cmd", "trace"}, {"job", "x"}})["ok"], false);
}

}  // namespace
}  // namespace gradlane::daemon
