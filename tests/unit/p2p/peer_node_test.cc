// PeerNode with real parts: two nodes, each with its own L1 cache, UCX over TCP on loopback and
// a real redis-server as the fleet directory. A chunk that completes in A's L1 is published;
// B's peer tier finds it and loads it byte-exact into B's L1; a chunk that leaves A's L1 is
// withdrawn; A serves only whole objects of formats it registered, resident in its L1.
#include "p2p/peer_node.h"

#include <gtest/gtest.h>

#include <future>

#include "../l2/redis_process.h"
#include "common/clock.h"

namespace kvd::p2p {
namespace {

constexpr uint64_t kObj = 256 * 1024;
const std::string kModel = "org/peer-model";

uint8_t ByteOf(uint64_t i, uint8_t seed) { return static_cast<uint8_t>((i * 131 + seed) & 0xff); }

std::array<uint8_t, 32> Hash(uint8_t n) {
  std::array<uint8_t, 32> h{};
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(n * 7 + i);
  return h;
}

l2::ObjectKey KeyOf(uint8_t n, const std::string& tag = "") {
  l2::ObjectKey k;
  k.model_name = kModel;
  k.kv_rank = l2::KvRank(1, 0);
  k.chunk_hash = Hash(n);
  k.layout_tag = tag;
  return k;
}

std::vector<l2::ItemResult> Wait(std::function<void(l2::Tier::Done)> call) {
  std::promise<std::vector<l2::ItemResult>> p;
  auto f = p.get_future();
  call([&p](std::vector<l2::ItemResult> r) { p.set_value(std::move(r)); });
  EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  return f.get();
}

// A node and its L1 cache (the node is the cache's listener).
struct Member {
  Member(const l2::testing::RedisProcess& redis, const std::string& secret) {
    PeerNode::Options o;
    o.agent.ucx.listen_host = "127.0.0.1";
    o.agent.ucx.tls = "tcp";
    o.agent.ucx.secret = secret;
    o.agent.ucx.answer_timeout_s = 2;
    o.agent.directory.endpoint = redis.endpoint();
    o.agent.directory.node_ttl_s = 5;
    o.agent.directory.connect.request_timeout_s = 1;
    o.agent.directory.connect.connect_timeout_s = 1;
    static std::atomic<uint64_t> next{1};
    const uint64_t id = next++;
    o.agent.self = {"member-" + std::to_string(id), 1000 + id, ""};
    o.agent.flush_interval_s = 0.02;
    o.lookup_timeout_s = 1;
    o.load_timeout_s = 2;
    auto n = PeerNode::Start(std::move(o));
    status = n.status();
    if (!n.ok()) return;
    node = std::move(*n);
    l1::L1CacheOptions lo;
    lo.capacity_bytes = 32ull << 20;
    lo.clock = &clock;
    lo.listener = node.get();
    l1 = std::move(l1::L1Cache::Create(lo)).value();
    ns = std::move(l1->namespaces().Intern(kModel, 1, "")).value();
    status = node->Attach(l1.get());
  }
  ~Member() {
    if (node) node->Detach();
    l1.reset();
  }
  // Writes chunk n (one slot) with bytes of `seed` and commits it.
  void Store(uint8_t n, uint8_t seed) {
    auto res = l1->ReserveWrite({ns, Hash(n)}, 1, 0, kObj);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    for (uint64_t i = 0; i < kObj; ++i) res->data()[i] = ByteOf(i, seed);
    ASSERT_TRUE(res->Commit());
  }

  SteadyClock clock;
  Status status;
  std::unique_ptr<PeerNode> node;
  std::unique_ptr<l1::L1Cache> l1;
  l1::NamespaceId ns = 0;
};

class PeerNodeTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(redis_.Start().ok()); }
  l2::testing::RedisProcess redis_;
};

