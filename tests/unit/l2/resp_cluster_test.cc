// The valkey adapter against a real 3-master Redis Cluster: keys spread over every master by
// slot, a slot migrated under it (MOVED/ASK followed, the map re-read), a master killed in
// the middle (its keys answer Unavailable at once, the other masters keep serving, nothing
// wrong is ever returned) and restarted (the tier reconnects). And the resp adapter against
// a standalone server that restarts.
#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "l2/resp_tier.h"
#include "redis_process.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using namespace testing;

std::unique_ptr<RespTier> ClusterTier(RedisCluster& c, int workers = 2) {
  RespTierOptions o;
  o.type = "valkey";
  o.cluster = true;
  o.key_prefix = "kvdtest";
  o.num_workers = workers;
  o.connect.connect_timeout_s = 1;
  o.connect.request_timeout_s = 2;
  o.seeds = {c.node(0).endpoint()};  // one seed: the rest is discovered
  auto t = RespTier::Create(o);
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

int OwnerOf(RedisCluster& c, const std::string& key) {
  for (int i = 0; i < 3; ++i) {
    auto r = c.node(i).Cli({"EXISTS", key});
    if (r.ok() && *r == "1") return i;
  }
  return -1;
}

TEST(RespClusterTest, KeysSpreadOverAllMastersFromOneSeed) {
  RedisCluster c;
  ASSERT_TRUE(c.Start().ok());
  auto t = ClusterTier(c);
  std::set<int> owners;
  for (int i = 0; i < 30; ++i) {
    auto k = Key(i);
    ASSERT_TRUE(StoreOne(*t, k, Bytes(2048, i)).status.ok());
    owners.insert(OwnerOf(c, RespKey(k, "kvdtest")));
  }
  EXPECT_EQ(owners, (std::set<int>{0, 1, 2}));
  std::vector<ObjectKey> keys;
  for (int i = 0; i < 30; ++i) keys.push_back(Key(i));
  keys.push_back(Key(999));
  auto e = ExistsSync(*t, keys);
  ASSERT_EQ(e.size(), 31u);
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(e[i].status.ok()) << i;
  EXPECT_EQ(e[30].status.code(), StatusCode::kNotFound);
}

TEST(RespClusterTest, FollowsASlotMigratedUnderIt) {
  RedisCluster c;
  ASSERT_TRUE(c.Start().ok());
  auto t = ClusterTier(c);
  const auto k = Key(7);
  const auto v = Bytes(4096, 7);
  ASSERT_TRUE(StoreOne(*t, k, v).status.ok());
  const std::string name = RespKey(k, "kvdtest");
  const int from = OwnerOf(c, name);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % 3;
  const std::string slot = std::to_string(KeySlot(name));
  auto id_of = [&](int i) { return *c.node(i).Cli({"CLUSTER", "MYID"}); };
  const std::string from_id = id_of(from), to_id = id_of(to);
  // The documented migration: IMPORTING/MIGRATING, MIGRATE the keys, then NODE on all.
  ASSERT_TRUE(c.node(to).Cli({"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id}).ok());
  ASSERT_TRUE(c.node(from).Cli({"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id}).ok());
  // Mid-migration a key still on the source is served there; a new key goes by ASK.
  auto k2 = k;
  k2.chunk_hash[31] ^= 0x5a;
  for (int n = 0; n < 64 && KeySlot(RespKey(k2, "kvdtest")) != KeySlot(name); ++n) k2.chunk_hash[30]++;
  std::vector<uint8_t> out;
  EXPECT_TRUE(LoadOne(*t, k, &out, v.size()).status.ok());
  EXPECT_EQ(out, v);
  auto mig = c.node(from).Cli({"MIGRATE", "127.0.0.1", std::to_string(c.node(to).port()), name, "0", "5000"});
  ASSERT_TRUE(mig.ok()) << mig.status().ToString();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.node(i).Cli({"CLUSTER", "SETSLOT", slot, "NODE", to_id}).ok());
  EXPECT_EQ(OwnerOf(c, name), to);
  const uint64_t redirects_before = t->redirects();
  EXPECT_TRUE(LoadOne(*t, k, &out, v.size()).status.ok());
  EXPECT_EQ(out, v);
  EXPECT_GT(t->redirects(), redirects_before);  // the old route answered MOVED
  EXPECT_TRUE(LoadOne(*t, k, &out, v.size()).status.ok());  // and the map now knows
}

TEST(RespClusterTest, KilledMasterFailsFastOthersServeAndItComesBack) {
  RedisCluster c;
  ASSERT_TRUE(c.Start().ok());
  auto t = ClusterTier(c);
  std::vector<ObjectKey> keys;
  std::vector<int> owner;
  for (int i = 0; i < 24; ++i) {
    keys.push_back(Key(100 + i));
    ASSERT_TRUE(StoreOne(*t, keys.back(), Bytes(4096, i)).status.ok());
    owner.push_back(OwnerOf(c, RespKey(keys.back(), "kvdtest")));
  }
  const int victim = owner[0];
  c.node(victim).Kill();
  const auto t0 = std::chrono::steady_clock::now();
  int served = 0, unavailable = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<uint8_t> out;
    auto r = LoadOne(*t, keys[i], &out, 4096);
    if (owner[i] == victim) {
      EXPECT_FALSE(r.status.ok());
      EXPECT_NE(r.status.code(), StatusCode::kNotFound);
      unavailable++;
    } else {
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      EXPECT_EQ(out, Bytes(4096, static_cast<uint32_t>(i)));
      served++;
    }
  }
  EXPECT_GT(served, 0);
  EXPECT_GT(unavailable, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_FALSE(t->Health().healthy && unavailable == 0);
  // The node comes back (same port, same cluster config, data lost: no persistence).
  ASSERT_TRUE(c.node(victim).Restart().ok());
  ASSERT_TRUE(c.WaitOk().ok());
  bool stored_again = false;
  for (int attempt = 0; attempt < 100 && !stored_again; ++attempt) {
    stored_again = StoreOne(*t, keys[0], Bytes(4096, 0)).status.ok();
    if (!stored_again) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(stored_again);
  std::vector<uint8_t> out;
  EXPECT_TRUE(LoadOne(*t, keys[0], &out, 4096).status.ok());
  EXPECT_EQ(out, Bytes(4096, 0));
}

TEST(RespStandaloneTest, ServerRestartIsReconnectedAndUnreachableAnswersFast) {
  RedisProcess r;
  ASSERT_TRUE(r.Start().ok());
  RespTierOptions o;
  o.seeds = {r.endpoint()};
  o.num_workers = 2;
  o.connect.connect_timeout_s = 1;
  auto t = RespTier::Create(o);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(StoreOne(**t, Key(1), Bytes(1000, 1)).status.ok());
  r.Kill();
  std::vector<uint8_t> out;
  auto dead = LoadOne(**t, Key(1), &out, 1000);
  EXPECT_EQ(dead.status.code(), StatusCode::kUnavailable);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(LoadOne(**t, Key(1), &out, 1000).status.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));  // backed off
  ASSERT_TRUE(r.Restart().ok());
  bool ok = false;
  for (int attempt = 0; attempt < 100 && !ok; ++attempt) {
    ok = StoreOne(**t, Key(2), Bytes(1000, 2)).status.ok();
    if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ok);
  EXPECT_GE((*t)->reconnects(), 1u);
  EXPECT_EQ(LoadOne(**t, Key(1), &out, 1000).status.code(), StatusCode::kNotFound);  // data gone
}

// A GET's value read from the socket into the caller's buffer (BulkSink): every size around
// the connection's first read (64 KiB), the empty value, and the replies that are not a value
// that fits (nil, an error, a longer value, which is discarded unread), each followed by ordinary and pipelined commands
// on the same connection, which must still line up with their replies.
TEST(RespStandaloneTest, ValuesAreReadIntoTheDestinationAndTheConnectionStaysInStep) {
  RedisProcess r;
  ASSERT_TRUE(r.Start().ok());
  auto made = RespConnection::Connect(r.endpoint(), RespConnectOptions{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  RespConnection& c = **made;
  const size_t kFirstRead = 64 * 1024;
  for (size_t size : {size_t{0}, size_t{1}, kFirstRead - 8, kFirstRead - 5, kFirstRead - 4,
                      kFirstRead, kFirstRead + 1, size_t{1} << 20, (size_t{11} << 20) + 3}) {
    SCOPED_TRACE(size);
    const std::vector<uint8_t> v = Bytes(size, static_cast<uint8_t>(size));
    const std::string key = "direct:" + std::to_string(size);
    auto set = c.Command({"SET", key, std::string_view(reinterpret_cast<const char*>(v.data()),
                                                         v.size())});
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    std::vector<uint8_t> out(size + 16, 0xEE);
    BulkSink sink{out.data(), out.size()};
    auto get = c.Command({"GET", key}, &sink);
    ASSERT_TRUE(get.ok()) << get.status().ToString();
    ASSERT_TRUE(sink.filled);
    EXPECT_EQ(*get, nullptr);
    ASSERT_EQ(sink.size, size);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), out.begin()));
    EXPECT_EQ(out[size], 0xEE);  // nothing past the value
    // Exactly the capacity still fits; one byte less is not read (too_long, no reply
    // object) and is discarded, the connection staying in step.
    BulkSink exact{out.data(), size};
    ASSERT_TRUE(c.Command({"GET", key}, &exact).ok());
    EXPECT_TRUE(exact.filled);
    if (size > 0) {
      BulkSink small{out.data(), size - 1};
      auto longer = c.Command({"GET", key}, &small);
      ASSERT_TRUE(longer.ok());
      EXPECT_FALSE(small.filled);
      EXPECT_TRUE(small.too_long);
      EXPECT_EQ(small.size, size);
      EXPECT_EQ(*longer, nullptr);
      EXPECT_FALSE(c.broken());
    }
    // Pipelined commands after it get their own replies, in order.
    ASSERT_TRUE(c.Append({"EXISTS", key}).ok());
    ASSERT_TRUE(c.Append({"STRLEN", key}).ok());
    auto e = c.GetReply();
    auto l = c.GetReply();
    ASSERT_TRUE(e.ok() && l.ok());
    EXPECT_EQ(ReplyInteger(e->get()), 1);
    EXPECT_EQ(ReplyInteger(l->get()), static_cast<long long>(size));
  }
  std::vector<uint8_t> out(4096);
  BulkSink sink{out.data(), out.size()};
  auto nil = c.Command({"GET", "direct:absent"}, &sink);
  ASSERT_TRUE(nil.ok());
  EXPECT_FALSE(sink.filled);
  EXPECT_TRUE(IsNil(nil->get()));
  ASSERT_TRUE(c.Command({"RPUSH", "direct:list", "x"}).ok());
  auto wrong = c.Command({"GET", "direct:list"}, &sink);
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(sink.filled);
  EXPECT_TRUE(IsError(wrong->get()));
  EXPECT_NE(ReplyString(wrong->get()).find("WRONGTYPE"), std::string_view::npos);
  auto ping = c.Command({"PING"});
  ASSERT_TRUE(ping.ok());
  EXPECT_EQ(ReplyString(ping->get()), "PONG");
  EXPECT_FALSE(c.broken());
}

TEST(RespStandaloneTest, AuthWithUserAndPassword) {
  RedisProcess a;
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(a.Cli({"ACL", "SETUSER", "kv", "on", ">pw1", "~*", "+@all"}).ok());
  RespTierOptions o;
  o.seeds = {a.endpoint()};
  o.num_workers = 1;
  o.connect.username = "kv";
  o.connect.password = "pw1";
  auto t = RespTier::Create(o);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(StoreOne(**t, Key(3), Bytes(100, 3)).status.ok());
  o.connect.password = "wrong";
  auto bad = RespTier::Create(o);
  ASSERT_TRUE(bad.ok());
  auto s = StoreOne(**bad, Key(4), Bytes(100, 4));
  EXPECT_FALSE(s.status.ok());
  EXPECT_NE(s.status.message().find("AUTH"), std::string::npos) << s.status.message();
}

}  // namespace
}  // namespace kvd::l2
