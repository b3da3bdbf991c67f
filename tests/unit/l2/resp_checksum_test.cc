// Integrity of Redis/Valkey objects (issue 27, finding 4, Redis part): lmcache's object bytes
// have no checksum, so kvd keeps one beside each object it writes, under a sidecar key in the
// object's hash slot. Against real redis-server processes: an object overwritten in place
// with other bytes of the same size is not served (a counted corrupt miss); an object
// without a checksum (as lmcache writes it) is read as before; a delete removes both; in a
// cluster the checksum lives on the object's node.
#include <gtest/gtest.h>

#include "l2/cluster_slots.h"
#include "l2/resp_tier.h"
#include "redis_process.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using namespace testing;

std::unique_ptr<RespTier> Standalone(RedisProcess& r) {
  RespTierOptions o;
  o.seeds = {r.endpoint()};
  o.num_workers = 2;
  o.connect.connect_timeout_s = 2;
  o.connect.request_timeout_s = 2;
  auto t = RespTier::Create(o);
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

TEST(RespChecksumTest, Finding4RedisSameSizeOverwriteIsNotServed) {
  RedisProcess r;
  ASSERT_TRUE(r.Start().ok());
  auto t = Standalone(r);
  const auto k = Key(1);
  const auto v = Bytes(64 * 1024, 1);
  ASSERT_TRUE(StoreOne(*t, k, v).status.ok());
  std::vector<uint8_t> out;
  ASSERT_TRUE(LoadOne(*t, k, &out, v.size()).status.ok());
  EXPECT_EQ(out, v);
  // Another process overwrites the value in place: same size, other bytes.
  ASSERT_TRUE(r.Cli({"SET", RespKey(k, ""), Str(Bytes(v.size(), 2))}).ok());
  auto l = LoadOne(*t, k, &out, v.size());
  EXPECT_EQ(l.status.code(), StatusCode::kInternal) << l.status.ToString();
  EXPECT_NE(l.status.message().find("checksum"), std::string::npos) << l.status.ToString();
}

TEST(RespChecksumTest, Finding4RedisObjectsWithoutAChecksumAreReadAsBefore) {
  RedisProcess r;
  ASSERT_TRUE(r.Start().ok());
  auto t = Standalone(r);
  const auto k = Key(2);
  const auto v = Bytes(8192, 3);
  ASSERT_TRUE(r.Cli({"SET", RespKey(k, ""), Str(v)}).ok());  // as lmcache writes it
  std::vector<uint8_t> out;
  auto l = LoadOne(*t, k, &out, v.size());
  ASSERT_TRUE(l.status.ok()) << l.status.ToString();
  EXPECT_EQ(out, v);
}

TEST(RespChecksumTest, Finding4RedisDeleteRemovesTheObjectAndItsChecksum) {
  RedisProcess r;
  ASSERT_TRUE(r.Start().ok());
  auto t = Standalone(r);
  const auto k = Key(3);
  ASSERT_TRUE(StoreOne(*t, k, Bytes(4096, 4)).status.ok());
  auto before = r.Cli({"DBSIZE"});
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(*before, "2");  // the object and its checksum
  auto d = DeleteSync(*t, {k});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].status.ok());
  EXPECT_EQ(d[0].bytes, 4096u);
  auto after = r.Cli({"DBSIZE"});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, "0");
  // Scan lists objects only.
  auto s = ScanSync(*t);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->empty());
}

TEST(RespChecksumTest, Finding4RedisClusterChecksumIsOnTheObjectsNode) {
  RedisCluster c;
  ASSERT_TRUE(c.Start().ok());
  RespTierOptions o;
  o.type = "valkey";
  o.cluster = true;
  o.key_prefix = "kvdtest";
  o.num_workers = 2;
  o.seeds = {c.node(0).endpoint()};
  auto t = RespTier::Create(o);
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 12; ++i) {
    const auto k = Key(100 + i);
    const auto v = Bytes(4096, i);
    ASSERT_TRUE(StoreOne(**t, k, v).status.ok());
    const std::string key = RespKey(k, "kvdtest");
    int owner = -1;
    for (int n = 0; n < 3; ++n) {
      auto e = c.node(n).Cli({"EXISTS", key});
      if (e.ok() && *e == "1") owner = n;
    }
    ASSERT_GE(owner, 0);
    auto dbsize = c.node(owner).Cli({"DBSIZE"});
    ASSERT_TRUE(dbsize.ok());
    // Overwritten in place on its node: a miss.
    ASSERT_TRUE(c.node(owner).Cli({"SET", key, Str(Bytes(v.size(), 200 + i))}).ok());
    std::vector<uint8_t> out;
    EXPECT_EQ(LoadOne(**t, k, &out, v.size()).status.code(), StatusCode::kInternal) << i;
  }
  // Every checksum key sits beside its object: each node holds an even number of keys.
  for (int n = 0; n < 3; ++n) {
    auto dbsize = c.node(n).Cli({"DBSIZE"});
    ASSERT_TRUE(dbsize.ok());
    EXPECT_EQ(std::stoi(*dbsize) % 2, 0) << "node " << n;
  }
}

}  // namespace
}  // namespace kvd::l2
