// The HTTP endpoints over a real socket on 127.0.0.1 (an ephemeral port), against a
// FakeSource: status codes, content types, payload shapes, --disable-metrics, and a
// port that is already taken.
#include "http/http_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

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
    server_ = std::make_unique<HttpServer>(o, &source_, &source_);
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
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_EQ(source_.clears.load(), 2);
}

TEST_F(HttpServerTest, ConfVersionAndUnknownPaths) {
  Start();
  EXPECT_EQ(GetJson("/conf")["l1"]["eviction_trigger_watermark"], 0.8);
  EXPECT_EQ(GetJson("/config")["l1"]["eviction_trigger_watermark"], 0.8);
  EXPECT_EQ(GetJson("/version"), "kvd-9.9.9") << "lmcache's shape: a JSON string";
  EXPECT_EQ(GetJson("/lmc_version"), "0.5.6");
  auto v = GetJson("/api/version");
  EXPECT_EQ(v["version"], "9.9.9");
  EXPECT_EQ(v["name"], "kvd");
  auto nf = GetJson("/no/such/thing", 404);
  EXPECT_NE(nf["error"].get<std::string>().find("/no/such/thing"), std::string::npos);
}

// lmcache 0.5.6's routes (lmcache_api.h); their shapes are compared with the reference
// server's in tests/integration/test_http_lmcache.py.
TEST_F(HttpServerTest, RootServesBrowsersTheDashboardAndOthersLmcachesJson) {
  Start();
  EXPECT_EQ(GetJson("/"), nlohmann::json({{"status", "ok"}, {"service", "LMCache HTTP API"}}));
  auto r = client_->Get("/", {{"Accept", "text/html,application/xhtml+xml,*/*;q=0.8"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_EQ(r->get_header_value("Vary"), "Accept");
  r = client_->Get("/dashboard");
  ASSERT_TRUE(r);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/html"), std::string::npos);
}

TEST_F(HttpServerTest, CacheClearTakesLmcachesBodyAndAnswersItsShape) {
  Start();
  auto post = [&](const std::string& body) {
    auto r = client_->Post("/cache/clear", body, "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, nlohmann::json::parse(r->body)) : std::make_pair(0, nlohmann::json());
  };
  auto [st, j] = post("");
  EXPECT_EQ(st, 200);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["cleared"], nlohmann::json({{"tier", "l1"}}));
  EXPECT_EQ(source_.clears.load(), 1);
  EXPECT_EQ(post(R"({"tier":"l1","force":true})").first, 200);
  EXPECT_EQ(source_.clears.load(), 2);
  auto [st2, j2] = post(R"({"tier":"l2"})");
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(j2["detail"], "tier 'l2' not supported; only 'l1'");
  auto [st3, j3] = post(R"({"tier":"disk"})");
  EXPECT_EQ(st3, 422);
  EXPECT_EQ(j3["detail"][0]["loc"], nlohmann::json({"body", "tier"}));
  EXPECT_EQ(post(R"({"force":"maybe"})").first, 422);
  EXPECT_EQ(post(R"({"force":"yes"})").first, 200) << "pydantic's lax booleans";
  EXPECT_EQ(source_.clears.load(), 3);
  EXPECT_EQ(post("{not json").first, 422);
  EXPECT_EQ(post("[1]").first, 422);
  EXPECT_EQ(source_.clears.load(), 3) << "a refused request clears nothing";
}

TEST_F(HttpServerTest, CacheObjectsListingAndPrefetchAnswerAsAnL1OnlyLmcache) {
  Start();
  EXPECT_EQ(GetJson("/cache/objects", 503)["detail"].get<std::string>().rfind("no L2 adapters", 0), 0u);
  EXPECT_EQ(GetJson("/cache/objects?tier=l1", 400)["detail"], "tier 'l1' not supported; only 'l2'");
  EXPECT_EQ(GetJson("/cache/objects?page_size=0", 422)["detail"][0]["loc"],
            nlohmann::json({"query", "page_size"}));
  EXPECT_EQ(GetJson("/cache/objects?page_size=5001", 422)["detail"][0]["type"], "less_than_equal");
  EXPECT_EQ(GetJson("/cache/objects?tier=nope", 422)["detail"][0]["type"], "enum");

  auto post = [&](const std::string& body) {
    auto r = client_->Post("/cache/prefetches", body, "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, nlohmann::json::parse(r->body)) : std::make_pair(0, nlohmann::json());
  };
  auto [st, j] = post(R"({"model_name":"m","world_size":"1","token_ids":[1,2,"3"]})");
  EXPECT_EQ(st, 503) << "valid (lax integers), and model m has not registered here";
  EXPECT_EQ(j["detail"], "no layout registered for model_name='m' world_size=1; the model has not "
                         "allocated KV cache on this node yet");
  // The sample snapshot's instance: model llama"3, world size 2, chunks of 256 tokens.
  const std::string model = R"("model_name":"llama\"3","world_size":2)";
  auto [st_short, j_short] = post("{" + model + R"(,"token_ids":[1,2,3]})");
  EXPECT_EQ(st_short, 202);
  EXPECT_EQ(j_short, nlohmann::json({{"chunks", 0}, {"status", "noop"}})) << "shorter than a chunk";
  std::string chunk = "[0";
  for (int i = 1; i < 256; ++i) chunk += "," + std::to_string(i);
  chunk += "]";
  auto [st_nol2, j_nol2] = post("{" + model + R"(,"token_ids":)" + chunk + "}");
  EXPECT_EQ(st_nol2, 503);
  EXPECT_EQ(j_nol2["detail"], "no L2 adapters configured");
  source_.SetL2({{"fs", "fs", false}}, {});
  auto [st_warm, j_warm] = post("{" + model + R"(,"token_ids":)" + chunk + "}");
  EXPECT_EQ(st_warm, 501) << "kvd prefetches from its tiers on LOOKUP only";
  EXPECT_NE(j_warm["detail"].get<std::string>().find("1 configured L2 adapter"), std::string::npos);
  EXPECT_EQ(post(R"({"model_name":"m","token_ids":[]})").first, 422) << "world_size missing";
  EXPECT_EQ(post(R"({"model_name":"m","world_size":1,"token_ids":["a"]})").first, 422);
  EXPECT_EQ(post(R"({"model_name":"m","world_size":1,"token_ids":[],"source_tier":"l1"})").first, 400);
  EXPECT_EQ(GetJson("/cache/prefetches/abc", 404)["detail"].get<std::string>().find("'abc'") !=
                std::string::npos,
            true);
}

TEST_F(HttpServerTest, DeleteCacheObjectsPassesKeysAndCountsDeletedAndSkipped) {
  Start();
  const std::string hash(64, 'a');
  auto del = [&](const std::string& body) {
    auto r = client_->Delete("/cache/objects", body, "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, nlohmann::json::parse(r->body)) : std::make_pair(0, nlohmann::json());
  };
  auto key = [&](const std::string& model, const std::string& h) {
    return R"({"chunk_hash_hex":")" + h + R"(","model_name":")" + model +
           R"(","kv_rank":33620225,"cache_salt":"s"})";
  };
  auto [st, j] = del(R"({"tier":"l1","keys":[)" + key("m", hash) + "," + key("busy", hash) + "," +
                     key("absent", hash) + "]}");
  EXPECT_EQ(st, 200);
  EXPECT_EQ(j, nlohmann::json({{"deleted", 1}, {"skipped", 1}, {"ok", true}}));
  auto keys = source_.DeletedKeys();
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0].chunk_hash[0], 0xaa);
  EXPECT_EQ(keys[0].kv_rank, 33620225);  // world 2, rank 1
  EXPECT_EQ(keys[0].cache_salt, "s");
  EXPECT_EQ(del(R"({"tier":"l1","keys":[)" + key("m", "zz") + "]}").first, 400);
  EXPECT_EQ(del(R"({"tier":"l1","keys":[)" + key("a@b", hash) + "]}").first, 400);
  EXPECT_EQ(del(R"({"tier":"l1"})").first, 422) << "keys missing";
  EXPECT_EQ(del(R"({"tier":"l1","keys":[{"model_name":"m"}]})").first, 422);
  EXPECT_EQ(source_.DeletedKeys().size(), 3u) << "refused requests delete nothing";
  EXPECT_EQ(del(R"({"keys":[]})").first, 503) << "lmcache's default tier is l2";
}

