// The HTTP endpoints over a real socket on 127.0.0.1 (an ephemeral port), against a
// FakeSource: status codes, content types, payload shapes, --disable-metrics, and a
// port that is already taken.
#include "http/http_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "fake_source.h"
#include "http/httplib_wrap.h"

namespace kvd::http {
namespace {

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(bool metrics = true) {
    source_.Set(SampleSnapshot());
    HttpOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.metrics_enabled = metrics;
    o.version = "9.9.9";
    o.config_json = R"({"l1":{"eviction_trigger_watermark":0.8}})";
    o.sample_interval_seconds = 0.05;
    server_ = std::make_unique<HttpServer>(o, &source_);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->port(), 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(5);
  }
  nlohmann::json GetJson(const std::string& path, int want_status = 200) {
    auto r = client_->Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, want_status) << path << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json") << path;
    return nlohmann::json::parse(r->body);
  }

  FakeSource source_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, HealthcheckFollowsTheSource) {
  Start();
  EXPECT_EQ(GetJson("/healthcheck"), nlohmann::json({{"status", "healthy"}}));
  source_.SetHealth({false, "loop stuck"});
  EXPECT_EQ(GetJson("/healthcheck", 503),
            nlohmann::json({{"status", "unhealthy"}, {"reason", "loop stuck"}}));
}

TEST_F(HttpServerTest, StatusDescribesInstancesL1AndOps) {
  Start();
  auto j = GetJson("/status");
  EXPECT_EQ(j["is_healthy"], true);
  EXPECT_EQ(j["version"], "9.9.9");
  EXPECT_EQ(j["l1"]["used_bytes"], 250);
  EXPECT_EQ(j["l1"]["total_bytes"], 1000);
  EXPECT_EQ(j["l1"]["entries"], 7);
  EXPECT_EQ(j["l1"]["locked_entries"], 2);
  EXPECT_EQ(j["sessions"], 3);
  ASSERT_EQ(j["instances"].size(), 1u);
  EXPECT_EQ(j["instances"][0]["instance_id"], 17);
  EXPECT_EQ(j["instances"][0]["model_name"], "llama\"3");
  EXPECT_EQ(j["instances"][0]["world_size"], 2);
  EXPECT_EQ(j["instances"][0]["mode"], "lmcache_driven");
  EXPECT_EQ(j["instances"][0]["object_bytes_per_chunk"], 1 << 20);
  EXPECT_EQ(j["counters"]["requests"], 14);
  EXPECT_EQ(j["counters"]["hit_ratio"], 0.25);
  EXPECT_EQ(j["ops"]["store"]["requests"], 10);
  EXPECT_EQ(j["in_flight"]["store"], 1);       // present only when something is in flight
  EXPECT_FALSE(j["in_flight"].contains("lookup"));
}

TEST_F(HttpServerTest, InvalidUtf8FromClientsDoesNotBreakStatus) {
  Start();
  Snapshot s = SampleSnapshot();
  s.instances[0].model_name = std::string("bad\xff\xfe", 5);
  source_.Set(s);
  auto r = client_->Get("/status");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NO_THROW({
    auto parsed = nlohmann::json::parse(r->body);
    (void)parsed;
  });
}

TEST_F(HttpServerTest, ClearCacheIsAPost) {
  Start();
  auto r = client_->Post("/clear-cache");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(nlohmann::json::parse(r->body)["cleared_entries"], 7);
  EXPECT_EQ(source_.clears.load(), 1);
  r = client_->Post("/cache/clear", "", "text/plain");  // LMCache's path
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(source_.clears.load(), 2);
  r = client_->Get("/clear-cache");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(source_.clears.load(), 2);
}

TEST_F(HttpServerTest, ConfVersionAndUnknownPaths) {
  Start();
  EXPECT_EQ(GetJson("/conf")["l1"]["eviction_trigger_watermark"], 0.8);
  EXPECT_EQ(GetJson("/config")["l1"]["eviction_trigger_watermark"], 0.8);
  auto v = GetJson("/version");
  EXPECT_EQ(v["version"], "9.9.9");
  EXPECT_EQ(v["name"], "kvd");
  auto nf = GetJson("/no/such/thing", 404);
  EXPECT_NE(nf["error"].get<std::string>().find("/no/such/thing"), std::string::npos);
}

TEST_F(HttpServerTest, MetricsAreServedAsPrometheusText) {
  Start();
  auto r = client_->Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  EXPECT_NE(r->body.find("lmcache_mp_l1_memory_usage_bytes 250"), std::string::npos);
}

TEST_F(HttpServerTest, DisabledMetricsAnswer404) {
  Start(/*metrics=*/false);
  auto r = client_->Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(GetJson("/healthcheck")["status"], "healthy");  // the rest still works
}

TEST_F(HttpServerTest, DashboardIsSelfContainedHtml) {
  Start();
  auto r = client_->Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/html"), std::string::npos);
  const std::string& b = r->body;
  EXPECT_NE(b.find("<canvas"), std::string::npos);
  EXPECT_NE(b.find("api/timeseries"), std::string::npos);
  // Nothing loaded from elsewhere: no absolute URLs in src/href, no CDN.
  EXPECT_EQ(b.find("src=\"http"), std::string::npos);
  EXPECT_EQ(b.find("href=\"http"), std::string::npos);
  EXPECT_EQ(b.find("src=\"//"), std::string::npos);
  EXPECT_EQ(b.find("@import"), std::string::npos);
}

TEST_F(HttpServerTest, SamplerFillsTheTimeseries) {
  Start();
  for (int i = 0; i < 200 && server_->timeseries().size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto j = GetJson("/api/timeseries?points=2");
  EXPECT_EQ(j["t"].size(), 2u);
  EXPECT_EQ(j["l1_used_bytes"][1], 250);
  EXPECT_EQ(j["instances"][1], 1);
  GetJson("/api/timeseries?points=abc", 400);
}

TEST_F(HttpServerTest, APortInUseFailsStartWithOneClearReason) {
  Start();
  FakeSource other;
  HttpOptions o;
  o.host = "127.0.0.1";
  o.port = server_->port();
  HttpServer second(o, &other);
  Status st = second.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("address already in use"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(server_->port())), std::string::npos);
  // The first server is untouched.
  EXPECT_EQ(GetJson("/healthcheck")["status"], "healthy");
}

TEST_F(HttpServerTest, APortTakenByAnotherProgramFailsToo) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  FakeSource src;
  HttpOptions o;
  o.host = "127.0.0.1";
  o.port = ntohs(a.sin_port);
  HttpServer s(o, &src);
  EXPECT_FALSE(s.Start().ok());
  close(fd);
}

TEST_F(HttpServerTest, StopIsPromptAndIdempotent) {
  Start();
  auto t0 = std::chrono::steady_clock::now();
  server_->Stop();
  server_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_FALSE(client_->Get("/healthcheck"));
}

}  // namespace
}  // namespace kvd::http