TEST_F(PeerNodeTest, ACompletedChunkIsPublishedAndAPeerLoadsItByteExact) {
  Member a(redis_, "fleet"), b(redis_, "fleet");
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  a.node->AddFormat(kModel, "", kModel, kObj);
  b.node->AddFormat(kModel, "", kModel, kObj);
  a.Store(1, 9);
  ASSERT_TRUE(a.node->Flush().ok());
  EXPECT_EQ(a.node->stats().published, 1u);

  auto tier = b.node->tier();
  EXPECT_FALSE(tier->stores());
  auto found = Wait([&](auto done) { tier->Exists({KeyOf(1), KeyOf(2)}, done); });
  ASSERT_EQ(found.size(), 2u);
  EXPECT_TRUE(found[0].status.ok()) << found[0].status.ToString();
  EXPECT_EQ(found[1].status.code(), StatusCode::kNotFound);

  auto res = b.l1->ReserveWrite({b.ns, Hash(1)}, 1, 0, kObj);
  ASSERT_TRUE(res.ok());
  std::memset(res->data(), 0, kObj);
  auto loaded = Wait([&](auto done) { tier->Load({{KeyOf(1), res->data(), kObj}}, done); });
  ASSERT_EQ(loaded.size(), 1u);
  ASSERT_TRUE(loaded[0].status.ok()) << loaded[0].status.ToString();
  EXPECT_EQ(loaded[0].bytes, kObj);
  for (uint64_t i = 0; i < kObj; ++i) ASSERT_EQ(res->data()[i], ByteOf(i, 9)) << i;
  EXPECT_EQ(a.node->stats().served_objects, 1u);
  EXPECT_EQ(b.node->stats().loaded_objects, 1u);
  EXPECT_EQ(b.node->stats().loaded_bytes, kObj);
}

TEST_F(PeerNodeTest, AChunkThatLeavesL1IsWithdrawn) {
  Member a(redis_, "fleet"), b(redis_, "fleet");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  a.node->AddFormat(kModel, "", kModel, kObj);
  b.node->AddFormat(kModel, "", kModel, kObj);
  a.Store(3, 1);
  ASSERT_TRUE(a.node->Flush().ok());
  auto tier = b.node->tier();
  EXPECT_TRUE(Wait([&](auto done) { tier->Exists({KeyOf(3)}, done); })[0].status.ok());
  a.l1->Clear();
  ASSERT_TRUE(a.node->Flush().ok());
  EXPECT_EQ(a.node->stats().withdrawn, 1u);
  EXPECT_EQ(Wait([&](auto done) { tier->Exists({KeyOf(3)}, done); })[0].status.code(),
            StatusCode::kNotFound);
}

TEST_F(PeerNodeTest, OnlyWholeObjectsOfRegisteredFormatsResidentInL1AreServed) {
  Member a(redis_, "fleet"), b(redis_, "fleet");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  a.node->AddFormat(kModel, "", kModel, kObj);
  // B reads objects of a layout A never registered (same L1 model, so the same directory
  // entry), and objects of another size.
  b.node->AddFormat(kModel, "00c0ffee", kModel, kObj);
  a.Store(5, 2);
  ASSERT_TRUE(a.node->Flush().ok());
  auto tier = b.node->tier();
  // Destinations must lie in B's registered L1: a reservation there, holding a sentinel.
  auto res = b.l1->ReserveWrite({b.ns, Hash(50)}, 1, 0, 2 * kObj);
  ASSERT_TRUE(res.ok());
  std::memset(res->data(), 0x5a, 2 * kObj);
  uint8_t* dst = res->data();
  auto other_layout = Wait([&](auto done) { tier->Load({{KeyOf(5, "00c0ffee"), dst, kObj}}, done); });
  EXPECT_FALSE(other_layout[0].status.ok());
  b.node->AddFormat("org/other-model", "", kModel, 2 * kObj);
  l2::ObjectKey bigger = KeyOf(5);
  bigger.model_name = "org/other-model";
  auto wrong_size = Wait([&](auto done) { tier->Load({{bigger, dst, 2 * kObj}}, done); });
  EXPECT_FALSE(wrong_size[0].status.ok());
  // Not a byte was written, and A counted both refusals; it served nothing.
  for (uint64_t i = 0; i < 2 * kObj; ++i) ASSERT_EQ(dst[i], 0x5a) << i;
  EXPECT_EQ(a.node->stats().serve_refusals, 2u);
  EXPECT_EQ(a.node->stats().served_objects, 0u);
  EXPECT_EQ(b.node->stats().loaded_objects, 0u);
  EXPECT_EQ(b.node->stats().load_misses, 2u);
  // A refusal is not "not here": A's entry for the chunk stays in the directory.
  EXPECT_EQ(b.node->stats().stale_entries_forgotten, 0u);
  EXPECT_TRUE(Wait([&](auto done) { tier->Exists({KeyOf(5, "00c0ffee")}, done); })[0].status.ok());
}

