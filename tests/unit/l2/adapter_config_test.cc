// --l2-adapter JSON: lmcache 0.5.6's keys accepted with its defaults, everything else refused
// in one line that names the problem.
#include <cstdlib>

#include <gtest/gtest.h>

#include "l2/adapter_config.h"
#include "l2/serde.h"

#include <nlohmann/json.hpp>

namespace kvd::l2 {
namespace {

std::string Error(const std::string& json, int index = 0) {
  auto r = ParseAdapterConfig(json, index);
  return r.ok() ? "" : r.status().message();
}

TEST(AdapterConfigTest, FsDefaults) {
  auto c = ParseAdapterConfig(R"({"type":"fs","base_path":"/data/kv"})", 0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->type, "fs");
  EXPECT_EQ(c->base_path, "/data/kv");
  EXPECT_FALSE(c->use_odirect);
  EXPECT_EQ(c->num_workers, 4);
  EXPECT_FALSE(c->eviction.has_value());
  EXPECT_EQ(c->affinity_tag, "_default");
}

TEST(AdapterConfigTest, FsNativeAllKeys) {
  auto c = ParseAdapterConfig(
      R"({"type":"fs_native","base_path":"/d","num_workers":6,"relative_tmp_dir":"t",
          "use_odirect":true,"read_ahead_size":65536,"max_capacity_gb":1.5,
          "eviction":{"eviction_policy":"LRU","trigger_watermark":0.9,"eviction_ratio":0.1}})", 1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->index, 1);
  EXPECT_EQ(c->num_workers, 6);
  EXPECT_EQ(c->relative_tmp_dir, "t");
  EXPECT_TRUE(c->use_odirect);
  EXPECT_EQ(c->read_ahead_size, 65536);
  EXPECT_EQ(c->capacity_bytes(), 3ull << 29);
  ASSERT_TRUE(c->eviction.has_value());
  EXPECT_EQ(c->eviction->policy, "LRU");
  EXPECT_DOUBLE_EQ(c->eviction->trigger_watermark, 0.9);
}

TEST(AdapterConfigTest, RespAndEnvironmentCredentials) {
  ::setenv("LMCACHE_RESP_PASSWORD", "from-env", 1);
  auto c = ParseAdapterConfig(R"({"type":"resp","host":"127.0.0.1","port":6379})", 0);
  ::unsetenv("LMCACHE_RESP_PASSWORD");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->nodes.size(), 1u);
  EXPECT_EQ(c->nodes[0].second, 6379);
  EXPECT_EQ(c->num_workers, 8);
  EXPECT_EQ(c->password, "from-env");
  EXPECT_EQ(c->RedactedJson().find("from-env"), std::string::npos);
}

TEST(AdapterConfigTest, ValkeyCluster) {
  auto c = ParseAdapterConfig(
      R"({"type":"valkey","startup_nodes":"10.0.0.1:7000, 10.0.0.2:7001","cluster_mode":true,
          "key_prefix":"prod","ttl_seconds":3600,"database_id":3,"password":"p"})", 0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->cluster_mode);
  ASSERT_EQ(c->nodes.size(), 2u);
  EXPECT_EQ(c->nodes[1].first, "10.0.0.2");
  EXPECT_EQ(c->key_prefix, "prod");
  EXPECT_EQ(c->ttl_seconds.value_or(0), 3600);
  EXPECT_FALSE(c->database_id.has_value());  // ignored in cluster mode, as lmcache
  EXPECT_EQ(c->Describe(), "valkey cluster 10.0.0.1:7000,10.0.0.2:7001 prefix prod");
}

// lmcache 0.5.6's valkey adapter passes (username, password) to glide's ServerCredentials,
// whose order is (password, username): it logs in to a requirepass server only with the
// password in "username". kvd reads a username without a password the same way; with both
// given it keeps their documented meaning (docs/tiers.md).
TEST(AdapterConfigTest, ValkeyUsernameWithoutPasswordIsThePassword) {
  auto c = ParseAdapterConfig(R"({"type":"valkey","startup_nodes":"h:1","username":"s3cret"})", 0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->password, "s3cret");
  EXPECT_EQ(c->username, "");
  EXPECT_EQ(c->RedactedJson().find("s3cret"), std::string::npos);
  auto both = ParseAdapterConfig(
      R"({"type":"valkey","startup_nodes":"h:1","username":"kv","password":"pw"})", 0);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->username, "kv");
  EXPECT_EQ(both->password, "pw");
}

