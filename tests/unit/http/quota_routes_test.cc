// The /quota routes over a real socket against a FakeSource: lmcache's payload shapes, the
// `_default` spelling of the empty salt, GiB units, and bad bodies refused without a change.
#include "http/quota_routes.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fake_source.h"
#include "http/http_server.h"

namespace kvd::http {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

class QuotaRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.sample_interval_seconds = 0.05;
    server_ = std::make_unique<HttpServer>(o, &source_, &source_);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(5);
  }
  nlohmann::json Put(const std::string& path, const std::string& body, int want = 200) {
    auto r = client_->Put(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, want) << path << ": " << r->body;
    return nlohmann::json::parse(r->body);
  }
  nlohmann::json Get(const std::string& path) {
    auto r = client_->Get(path.c_str());
    EXPECT_TRUE(r && r->status == 200) << path;
    return r ? nlohmann::json::parse(r->body) : nlohmann::json{};
  }
  nlohmann::json Delete(const std::string& path) {
    auto r = client_->Delete(path.c_str());
    EXPECT_TRUE(r && r->status == 200) << path;
    return r ? nlohmann::json::parse(r->body) : nlohmann::json{};
  }

  FakeSource source_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(QuotaRoutesTest, PutGetListDeleteRoundTrip) {
  EXPECT_EQ(Put("/quota/tenant-a", R"({"limit_gb": 1.5})"),
            nlohmann::json({{"cache_salt", "tenant-a"}, {"limit_gb", 1.5}, {"status", "ok"}}));
  EXPECT_EQ(source_.GetQuota("tenant-a").limit_bytes, kGiB * 3 / 2);
  source_.SetUsage("tenant-a", kGiB / 4);
  EXPECT_EQ(Get("/quota/tenant-a"), nlohmann::json({{"cache_salt", "tenant-a"},
                                                    {"limit_gb", 1.5},
                                                    {"current_usage_gb", 0.25},
                                                    {"exists", true}}));
  EXPECT_EQ(Get("/quota"), nlohmann::json::parse(
                               R"({"users": {"tenant-a": {"limit_gb": 1.5, "current_usage_gb": 0.25}}})"));
  EXPECT_EQ(Delete("/quota/tenant-a"),
            nlohmann::json({{"cache_salt", "tenant-a"}, {"status", "removed"}}));
  EXPECT_EQ(Delete("/quota/tenant-a"),
            nlohmann::json({{"cache_salt", "tenant-a"}, {"status", "not_found"}}));
  EXPECT_EQ(Get("/quota/tenant-a")["exists"], false);
  EXPECT_EQ(Get("/quota"), nlohmann::json::parse(R"({"users": {}})"));
}

TEST_F(QuotaRoutesTest, DefaultIsTheEmptySalt) {
  Put("/quota/_default", R"({"limit_gb": 2})");
  EXPECT_EQ(source_.GetQuota("").limit_bytes, 2 * kGiB);
  EXPECT_FALSE(source_.GetQuota("_default").limit_bytes.has_value());
  EXPECT_EQ(Get("/quota")["users"].begin().key(), "_default");
  EXPECT_EQ(Get("/quota/_default")["cache_salt"], "_default");
}

TEST_F(QuotaRoutesTest, BadBodiesAreRefusedAndChangeNothing) {
  Put("/quota/t", R"({"limit_gb": 1})");
  for (const char* body : {"not json", "[]", R"({"limit": 1})", R"({"limit_gb": "x"})",
                           R"({"limit_gb": -1})", R"({"limit_gb": 1e300})"}) {
    auto j = Put("/quota/t", body, 400);
    EXPECT_TRUE(j.contains("error")) << body;
  }
  EXPECT_EQ(source_.GetQuota("t").limit_bytes, kGiB);
  // The source's own refusal (here: a salt too long) is a 400 too.
  auto j = Put("/quota/" + std::string(65, 's'), R"({"limit_gb": 1})", 400);
  EXPECT_EQ(j["error"], "cache salt too long");
}

}  // namespace
}  // namespace kvd::http