L2ObjectView TierObject(const std::string& model, uint8_t hash_byte, int64_t rank, uint64_t bytes,
                        const std::string& tag = "") {
  L2ObjectView o;
  o.key.model_name = model;
  o.key.chunk_hash.fill(hash_byte);
  o.key.kv_rank = rank;
  o.key.layout_tag = tag;
  o.size_bytes = bytes;
  return o;
}

TEST_F(HttpServerTest, CacheObjectsListTheSelectedTiersObjectsInPages) {
  Start();
  source_.SetL2({{"fs", "fs", true}, {"resp", "resp", false}},
                {TierObject("m", 0x22, 0x01000100, 10), TierObject("m", 0x11, 0x01000100, 20),
                 TierObject("other", 0x33, 0x01000100, 30), TierObject("m", 0x44, 0x01000100, 40, "ab12")});
  auto page1 = GetJson("/cache/objects?model_name=m&page_size=2");
  EXPECT_EQ(page1["adapter"], "fs");
  EXPECT_EQ(page1["shared"], true);
  ASSERT_EQ(page1["entries"].size(), 2u);
  EXPECT_EQ(page1["entries"][0]["key"],
            nlohmann::json({{"chunk_hash_hex", std::string(64, '1')}, {"model_name", "m"},
                            {"kv_rank", 0x01000100}, {"object_group_id", 0}, {"cache_salt", ""}}));
  EXPECT_EQ(page1["entries"][0]["size_bytes"], 20);
  EXPECT_EQ(page1["entries"][1]["key"]["chunk_hash_hex"], std::string(64, '2'));
  ASSERT_TRUE(page1["next_page_token"].is_string());
  auto page2 = GetJson("/cache/objects?model_name=m&page_size=2&page_token=" +
                       page1["next_page_token"].get<std::string>());
  ASSERT_EQ(page2["entries"].size(), 1u);
  EXPECT_EQ(page2["entries"][0]["key"]["layout_tag"], "ab12") << "a kvd-private object says so";
  EXPECT_TRUE(page2["next_page_token"].is_null());
  EXPECT_EQ(GetJson("/cache/objects")["entries"].size(), 4u);
  EXPECT_EQ(GetJson("/cache/objects?adapter=resp")["adapter"], "resp");
  EXPECT_EQ(GetJson("/cache/objects?adapter=s3", 404)["detail"], "no L2 adapter with type_name='s3'");
  EXPECT_EQ(GetJson("/cache/objects?page_token=xyz", 400)["detail"], "malformed page_token");
  source_.list_error = "opendir /x: Permission denied";
  EXPECT_EQ(GetJson("/cache/objects", 503)["detail"],
            "L2 adapter 'fs' could not list its objects: opendir /x: Permission denied");
}