TEST(AdapterConfigTest, RefusalsNameTheProblem) {
  EXPECT_EQ(Error("{not json"), "--l2-adapter #1: invalid JSON: {not json");
  EXPECT_EQ(Error(R"({"type":"s3","bucket":"b"})", 1),
            "--l2-adapter #2: adapter type 's3' is an lmcache adapter type that kvd does not "
            "implement (kvd implements: fs, fs_native, resp, valkey)");
  EXPECT_EQ(Error(R"({"type":"disk"})"),
            "--l2-adapter #1: unknown adapter type 'disk' (kvd implements: fs, fs_native, resp, valkey)");
  EXPECT_EQ(Error(R"({"type":"fs","base_pth":"/x"})"), "--l2-adapter #1 ('fs'): unknown key 'base_pth'");
  EXPECT_EQ(Error(R"({"type":"fs"})"), "--l2-adapter #1 ('fs'): 'base_path' is required");
  EXPECT_EQ(Error(R"({"type":"resp","host":"h"})"), "--l2-adapter #1 ('resp'): 'port' is required");
  EXPECT_EQ(Error(R"({"type":"resp","host":"h","port":0})"),
            "--l2-adapter #1 ('resp'): 'port' must be in [1, 65535], got 0");
  EXPECT_EQ(Error(R"({"type":"valkey","startup_nodes":"h"})"),
            "--l2-adapter #1 ('valkey'): startup_nodes entry must be 'host:port', got 'h'");
  EXPECT_EQ(Error(R"({"type":"valkey","startup_nodes":"h:1","key_prefix":"a@b"})"),
            "--l2-adapter #1 ('valkey'): 'key_prefix' must not contain '@'");
  EXPECT_EQ(Error(R"({"type":"valkey","startup_nodes":"h:1","tls_enable":true})"),
            "--l2-adapter #1 ('valkey'): 'tls_enable': true is not supported by kvd (Debian's hiredis has no TLS)");
  EXPECT_EQ(Error(R"({"type":"fs","base_path":"/x","relative_tmp_dir":"../t"})"),
            "--l2-adapter #1 ('fs'): 'relative_tmp_dir' must be a relative path inside base_path, got '../t'");
  EXPECT_EQ(Error(R"({"type":"fs","base_path":"/x","eviction":{"eviction_policy":"LRU"}})"),
            "--l2-adapter #1 ('fs'): an LRU 'eviction' block needs 'max_capacity_gb' > 0");
  EXPECT_EQ(Error(R"({"type":"fs","base_path":"/x","max_capacity_gb":1,"eviction":{"eviction_policy":"IsolatedLRU"}})"),
            "--l2-adapter #1 ('fs'): eviction_policy 'IsolatedLRU' is an lmcache tier policy that kvd does "
            "not implement (kvd: LRU, ARC, noop)");
  EXPECT_EQ(Error(R"({"type":"fs","base_path":"/x","eviction":{"eviction_policy":"ARC"}})"),
            "--l2-adapter #1 ('fs'): an ARC 'eviction' block needs 'max_capacity_gb' > 0");
  EXPECT_EQ(Error(R"({"type":"fs","base_path":"/x","eviction":{"policy":"LRU"}})"),
            "--l2-adapter #1 ('fs'): unknown key 'eviction.policy'");
  EXPECT_EQ(Error(R"([1,2])"), "--l2-adapter #1: expected a JSON object");
}

TEST(SerdeTest, NoneIsIdentityAndUnknownTypesAreRefusedByName) {
  auto none = MakeSerde(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*none)->identity());
  EXPECT_EQ((*none)->name(), "none");
  nlohmann::json spec = {{"type", "zstd"}};
  auto bad = MakeSerde(&spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "serde type 'zstd' is not supported (known: none, cachegen, fp8)");
  ObjectLayout layout;
  layout.bytes = 8;
  std::vector<uint8_t> raw = {1, 2, 3, 4, 5, 6, 7, 8}, out(8), back(8);
  auto n = (*none)->Encode(raw, layout, out);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 8u);
  EXPECT_TRUE((*none)->Decode(out, layout, back).ok());
  EXPECT_EQ(back, raw);
  EXPECT_FALSE((*none)->Decode(std::span<const uint8_t>(out.data(), 7), layout, back).ok());
}

}  // namespace
}  // namespace kvd::l2