// An entry whose owner no longer holds the chunk (its withdrawal was lost: written here
// straight into the directory under A's name) costs one failed probe: B's read finds it gone
// from A's L1, B removes A from the entry, and nobody meets it again.
TEST_F(PeerNodeTest, AStaleEntryCostsOneFailedProbeAndIsForgotten) {
  Member a(redis_, "fleet"), b(redis_, "fleet");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  a.node->AddFormat(kModel, "", kModel, kObj);
  b.node->AddFormat(kModel, "", kModel, kObj);
  FleetDirectory::Options o;
  o.endpoint = redis_.endpoint();
  auto as_a = FleetDirectory::Connect(o, a.node->self());
  ASSERT_TRUE(as_a.ok()) << as_a.status().ToString();
  ASSERT_TRUE((*as_a)->Publish({ChunkDirectoryKey(kModel, 1, "", Hash(9))}).ok());
  auto tier = b.node->tier();
  EXPECT_TRUE(Wait([&](auto done) { tier->Exists({KeyOf(9)}, done); })[0].status.ok());
  auto res = b.l1->ReserveWrite({b.ns, Hash(9)}, 1, 0, kObj);
  ASSERT_TRUE(res.ok());
  auto loaded = Wait([&](auto done) { tier->Load({{KeyOf(9), res->data(), kObj}}, done); });
  EXPECT_EQ(loaded[0].status.code(), StatusCode::kNotFound) << loaded[0].status.ToString();
  EXPECT_EQ(b.node->stats().stale_entries_forgotten, 1u);
  EXPECT_EQ(Wait([&](auto done) { tier->Exists({KeyOf(9)}, done); })[0].status.code(),
            StatusCode::kNotFound);
}

TEST_F(PeerNodeTest, APeerWithoutTheSecretIsRefused) {
  Member a(redis_, "fleet"), b(redis_, "not the fleet's");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  a.node->AddFormat(kModel, "", kModel, kObj);
  b.node->AddFormat(kModel, "", kModel, kObj);
  a.Store(6, 3);
  ASSERT_TRUE(a.node->Flush().ok());
  auto res = b.l1->ReserveWrite({b.ns, Hash(6)}, 1, 0, kObj);
  ASSERT_TRUE(res.ok());
  std::memset(res->data(), 0x33, kObj);
  auto loaded = Wait([&](auto done) { b.node->tier()->Load({{KeyOf(6), res->data(), kObj}}, done); });
  EXPECT_EQ(loaded[0].status.code(), StatusCode::kUnavailable) << loaded[0].status.ToString();
  EXPECT_NE(loaded[0].status.message().find("refused"), std::string::npos) << loaded[0].status.ToString();
  for (uint64_t i = 0; i < kObj; ++i) ASSERT_EQ(res->data()[i], 0x33) << i;
  EXPECT_EQ(a.node->stats().served_objects, 0u);
}

TEST_F(PeerNodeTest, TheTierNeverStoresAndADetachedNodeLeavesTheDirectoryAndPublishesNothing) {
  Member a(redis_, "fleet"), b(redis_, "fleet");
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  a.node->AddFormat(kModel, "", kModel, kObj);
  b.node->AddFormat(kModel, "", kModel, kObj);
  std::vector<uint8_t> src(kObj, 1);
  auto stored = Wait([&](auto done) { a.node->tier()->Store({{KeyOf(7), src.data(), kObj}}, done); });
  EXPECT_EQ(stored[0].status.code(), StatusCode::kFailedPrecondition);

  a.Store(10, 5);
  ASSERT_TRUE(a.node->Flush().ok());
  EXPECT_TRUE(Wait([&](auto done) { b.node->tier()->Exists({KeyOf(10)}, done); })[0].status.ok());
  a.node->Detach();
  // A left the directory: its entries die at once, not with its heartbeat.
  EXPECT_EQ(Wait([&](auto done) { b.node->tier()->Exists({KeyOf(10)}, done); })[0].status.code(),
            StatusCode::kNotFound);
  a.Store(8, 4);  // L1 still works; the node no longer hears it
  EXPECT_EQ(a.node->stats().published, 1u);  // chunk 10 only
  EXPECT_EQ(Wait([&](auto done) { b.node->tier()->Exists({KeyOf(8)}, done); })[0].status.code(),
            StatusCode::kNotFound);
  // A's own tier answers Unavailable once detached.
  EXPECT_EQ(Wait([&](auto done) { a.node->tier()->Exists({KeyOf(8)}, done); })[0].status.code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvd::p2p