TEST_F(HttpServerTest, DeleteCacheObjectsFromATierRemovesOnlyTheNamedKeys) {
  Start();
  source_.SetL2({{"fs", "fs", false}, {"fs", "fs#1", false}},
                {TierObject("m", 0x11, 0x01000100, 20), TierObject("m", 0x22, 0x01000100, 10)});
  auto del = [&](const std::string& body) {
    auto r = client_->Delete("/cache/objects", body, "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, nlohmann::json::parse(r->body)) : std::make_pair(0, nlohmann::json());
  };
  const std::string key11 = R"({"chunk_hash_hex":")" + std::string(64, '1') +
                            R"(","model_name":"m","kv_rank":16777472})";
  const std::string absent = R"({"chunk_hash_hex":")" + std::string(64, '9') +
                             R"(","model_name":"m","kv_rank":16777472})";
  auto [st, j] = del(R"({"keys":[)" + key11 + "," + absent + "]}");
  EXPECT_EQ(st, 200);
  EXPECT_EQ(j, nlohmann::json({{"deleted", 1}, {"skipped", 0}, {"ok", true}}));
  ASSERT_EQ(source_.L2Objects().size(), 1u);
  EXPECT_EQ(source_.L2Objects()[0].key.chunk_hash[0], 0x22);
  EXPECT_EQ(source_.l2_delete_tier, 0) << "no adapter named: the primary";
  EXPECT_EQ(del(R"({"adapter":"fs#1","keys":[)" + absent + "]}").first, 200);
  EXPECT_EQ(source_.l2_delete_tier, 1);
  EXPECT_EQ(del(R"({"adapter":"s3","tier":"all","keys":[)" + key11 + "]}").first, 404);
  EXPECT_TRUE(source_.DeletedKeys().empty()) << "an unknown adapter deletes nothing, L1 included";
  EXPECT_EQ(del(R"({"keys":[{"chunk_hash_hex":")" + std::string(64, '2') +
                R"(","model_name":"m","kv_rank":-1}]})").first, 400);
  EXPECT_EQ(source_.L2Objects().size(), 1u);
}

