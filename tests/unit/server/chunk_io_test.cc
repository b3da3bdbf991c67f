// ChunkIo: what both transfer modes do to L1. A store that fails part-way leaves nothing of
// itself; a request's chunks commit last first; read pins are gone on every path.
#include "server/chunk_io.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "common/clock.h"

namespace kvd::server {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kObject = kPage;  // one chunk object: one pool page

// Records the order in which entries become visible to lookups.
class CompletionLog final : public l1::L1Listener {
 public:
  void OnEntryComplete(const l1::ChunkKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    completed_.push_back(key);
  }
  void OnEntriesRemoved(std::span<const l1::ChunkKey>, l1::RemovalCause) override {}
  std::vector<l1::ChunkKey> completed() {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_;
  }

 private:
  std::mutex mu_;
  std::vector<l1::ChunkKey> completed_;
};

class ChunkIoTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(16); }

  void Make(uint64_t pages) {
    io_.reset();
    l1_.reset();
    l1::L1CacheOptions options;
    options.capacity_bytes = pages * kPage;
    options.clock = &clock_;
    options.listener = &log_;
    auto cache = l1::L1Cache::Create(options);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    l1_ = std::move(cache).value();
    auto ns = l1_->namespaces().Intern("model", 1, "");
    ASSERT_TRUE(ns.ok());
    ns_ = *ns;
    config_.chunk_size = 256;
    ServiceContext context;
    context.config = &config_;
    context.clock = &clock_;
    context.l1 = l1_.get();
    context.sessions = &sessions_;
    io_ = std::make_unique<ChunkIo>(context);
    inst_.model_name = "model";
    inst_.world_size = 1;
    inst_.object_bytes = kObject;
  }

  l1::ChunkKey Key(uint8_t i) const {
    l1::ChunkKey key;
    key.ns = ns_;
    key.chunk_hash.fill(0);
    key.chunk_hash[0] = i;
    key.chunk_hash[1] = 0x5a;
    return key;
  }
  std::vector<l1::ChunkKey> Keys(uint8_t n) const {
    std::vector<l1::ChunkKey> keys;
    for (uint8_t i = 0; i < n; ++i) keys.push_back(Key(i));
    return keys;
  }
  void Write(const l1::ChunkKey& key, uint64_t size = kObject) {
    auto r = l1_->ReserveWrite(key, 1, 0, size);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->Commit());
  }
  size_t Hits(const std::vector<l1::ChunkKey>& keys) {
    const size_t hits = l1_->LookupAndLock("probe", 0, keys, 1, 0);
    l1_->ReleaseAllLocks("probe");
    return hits;
  }

  FakeClock clock_;
  ServerConfig config_;
  SessionTable sessions_{&clock_, 256, 60};
  CompletionLog log_;
  std::unique_ptr<l1::L1Cache> l1_;
  std::unique_ptr<ChunkIo> io_;
  l1::NamespaceId ns_ = 0;
  Instance inst_;
};

TEST_F(ChunkIoTest, ReserveLeavesOutChunksThatHoldNothingAndChunksAlreadyThere) {
  Write(Key(2));
  const auto keys = Keys(4);
  auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/false,
                             [](size_t i) { return i == 1; });
  ASSERT_TRUE(writes.ok()) << writes.status().ToString();
  ASSERT_EQ(writes->size(), 2u);
  EXPECT_EQ(writes->chunk(0), 0);
  EXPECT_EQ(writes->chunk(1), 3);
  EXPECT_EQ(writes->key(1), Key(3));
  EXPECT_EQ(writes->bytes(), 2 * kObject);
  EXPECT_EQ(l1_->stats().staging_objects, 2u);
  EXPECT_FALSE(l1_->DescribeSlot(Key(0), 0)->copy_in_flight);
}

TEST_F(ChunkIoTest, CopyInFlightMarksEveryReservationAsItIsMade) {
  const auto keys = Keys(3);
  auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/true);
  ASSERT_TRUE(writes.ok());
  for (const auto& key : keys) EXPECT_TRUE(l1_->DescribeSlot(key, 0)->copy_in_flight);
  // Past the write TTL the reservations are still the copy's: every one commits.
  clock_.AdvanceSeconds(3600);
  EXPECT_EQ(writes->CommitLastFirst("lost").size(), 3u);
}

TEST_F(ChunkIoTest, AReserveThatFailsPartWayLeavesNothingReservedOrVisible) {
  Make(2);  // room for two objects; the third cannot be reserved (the others are staging)
  const auto keys = Keys(3);
  auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/true);
  ASSERT_FALSE(writes.ok());
  EXPECT_EQ(writes.status().code(), StatusCode::kResourceExhausted);
  const l1::L1Stats stats = l1_->stats();
  EXPECT_EQ(stats.staging_objects, 0u);
  EXPECT_EQ(stats.copies_in_flight, 0u);
  EXPECT_EQ(stats.entries, 0u);
  EXPECT_EQ(stats.used_bytes, 0u);
  EXPECT_EQ(stats.aborts, 2u);
  EXPECT_EQ(Hits(keys), 0u);
  EXPECT_TRUE(log_.completed().empty());
}

TEST_F(ChunkIoTest, WritesNeverCommittedAreAbortedWhenDropped) {
  const auto keys = Keys(3);
  {
    auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/true);
    ASSERT_TRUE(writes.ok());
    EXPECT_EQ(l1_->stats().staging_objects, 3u);
  }
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
  EXPECT_EQ(l1_->stats().entries, 0u);
  EXPECT_EQ(Hits(keys), 0u);

  auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/false);
  ASSERT_TRUE(writes.ok());
  writes->Abort();
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
  EXPECT_EQ(writes->size(), 3u);  // what was reserved, still described
  EXPECT_TRUE(writes->CommitLastFirst("lost").empty());
}