TEST_F(HttpServerTest, LogLevelThreadsAndMetricsReset) {
  Start();
  const auto before = spdlog::get_level();
  auto text = [&](const std::string& path, int want) {
    auto r = client_->Get(path.c_str());
    EXPECT_TRUE(r);
    if (!r) return std::string();
    EXPECT_EQ(r->status, want) << path;
    EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    return r->body;
  };
  EXPECT_EQ(text("/loglevel", 200).rfind("=== Loggers and Levels ===\nkvd: ", 0), 0u);
  // A GET never changes state (issue 27, finding 8): lmcache sets the level here, kvd points
  // at the POST.
  auto g = client_->Get("/loglevel?logger_name=lmcache&level=debug");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 405);
  EXPECT_EQ(g->get_header_value("Allow"), "GET, HEAD, POST");
  EXPECT_NE(g->body.find("POST /loglevel?logger_name=<name>&level=<level>"), std::string::npos) << g->body;
  EXPECT_EQ(spdlog::get_level(), before);
  auto p = client_->Post("/loglevel?logger_name=lmcache&level=debug");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 200);
  EXPECT_EQ(p->body, "Set lmcache level to DEBUG (including all handlers)");
  EXPECT_EQ(spdlog::get_level(), spdlog::level::debug);
  EXPECT_EQ(text("/loglevel?logger_name=kvd", 200), "kvd: DEBUG");
  p = client_->Post("/loglevel?level=error");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 200);
  EXPECT_EQ(p->body, "Set kvd level to ERROR (including all handlers)");
  EXPECT_EQ(spdlog::get_level(), spdlog::level::err);
  p = client_->Post("/loglevel?logger_name=kvd&level=loud");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 400);
  EXPECT_EQ(p->body, "Invalid log level: loud");
  p = client_->Post("/loglevel?logger_name=kvd");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 422) << "no level to set";
  EXPECT_EQ(spdlog::get_level(), spdlog::level::err);
  EXPECT_EQ(text("/loglevel?logger_name=kvd&level=loud", 400), "Invalid log level: loud");
  spdlog::set_level(before);
  const std::string threads = text("/threads", 200);
  EXPECT_NE(threads.find("=== Thread Summary ===\nTotal threads: "), std::string::npos);
  EXPECT_NE(threads.find("Thread: "), std::string::npos);
  EXPECT_NE(text("/threads?name=no-such-thread", 200).find("Total threads: 0\n"), std::string::npos);
  EXPECT_EQ(GetJson("/threads?thread_id=x", 422)["detail"][0]["loc"], nlohmann::json({"query", "thread_id"}));
  auto r = client_->Post("/metrics/reset");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok");
  EXPECT_EQ(source_.resets.load(), 1);
}

// Input validation: what is invalid is refused with a 4xx and a clear message, what
// lmcache's pydantic models accept is accepted.
TEST_F(HttpServerTest, LogLevelWithAnUnknownLevelAndNoLoggerNameIs400) {
  Start();
  const auto before = spdlog::get_level();
  auto r = client_->Get("/loglevel?level=loud");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body, "Invalid log level: loud");
  r = client_->Get("/loglevel?level=INFO");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << "a valid level without a logger name: lmcache's null";
  EXPECT_EQ(r->body, "null");
  EXPECT_EQ(spdlog::get_level(), before) << "nothing is set without a logger name";
}

TEST_F(HttpServerTest, TimeseriesPointsMustBeAWholeNonNegativeNumber) {
  Start();
  for (const char* bad : {"12abc", "-5", "1.5", "", " 3", "99999999999999999999999"}) {
    auto j = GetJson(std::string("/api/timeseries?points=") + bad, 400);
    EXPECT_EQ(j["error"], "points must be a non-negative integer") << bad;
  }
  EXPECT_EQ(GetJson("/api/timeseries?points=0")["t"].size(), server_->timeseries().size());
  EXPECT_EQ(GetJson("/api/timeseries?points=1")["t"].size(), 1u);
}

TEST_F(HttpServerTest, IntegersOutsideTheSigned64BitRangeAre422) {
  Start();
  auto post = [&](const std::string& world) {
    auto r = client_->Post("/cache/prefetches",
                           R"({"model_name":"m","token_ids":[],"world_size":)" + world + "}",
                           "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, nlohmann::json::parse(r->body))
             : std::make_pair(0, nlohmann::json());
  };
  for (const char* big : {"18446744073709551615", "1e20", "-1e300", "9223372036854775808",
                          "\"99999999999999999999\""}) {
    auto [st, j] = post(big);
    EXPECT_EQ(st, 422) << big << ": " << j.dump();
    EXPECT_EQ(j["detail"][0]["loc"], nlohmann::json({"body", "world_size"})) << big;
  }
  EXPECT_EQ(post("9223372036854775807").first, 503) << "the largest int64: valid, not registered";
  EXPECT_EQ(post("-9223372036854775808").first, 503);
}

TEST_F(HttpServerTest, BooleansTakeIntegralFloatsAsPydanticDoes) {
  Start();
  for (const char* ok : {"1.0", "0.0", "1", "0", "true", "\"NO\""}) {
    auto r = client_->Post("/cache/clear", std::string(R"({"force":)") + ok + "}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << ok << ": " << r->body;
  }
  for (const char* bad : {"0.5", "2", "\"maybe\"", "null", "[]"}) {
    auto r = client_->Post("/cache/clear", std::string(R"({"force":)") + bad + "}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 422) << bad << ": " << r->body;
  }
}

TEST_F(HttpServerTest, ASignAfterAPlusIsNotAnInteger) {
  Start();
  EXPECT_EQ(GetJson("/threads?thread_id=%2B-1", 422)["detail"][0]["loc"],
            nlohmann::json({"query", "thread_id"}));
  EXPECT_EQ(GetJson("/cache/objects?page_size=%2B-1", 422)["detail"][0]["type"], "int_parsing");
}

TEST_F(HttpServerTest, CacheSaltLengthCountsCharactersNotBytes) {
  Start();
  std::string salt;
  for (int i = 0; i < 128; ++i) salt += "\xc3\xa9";  // 128 x U+00E9: 128 characters, 256 bytes
  auto del = [&](const std::string& s) {
    auto r = client_->Delete("/cache/objects",
                             R"({"tier":"l1","keys":[{"chunk_hash_hex":")" + std::string(64, 'a') +
                                 R"(","model_name":"m","kv_rank":0,"cache_salt":")" + s + R"("}]})",
                             "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, r->body) : std::make_pair(0, std::string());
  };
  EXPECT_EQ(del(salt).first, 200) << "lmcache counts characters (len(str))";
  auto [st, body] = del(salt + "x");
  EXPECT_EQ(st, 400);
  EXPECT_NE(body.find("cache_salt exceeds max length 128"), std::string::npos) << body;
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
  auto r = client_->Get("/dashboard");
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
  HttpServer second(o, &other, &other);
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
  HttpServer s(o, &src, &src);
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