TEST_F(ChunkIoTest, CommitsLastChunkFirstSoALookupGainsTheRequestOnlyWithItsFirstChunk) {
  const auto keys = Keys(4);
  auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/false);
  ASSERT_TRUE(writes.ok());
  EXPECT_EQ(Hits(keys), 0u);
  const std::vector<l1::ChunkKey> committed = writes->CommitLastFirst("lost");
  const std::vector<l1::ChunkKey> last_first = {Key(3), Key(2), Key(1), Key(0)};
  EXPECT_EQ(committed, last_first);
  // The order lookups saw them become visible in: chunk 0, which a prefix lookup needs
  // before any other, came last.
  EXPECT_EQ(log_.completed(), last_first);
  EXPECT_EQ(Hits(keys), 4u);
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
}

TEST_F(ChunkIoTest, AReservationThatLostItsSlotIsNotHandedOn) {
  const auto keys = Keys(3);
  auto writes = io_->Reserve(keys, inst_, 0, /*copy_in_flight=*/false);
  ASSERT_TRUE(writes.ok());
  clock_.AdvanceSeconds(3600);  // past the write TTL: another writer reclaims chunk 1
  Write(Key(1));
  const std::vector<l1::ChunkKey> committed = writes->CommitLastFirst("lost");
  EXPECT_EQ(committed, (std::vector<l1::ChunkKey>{Key(2), Key(0)}));
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
  EXPECT_EQ(Hits(keys), 3u);
}

TEST_F(ChunkIoTest, PinsTheFirstNChunksInOrderAndReleasesThem) {
  const auto keys = Keys(3);
  for (const auto& key : keys) Write(key);
  RequestChunks chunks;
  chunks.keys = keys;
  ChunkPins pins;
  PinMiss miss;
  ASSERT_TRUE(io_->Pin(chunks, 2, 0, kObject, &pins, &miss));
  ASSERT_EQ(pins.size(), 2u);
  EXPECT_EQ(pins[0].offset(), l1_->DescribeSlot(Key(0), 0)->offset);
  EXPECT_EQ(pins[1].offset(), l1_->DescribeSlot(Key(1), 0)->offset);
  EXPECT_EQ(l1_->stats().pinned_objects, 2u);
  pins.Release();
  EXPECT_EQ(pins.size(), 0u);
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);

  ASSERT_TRUE(io_->Pin(chunks, 3, 0, kObject, &pins, &miss));
  pins.ReleaseFirstToLast();
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);
}

TEST_F(ChunkIoTest, PinStopsAtTheFirstMissAndNoPinOutlivesItsHolders) {
  Write(Key(0));
  Write(Key(1));
  Write(Key(3));  // chunk 2 absent
  RequestChunks chunks;
  chunks.keys = Keys(4);
  {
    ChunkPins pins;
    PinMiss miss;
    EXPECT_FALSE(io_->Pin(chunks, 4, 0, kObject, &pins, &miss));
    EXPECT_EQ(miss.chunk, 2u);
    EXPECT_FALSE(miss.wrong_size.valid());
    EXPECT_EQ(pins.size(), 2u);  // the caller drops them when its lock order says so
    EXPECT_EQ(l1_->stats().pinned_objects, 2u);
  }
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);

  // A resident object of another size: the miss holds its pin.
  const l1::ChunkKey odd = Key(9);
  Write(odd, 2 * kObject);
  chunks.keys = {Key(0), odd};
  {
    ChunkPins pins;
    PinMiss miss;
    EXPECT_FALSE(io_->Pin(chunks, 2, 0, kObject, &pins, &miss));
    EXPECT_EQ(miss.chunk, 1u);
    ASSERT_TRUE(miss.wrong_size.valid());
    EXPECT_EQ(miss.wrong_size.size(), 2 * kObject);
    EXPECT_EQ(l1_->stats().pinned_objects, 2u);
  }
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);

  // Nothing of the namespace is cached: the first chunk misses.
  RequestChunks unknown;
  unknown.namespace_known = false;
  ChunkPins pins;
  PinMiss miss;
  EXPECT_FALSE(io_->Pin(unknown, 3, 0, kObject, &pins, &miss));
  EXPECT_EQ(miss.chunk, 0u);
  EXPECT_EQ(pins.size(), 0u);
  EXPECT_TRUE(io_->Pin(unknown, 0, 0, kObject, &pins, &miss));
}

TEST(ChunkIoChecksTest, RegistrationIdentityAndKeys) {
  EXPECT_TRUE(CheckInstanceIdentity("m", 1).ok());
  EXPECT_TRUE(CheckInstanceIdentity("m", kMaxWorldSize).ok());
  EXPECT_EQ(CheckInstanceIdentity("m", 0).message(), "world_size 0 out of range [1, 4096]");
  EXPECT_EQ(CheckInstanceIdentity("m", 4097).message(), "world_size 4097 out of range [1, 4096]");
  EXPECT_EQ(CheckInstanceIdentity("", 1).message(),
            "model_name must be non-empty and must not contain '@'");
  EXPECT_EQ(CheckInstanceIdentity("a@b", 1).code(), StatusCode::kInvalidArgument);

  Instance inst;
  inst.model_name = "llama";
  inst.world_size = 2;
  wire::CacheKey key;
  key.model_name = "llama";
  key.world_size = 2;
  EXPECT_TRUE(KeyMatchesInstance("store", key, inst).ok());
  key.world_size = 4;
  EXPECT_EQ(KeyMatchesInstance("store", key, inst).message(),
            "store: key names model 'llama' world_size 4, the instance registered 'llama' 2");
}

}  // namespace
}  // namespace kvd::server
