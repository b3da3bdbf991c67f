// KvService end to end on real POSIX shared memory: a fake worker's KV tensors live in
// a segment this test creates, exactly as the lmcache client's CpuShmTensorWrapper does.
#include "server/kv_service.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

namespace kvd::server {
namespace {

constexpr int64_t kChunk = 256;
constexpr int64_t kBlock = 16;
constexpr int64_t kBlocks = 64;
constexpr int64_t kHeads = 2, kHead = 8;   // hidden = 16 elements of 2 bytes
constexpr int64_t kLayers = 2;
constexpr int64_t kPlane = kBlocks * kBlock * kHeads * kHead;  // elements per K or V
constexpr int64_t kLayerElems = 2 * kPlane;
constexpr uint64_t kLayerBytes = kLayerElems * 2;

// One worker's KV cache: kLayers tensors [2, NB, BS, NH, HS] bf16 in one shm segment.
class FakeWorker {
 public:
  // The pid keeps names apart when ctest runs tests of this binary in parallel processes.
  explicit FakeWorker(std::string name) : name_(std::move(name) + "_" + std::to_string(getpid())) {
    shm_unlink(name_.c_str());
    int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kLayerBytes * kLayers), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, kLayerBytes * kLayers, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~FakeWorker() {
    munmap(data_, kLayerBytes * kLayers);
    shm_unlink(name_.c_str());
  }
  wire::RegisterKvCacheRequest Registration(int64_t id, int64_t world_size) const {
    wire::RegisterKvCacheRequest r;
    r.instance_id = id;
    r.model_name = "llama";
    r.world_size = world_size;
    r.engine_type = "vllm";
    for (int64_t l = 0; l < kLayers; ++l) {
      wire::TensorDescriptor t;
      t.dtype = "bfloat16";
      t.shape = {2, kBlocks, kBlock, kHeads, kHead};
      t.stride = {kPlane, kBlock * kHeads * kHead, kHeads * kHead, kHead, 1};
      t.storage_offset = l * kLayerElems;
      t.shm_name = name_;
      t.nbytes = kLayerBytes * kLayers;
      t.device_uuid = "cpu";
      r.tensors.push_back(t);
    }
    return r;
  }
  // Bytes of one (layer, kv, block).
  uint8_t* Block(int64_t layer, int64_t kv, int64_t block) const {
    return data_ + layer * kLayerBytes + (kv * kPlane + block * kBlock * kHeads * kHead) * 2;
  }
  static constexpr size_t kBlockBytes = kBlock * kHeads * kHead * 2;
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < kLayerBytes * kLayers; ++i) data_[i] = static_cast<uint8_t>(rng());
  }
  void Zero() { std::memset(data_, 0, kLayerBytes * kLayers); }

 private:
  std::string name_;
  uint8_t* data_ = nullptr;
};

wire::CacheKey Key(std::optional<int64_t> worker, int64_t n_tokens, int64_t start, int64_t end,
                   int64_t world_size, const std::string& rid, int64_t token_seed = 1) {
  wire::CacheKey k;
  k.model_name = "llama";
  k.world_size = world_size;
  k.worker_id = worker;
  for (int64_t i = 0; i < n_tokens; ++i) k.token_ids.push_back((i * 31 + token_seed) % 32000);
  k.start = start;
  k.end = end;
  k.request_id = rid;
  k.num_kv_readers = 1;
  return k;
}

std::vector<std::vector<int64_t>> Blocks(int64_t first, int64_t count) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(first + i);
  return {ids};
}

class KvServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.l1_size_gb = 64.0 / 1024;  // 64 MiB
    cfg_.eviction_policy = "LRU";
    cfg_.shm_name = "kvd_test_pool_" + std::to_string(getpid());
    auto s = KvService::Create(cfg_, &clock_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    svc_ = std::move(s).value();
  }
  int64_t LookupHits(const wire::CacheKey& key) {
    wire::LookupRequest lr{key, 1};
    EXPECT_TRUE(svc_->Lookup(lr).ok());
    return svc_->QueryPrefetchStatus(key.request_id).value_or(-1);
  }
  ServerConfig cfg_;
  FakeClock clock_;
  std::unique_ptr<KvService> svc_;
};

TEST_F(KvServiceTest, StoreLookupRetrieveRoundTripTwoRanks) {
  FakeWorker w0("/kvd_test_w0"), w1("/kvd_test_w1");
  w0.Fill(1);
  w1.Fill(2);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 2)).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(w1.Registration(101, 2)).ok());
  const int64_t bpc = kChunk / kBlock;
  // 600 tokens: 2 full chunks and a partial one that is never stored.
  for (int rank = 0; rank < 2; ++rank) {
    wire::TransferRequest st{Key(rank, 600, 0, 512, 2, "r1"), 100 + rank, Blocks(0, 2 * bpc), "", 0};
    ASSERT_TRUE(svc_->Store(st).ok());
  }
  EXPECT_EQ(LookupHits(Key(std::nullopt, 600, 0, 512, 2, "r2")), 2);
  // Retrieve into other blocks of zeroed tensors and compare with the source blocks.
  std::vector<uint8_t> before0(FakeWorker::kBlockBytes * 2 * bpc * 2 * kLayers);
  size_t off = 0;
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t b = 0; b < 2 * bpc; ++b, off += FakeWorker::kBlockBytes)
        std::memcpy(before0.data() + off, w0.Block(l, kv, b), FakeWorker::kBlockBytes);
  w0.Zero();
  wire::TransferRequest rt{Key(0, 600, 0, 512, 2, "r2"), 100, Blocks(32, 2 * bpc), "", 0};
  ASSERT_TRUE(svc_->Retrieve(rt).ok());
  off = 0;
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t b = 0; b < 2 * bpc; ++b, off += FakeWorker::kBlockBytes) {
        ASSERT_EQ(std::memcmp(before0.data() + off, w0.Block(l, kv, 32 + b), FakeWorker::kBlockBytes), 0)
            << "layer " << l << " kv " << kv << " block " << b;
        std::vector<uint8_t> zero(FakeWorker::kBlockBytes, 0);
        ASSERT_EQ(std::memcmp(zero.data(), w0.Block(l, kv, b), FakeWorker::kBlockBytes), 0);
      }
  auto c = svc_->l1_stats();
  EXPECT_EQ(c.resident_objects, 4u);  // 2 chunks × 2 ranks
}

// Regression (cold lookup without a session): when LOOKUP results moved out of the session
// table, a LOOKUP that hashed nothing (nothing of its namespace cached yet, as on a cold start)
// no longer opened the request's session, so each worker's STORE of the request hashed its
// chunks again (STOREs use a session only if it exists). The session exists from the LOOKUP
// on: two ranks' stores of 2 chunks hash 2 chunks, not 4.
TEST_F(KvServiceTest, ColdLookupOpensTheSessionSoTheWorkersStoresHashOnce) {
  FakeWorker w0("/kvd_test_cw0"), w1("/kvd_test_cw1");
  w0.Fill(1);
  w1.Fill(2);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(110, 2)).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(w1.Registration(111, 2)).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 512, 0, 512, 2, "cold")), 0);
  EXPECT_EQ(svc_->CountsSnapshot().sessions, 1u);
  const uint64_t before = svc_->hashed_chunks();
  const int64_t bpc = kChunk / kBlock;
  for (int rank = 0; rank < 2; ++rank) {
    wire::TransferRequest st{Key(rank, 512, 0, 512, 2, "cold"), 110 + rank, Blocks(0, 2 * bpc), "", 0};
    ASSERT_TRUE(svc_->Store(st).ok());
  }
  EXPECT_EQ(svc_->hashed_chunks() - before, 2u);
  svc_->EndSession("cold");
  EXPECT_EQ(svc_->CountsSnapshot().sessions, 0u);
}

TEST_F(KvServiceTest, ChunkStoredByOneRankOnlyIsNotAHit) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(3);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 2)).ok());
  wire::TransferRequest st{Key(0, 512, 0, 512, 2, "r"), 100, Blocks(0, 32), "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 512, 0, 512, 2, "q")), 0);
}

TEST_F(KvServiceTest, SharedPrefixHitsExactlyTheSharedChunks) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(4);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  wire::TransferRequest st{Key(0, 768, 0, 768, 1, "a"), 100, Blocks(0, 48), "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  auto other = Key(std::nullopt, 768, 0, 768, 1, "b");
  other.token_ids[600] += 1;  // diverges inside chunk 2
  EXPECT_EQ(LookupHits(other), 2);
  auto salted = Key(std::nullopt, 768, 0, 768, 1, "c");
  salted.cache_salt = "tenant-b";
  EXPECT_EQ(LookupHits(salted), 0);
  // Unknown request: 0 (and the answer is given once).
  EXPECT_EQ(svc_->QueryPrefetchStatus("nobody").value_or(0), 0);
}

TEST_F(KvServiceTest, BadBlockIdsFailAndChangeNothing) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(5);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  auto ids = Blocks(0, 16);
  ids[0][5] = kBlocks;  // out of range
  wire::TransferRequest st{Key(0, 256, 0, 256, 1, "r"), 100, ids, "", 0};
  Status s = svc_->Store(st);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out of range"), std::string::npos);
  wire::TransferRequest few{Key(0, 256, 0, 256, 1, "r"), 100, Blocks(0, 15), "", 0};
  EXPECT_FALSE(svc_->Store(few).ok());
  EXPECT_EQ(svc_->l1_stats().entries, 0u);
  EXPECT_EQ(svc_->l1_stats().used_bytes, 0u);
  // Unregistered instance, misaligned range.
  wire::TransferRequest unknown{Key(0, 256, 0, 256, 1, "r"), 999, Blocks(0, 16), "", 0};
  EXPECT_EQ(svc_->Store(unknown).code(), StatusCode::kNotFound);
  wire::TransferRequest mis{Key(0, 300, 0, 300, 1, "r"), 100, Blocks(0, 16), "", 0};
  EXPECT_FALSE(svc_->Store(mis).ok());
  EXPECT_FALSE(svc_->Retrieve(unknown).ok());
}

TEST_F(KvServiceTest, RetrieveHonoursSkipFirstNTokens) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(6);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  wire::TransferRequest st{Key(0, 256, 0, 256, 1, "r"), 100, Blocks(0, 16), "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "q")), 1);
  std::vector<uint8_t> src(FakeWorker::kBlockBytes);
  std::memcpy(src.data(), w0.Block(0, 0, 2), src.size());
  w0.Zero();
  std::memset(w0.Block(0, 0, 34), 0xAB, FakeWorker::kBlockBytes);
  // Skip 40 tokens = 2 full blocks + 8 tokens of the third.
  wire::TransferRequest rt{Key(0, 256, 0, 256, 1, "q"), 100, Blocks(32, 16), "", 40};
  ASSERT_TRUE(svc_->Retrieve(rt).ok());
  const size_t tok = kHeads * kHead * 2;
  for (size_t i = 0; i < 8 * tok; ++i) ASSERT_EQ(w0.Block(0, 0, 34)[i], 0xAB) << i;
  EXPECT_EQ(std::memcmp(w0.Block(0, 0, 34) + 8 * tok, src.data() + 8 * tok, 8 * tok), 0);
  for (size_t i = 0; i < FakeWorker::kBlockBytes; ++i) ASSERT_EQ(w0.Block(0, 0, 32)[i], 0) << i;
}

TEST_F(KvServiceTest, RetrieveOfMissingChunkFailsWithoutWriting) {
  FakeWorker w0("/kvd_test_w0");
  w0.Zero();
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  wire::TransferRequest rt{Key(0, 256, 0, 256, 1, "q"), 100, Blocks(0, 16), "", 0};
  EXPECT_EQ(svc_->Retrieve(rt).code(), StatusCode::kNotFound);
}

TEST_F(KvServiceTest, EvictionUnderPressureNeverServesWrongBytes) {
  cfg_.l1_size_gb = 128.0 / (1024 * 1024);  // 128 KiB: four 32 KiB chunk objects
  svc_.reset();
  auto s = KvService::Create(cfg_, &clock_);
  ASSERT_TRUE(s.ok());
  svc_ = std::move(s).value();
  FakeWorker w0("/kvd_test_w0");
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  // Store 12 distinct one-chunk prompts, each with its own data.
  for (int p = 0; p < 12; ++p) {
    w0.Fill(100 + p);
    wire::TransferRequest st{Key(0, 256, 0, 256, 1, "s" + std::to_string(p), p), 100, Blocks(0, 16), "", 0};
    ASSERT_TRUE(svc_->Store(st).ok()) << p;
  }
  EXPECT_GT(svc_->l1_stats().evictions, 0u);
  int hits = 0;
  for (int p = 0; p < 12; ++p) {
    auto key = Key(std::nullopt, 256, 0, 256, 1, "l" + std::to_string(p), p);
    if (LookupHits(key) == 0) continue;
    ++hits;
    FakeWorker ref("/kvd_test_ref");
    ref.Fill(100 + p);
    w0.Zero();
    wire::TransferRequest rt{Key(0, 256, 0, 256, 1, "l" + std::to_string(p), p), 100, Blocks(16, 16), "", 0};
    ASSERT_TRUE(svc_->Retrieve(rt).ok());
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t kv = 0; kv < 2; ++kv)
        for (int64_t b = 0; b < 16; ++b)
          ASSERT_EQ(std::memcmp(ref.Block(l, kv, b), w0.Block(l, kv, 16 + b), FakeWorker::kBlockBytes), 0);
  }
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, 12);
}

TEST_F(KvServiceTest, ReRegistrationKeepsInstanceAndUnregisterForgetsIt) {
  FakeWorker w0("/kvd_test_w0");
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  EXPECT_EQ(svc_->num_instances(), 1u);
  ASSERT_TRUE(svc_->Unregister(100).ok());
  EXPECT_EQ(svc_->num_instances(), 0u);
  EXPECT_EQ(svc_->Unregister(100).code(), StatusCode::kNotFound);
}

TEST_F(KvServiceTest, RegistrationRefusesBadTensors) {
  FakeWorker w0("/kvd_test_w0");
  auto r = w0.Registration(100, 1);
  r.tensors[1].nbytes = 10;  // view larger than the mapping
  EXPECT_EQ(svc_->RegisterKvCache(r).code(), StatusCode::kInvalidArgument);
  r = w0.Registration(100, 1);
  r.tensors[0].shm_name = "/../etc/passwd";
  EXPECT_FALSE(svc_->RegisterKvCache(r).ok());
  r = w0.Registration(100, 1);
  r.tensors[0].shm_name = "/kvd_test_does_not_exist";
  EXPECT_EQ(svc_->RegisterKvCache(r).code(), StatusCode::kNotFound);
  r = w0.Registration(100, 1);
  r.tensors[0].memory = wire::TensorMemory::kCuda;
  Status st = svc_->RegisterKvCache(r);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("CUDA"), std::string::npos);
  EXPECT_EQ(svc_->num_instances(), 0u);
}

TEST_F(KvServiceTest, LookupBeforeAnyRegistrationHitsNothing) {
  EXPECT_EQ(LookupHits(Key(std::nullopt, 512, 0, 512, 1, "r")), 0);
}

// The engine-driven registration the tests below use: instance 7, "llama", world size 1,
// 2 layers of 16-wide bf16 KV in 16-token blocks, 256 slots.
wire::RegisterEngineDrivenRequest EngineDrivenLlama() {
  wire::RegisterEngineDrivenRequest reg;
  reg.instance_id = 7;
  reg.model_name = "llama";
  reg.world_size = 1;
  reg.block_size = 16;
  reg.num_layers = 2;
  reg.hidden_dim_size = 16;
  reg.dtype_str = "bfloat16";
  reg.num_physical_slots = 256;
  return reg;
}

TEST_F(KvServiceTest, EngineDrivenPrepareCommitRoundTrip) {
  const wire::RegisterEngineDrivenRequest reg = EngineDrivenLlama();
  auto r = svc_->RegisterEngineDriven(reg);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->first, "/" + cfg_.shm_name);
  // Map the advertised pool the way the worker does.
  int fd = shm_open(r->first.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  auto* pool = static_cast<uint8_t*>(mmap(nullptr, r->second, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  wire::EngineDrivenRequest ps{Key(0, 512, 0, 512, 1, "e"), 7, ""};
  auto slots = svc_->PrepareStore(ps);
  ASSERT_TRUE(slots.ok());
  ASSERT_EQ(slots->first.size(), 2u);
  EXPECT_EQ(slots->second, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(slots->first[0].length, 2u * 2 * 256 * 16 * 2);
  EXPECT_EQ(slots->first[0].shape, (std::vector<int64_t>{2, 2, 256, 16}));
  for (size_t i = 0; i < 2; ++i) std::memset(pool + slots->first[i].offset, 0x10 + i, slots->first[i].length);
  EXPECT_EQ(LookupHits(Key(std::nullopt, 512, 0, 512, 1, "x")), 0);  // staging: invisible
  ASSERT_TRUE(svc_->CommitStore(ps).ok());
  EXPECT_FALSE(svc_->CommitStore(ps).ok());  // nothing pending any more
  EXPECT_EQ(LookupHits(Key(std::nullopt, 512, 0, 512, 1, "y")), 2);
  wire::EngineDrivenRequest pr{Key(0, 512, 0, 512, 1, "y"), 7, ""};
  auto rs = svc_->PrepareRetrieve(pr);
  ASSERT_TRUE(rs.ok());
  ASSERT_EQ(rs->size(), 2u);
  EXPECT_EQ(pool[(*rs)[1].offset + 100], 0x11);
  ASSERT_TRUE(svc_->CommitRetrieve(pr).ok());
  // A second prepare_store of the same chunks has nothing to write.
  wire::EngineDrivenRequest again{Key(0, 512, 0, 512, 1, "z"), 7, ""};
  auto none = svc_->PrepareStore(again);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->first.empty());
  munmap(pool, r->second);
}

// Without tiers a LOOKUP can hit only in L1: it hashes no further than the first chunk L1
// lacks, so a new prompt costs one chunk's hash; the stores of the request hash the rest.
TEST_F(KvServiceTest, ALookupHashesNoFurtherThanL1CanHit) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(9);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  const int64_t bpc = kChunk / kBlock;  // the worker has 4 chunks' worth of blocks
  // Nothing of the model is cached yet: nothing to hash.
  uint64_t before = svc_->hashed_chunks();
  EXPECT_EQ(LookupHits(Key(std::nullopt, 4 * kChunk, 0, 4 * kChunk, 1, "first")), 0);
  EXPECT_EQ(svc_->hashed_chunks() - before, 0u);
  // Store chunks 0-1 of a 4-chunk prompt.
  wire::TransferRequest st{Key(0, 4 * kChunk, 0, 2 * kChunk, 1, "s"), 100, Blocks(0, 2 * bpc), "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  // A prompt none of whose chunks is cached: one chunk hashed, not 4.
  before = svc_->hashed_chunks();
  EXPECT_EQ(LookupHits(Key(std::nullopt, 4 * kChunk, 0, 4 * kChunk, 1, "new", 7)), 0);
  EXPECT_EQ(svc_->hashed_chunks() - before, 1u);
  // The stored prefix: 2 hits, hashed in batches [0,1) and [1,3) (chunk 2 is absent): 3.
  before = svc_->hashed_chunks();
  EXPECT_EQ(LookupHits(Key(std::nullopt, 4 * kChunk, 0, 4 * kChunk, 1, "hit")), 2);
  EXPECT_EQ(svc_->hashed_chunks() - before, 3u);
  // The request's store hashes the last chunk only and stores chunks 2-3; a lookup hits all.
  before = svc_->hashed_chunks();
  wire::TransferRequest rest{Key(0, 4 * kChunk, 2 * kChunk, 4 * kChunk, 1, "hit"), 100,
                             Blocks(2 * bpc, 2 * bpc), "", 0};
  ASSERT_TRUE(svc_->Store(rest).ok());
  EXPECT_EQ(svc_->hashed_chunks() - before, 1u);
  EXPECT_EQ(LookupHits(Key(std::nullopt, 4 * kChunk, 0, 4 * kChunk, 1, "all")), 4);
  // Bad tokens are refused over the whole range, whether or not they would be hashed.
  wire::CacheKey bad = Key(std::nullopt, 4 * kChunk, 0, 4 * kChunk, 1, "bad", 7);
  bad.token_ids = wire::TokenIds();
  for (int64_t i = 0; i < 4 * kChunk; ++i) bad.token_ids.push_back(i == 1000 ? -5 : i);
  EXPECT_FALSE(svc_->Lookup(wire::LookupRequest{bad, 1}).ok());
}

// Regression (a STORE without a session hashed its tokens twice with KV events on: once to
// bind the chunks' tokens for the "stored" events, once for the chunk keys).
TEST_F(KvServiceTest, StoreWithoutSessionHashesEachChunkOnceWithKvEventsOn) {
  ASSERT_NE(svc_->kv_events(), nullptr);  // the default config records KV events
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(5);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  // 3 full chunks, no LOOKUP before: no session exists for "nosession".
  uint64_t before = svc_->hashed_chunks();
  wire::TransferRequest st{Key(0, 768, 0, 768, 1, "nosession"), 100, Blocks(0, 48), "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  EXPECT_EQ(svc_->hashed_chunks() - before, 3u);
  // The store's chunks were bound: their commits are "stored" events with the tokens.
  EXPECT_EQ(svc_->kv_events()->stats().stored_records, 3u);
  EXPECT_EQ(svc_->kv_events()->stats().unbound_stores, 0u);
  // A store of a later range only: the whole prefix is hashed once, not twice.
  before = svc_->hashed_chunks();
  wire::TransferRequest tail{Key(0, 1024, 768, 1024, 1, "nosession2"), 100, Blocks(48, 16), "", 0};
  ASSERT_TRUE(svc_->Store(tail).ok());
  EXPECT_EQ(svc_->hashed_chunks() - before, 4u);
  // With a session (the scheduler's LOOKUP first), the store hashes nothing more.
  EXPECT_EQ(LookupHits(Key(std::nullopt, 512, 0, 512, 1, "withsession")), 2);
  before = svc_->hashed_chunks();
  wire::TransferRequest again{Key(0, 512, 0, 512, 1, "withsession"), 100, Blocks(0, 32), "", 0};
  ASSERT_TRUE(svc_->Store(again).ok());
  EXPECT_EQ(svc_->hashed_chunks() - before, 0u);
}

TEST_F(KvServiceTest, EngineDrivenPrepareStoreWithoutSessionHashesEachChunkOnce) {
  const wire::RegisterEngineDrivenRequest reg = EngineDrivenLlama();
  ASSERT_TRUE(svc_->RegisterEngineDriven(reg).ok());
  const uint64_t before = svc_->hashed_chunks();
  wire::EngineDrivenRequest ps{Key(0, 512, 0, 512, 1, "e"), 7, ""};
  auto slots = svc_->PrepareStore(ps);
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(svc_->hashed_chunks() - before, 2u);
  ASSERT_TRUE(svc_->CommitStore(ps).ok());
  EXPECT_EQ(svc_->kv_events()->stats().stored_records, 2u);
  EXPECT_EQ(svc_->kv_events()->stats().unbound_stores, 0u);
}

// Stores one chunk through an engine-driven instance; returns whether it committed.
bool EngineDrivenStoreOneChunk(KvService& svc, int64_t id, const std::string& rid) {
  wire::EngineDrivenRequest ps{Key(0, 256, 0, 256, 1, rid), id, ""};
  auto slots = svc.PrepareStore(ps);
  if (!slots.ok() || slots->first.size() != 1) return false;
  return svc.CommitStore(ps).ok();
}

wire::RegisterEngineDrivenRequest EngineDrivenRegistration(int64_t id, int64_t block_size,
                                                           bool single_plane) {
  wire::RegisterEngineDrivenRequest reg;
  reg.instance_id = id;
  reg.model_name = "llama";
  reg.world_size = 1;
  reg.block_size = block_size;
  reg.num_layers = 2;
  reg.hidden_dim_size = single_plane ? 32 : 16;
  reg.dtype_str = "bfloat16";
  reg.use_mla = single_plane;
  reg.num_physical_slots = 256;
  return reg;
}

// Regression: an engine-driven vLLM-CPU worker writes objects whose bytes depend on its
// block size (lmcache 0.5.6 gathers the CPU cache [NB, NH, BS, 2*HS] as rows of [K|V],
// docs/layouts.md), and a worker with another block size was served them: wrong KV.
// Single-plane engine-driven objects are now kept apart per block size: the other block
// size misses (and recomputes) instead.
TEST_F(KvServiceTest, EngineDrivenObjectsOfAnotherBlockSizeAreServed) {
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(7, 128, true)).ok());
  ASSERT_TRUE(EngineDrivenStoreOneChunk(*svc_, 7, "s128"));
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "l128")), 1);
  ASSERT_TRUE(svc_->Unregister(7).ok());

  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(8, 32, true)).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "l32")), 0);
  wire::EngineDrivenRequest pr{Key(0, 256, 0, 256, 1, "r32"), 8, ""};
  EXPECT_EQ(svc_->PrepareRetrieve(pr).status().code(), StatusCode::kNotFound);
  // Its own block size is served.
  ASSERT_TRUE(EngineDrivenStoreOneChunk(*svc_, 8, "s32"));
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "l32b")), 1);
  ASSERT_TRUE(svc_->Unregister(8).ok());

  // Two-plane objects ([2][layers][tokens][hidden], token rows) do not depend on the block
  // size and stay shared between block sizes.
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(9, 128, false)).ok());
  wire::EngineDrivenRequest ps{Key(0, 256, 0, 256, 1, "t", 5), 9, ""};
  ASSERT_TRUE(svc_->PrepareStore(ps).ok());
  ASSERT_TRUE(svc_->CommitStore(ps).ok());
  ASSERT_TRUE(svc_->Unregister(9).ok());
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(10, 32, false)).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "u", 5)), 1);
}

TEST_F(KvServiceTest, LookupsMissWhileWorkersWithDifferentObjectLayoutsAreRegistered) {
  // Block sizes 128 and 32 at once: a scheduler's LOOKUP cannot tell which of them its
  // workers are, so it reports no hit rather than lock chunks its workers cannot read.
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(7, 128, true)).ok());
  ASSERT_TRUE(EngineDrivenStoreOneChunk(*svc_, 7, "s"));
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "a")), 1);
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(8, 32, true)).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "b")), 0);
  ASSERT_TRUE(svc_->Unregister(8).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "c")), 1);
}

TEST_F(KvServiceTest, EngineDrivenModelNamesMustNotContainTheNamespaceSeparator) {
  auto reg = EngineDrivenRegistration(7, 128, true);
  reg.model_name = "llama@engine-driven";
  EXPECT_EQ(svc_->RegisterEngineDriven(reg).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(KvServiceTest, ReadLocksKeepLookedUpChunksFromEviction) {
  cfg_.l1_size_gb = 64.0 / (1024 * 1024);  // 64 KiB: two 32 KiB chunk objects
  svc_.reset();
  svc_ = std::move(KvService::Create(cfg_, &clock_)).value();
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(9);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  for (int p = 0; p < 2; ++p) {
    wire::TransferRequest st{Key(0, 256, 0, 256, 1, "s", p), 100, Blocks(0, 16), "", 0};
    ASSERT_TRUE(svc_->Store(st).ok());
  }
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "a", 0)), 1);
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "b", 1)), 1);
  // Both are read-locked: a third store cannot evict them and fails cleanly.
  wire::TransferRequest st3{Key(0, 256, 0, 256, 1, "t", 2), 100, Blocks(0, 16), "", 0};
  EXPECT_EQ(svc_->Store(st3).code(), StatusCode::kResourceExhausted);
  // After the read TTL the locks no longer protect them.
  clock_.AdvanceSeconds(cfg_.l1_read_ttl_seconds + 1);
  EXPECT_TRUE(svc_->Store(st3).ok());
}

TEST_F(KvServiceTest, ChunksMadeOnlyOfTheNullBlockAreNotStored) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(11);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  // Chunk 0 all null (block 0), chunk 1 real blocks, chunk 2 mixes null and real.
  std::vector<int64_t> ids(16, 0);
  for (int64_t b = 0; b < 16; ++b) ids.push_back(16 + b);
  for (int64_t b = 0; b < 16; ++b) ids.push_back(b % 2 ? 0 : 32 + b);
  wire::TransferRequest st{Key(0, 768, 0, 768, 1, "n"), 100, {ids}, "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  EXPECT_EQ(svc_->l1_stats().resident_objects, 2u);
  EXPECT_EQ(LookupHits(Key(std::nullopt, 768, 0, 768, 1, "q")), 0);  // chunk 0 missing
}

}  // namespace
}  // namespace kvd::server

namespace kvd::server {
namespace {

// Issue 11, finding 1: a segment another instance maps, or kvd's own pool, is refused.
TEST_F(KvServiceTest, Finding1SegmentMappedByAnotherInstanceIsRefused) {
  FakeWorker w("/kvd_test_f1");
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(1, 1)).ok());
  Status st = svc_->RegisterKvCache(w.Registration(2, 1));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("already registered by instance 1"), std::string::npos);
  EXPECT_EQ(svc_->num_instances(), 1u);
  EXPECT_TRUE(svc_->RegisterKvCache(w.Registration(1, 1)).ok());  // its own: fine
  ASSERT_TRUE(svc_->Unregister(1).ok());
  EXPECT_TRUE(svc_->RegisterKvCache(w.Registration(2, 1)).ok());  // free again
}

TEST_F(KvServiceTest, Finding1TheL1PoolIsNotAClientTensor) {
  FakeWorker w("/kvd_test_f1pool");
  auto reg = w.Registration(3, 1);
  for (auto& t : reg.tensors) {
    t.shm_name = "/" + cfg_.shm_name;
    t.nbytes = 4096 * 256;
  }
  Status st = svc_->RegisterKvCache(reg);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("kvd's own memory"), std::string::npos) << st.ToString();
  EXPECT_EQ(svc_->num_instances(), 0u);
}

// Issue 11 finding 5 (read locks): they were one counter per slot, so any request's
// FREE_LOOKUP_LOCKS or RETRIEVE released another request's lock. Locks are owned by the
// lookup request that took them.
class ReadLockFinding5Test : public KvServiceTest {
 protected:
  // An L1 of exactly two 32 KiB chunk objects holding P (seed 0) and Q (seed 1).
  void SetUp() override {
    KvServiceTest::SetUp();
    cfg_.l1_size_gb = 64.0 / (1024 * 1024);
    svc_.reset();
    svc_ = std::move(KvService::Create(cfg_, &clock_)).value();
    worker_ = std::make_unique<FakeWorker>("/kvd_test_f5");
    worker_->Fill(21);
    ASSERT_TRUE(svc_->RegisterKvCache(worker_->Registration(100, 1)).ok());
    for (int p = 0; p < 2; ++p) {
      wire::TransferRequest st{Key(0, 256, 0, 256, 1, "store", p), 100, Blocks(0, 16), "", 0};
      ASSERT_TRUE(svc_->Store(st).ok());
    }
  }
  Status StoreThird() {
    wire::TransferRequest st{Key(0, 256, 0, 256, 1, "third", 2), 100, Blocks(0, 16), "", 0};
    return svc_->Store(st);
  }
  Status RetrieveP(const std::string& rid) {
    wire::TransferRequest rt{Key(0, 256, 0, 256, 1, rid, 0), 100, Blocks(32, 16), "", 0};
    return svc_->Retrieve(rt);
  }
  std::unique_ptr<FakeWorker> worker_;
};

TEST_F(ReadLockFinding5Test, Finding5OtherRequestsCannotReleaseALookupsLocks) {
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "a", 0)), 1);  // a holds P
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "c", 1)), 1);  // c holds Q
  // Request b never looked P up: its FREE_LOOKUP_LOCKS and RETRIEVE release nothing of a's.
  ASSERT_TRUE(svc_->FreeLookupLocks({Key(std::nullopt, 256, 0, 256, 1, "b", 0), 1}).ok());
  ASSERT_TRUE(RetrieveP("b").ok());
  // Both chunks are still read-locked: a store that needs room cannot evict either.
  EXPECT_EQ(StoreThird().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(RetrieveP("a").ok());
  // a's retrieve released a's lock: P can go now.
  EXPECT_TRUE(StoreThird().ok());
}

TEST_F(ReadLockFinding5Test, Finding5HotPrefixKeepsEveryLookupsLock) {
  constexpr int kLookups = 200;  // more than the old cap of 128 locks per slot
  for (int i = 0; i < kLookups; ++i) {
    ASSERT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "h" + std::to_string(i), 0)), 1);
  }
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "c", 1)), 1);
  for (int i = 0; i + 1 < kLookups; ++i) ASSERT_TRUE(RetrieveP("h" + std::to_string(i)).ok());
  // The last lookup's lock still holds P.
  EXPECT_EQ(StoreThird().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(RetrieveP("h" + std::to_string(kLookups - 1)).ok());
  EXPECT_TRUE(StoreThird().ok());
}

}  // namespace
}  // namespace kvd::server

namespace kvd::server {
namespace {

// Issue 11, finding 4: a re-registration that changes anything rebuilds the instance; the
// same registration again only refreshes liveness.
TEST_F(KvServiceTest, Finding4ReRegistrationWithOtherSegmentsRebuildsTheInstance) {
  FakeWorker a("/kvd_test_f4a"), b("/kvd_test_f4b");
  a.Fill(1);
  b.Fill(2);
  const int64_t bpc = kChunk / kBlock;
  ASSERT_TRUE(svc_->RegisterKvCache(a.Registration(7, 1)).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(b.Registration(7, 1)).ok());  // the worker moved to b
  wire::TransferRequest st{Key(0, 512, 0, 512, 1, "s"), 7, Blocks(0, 2 * bpc), "", 0};
  ASSERT_TRUE(svc_->Store(st).ok());
  std::vector<uint8_t> want(FakeWorker::kBlockBytes);
  std::memcpy(want.data(), b.Block(0, 0, 0), want.size());
  b.Zero();
  a.Zero();
  wire::TransferRequest rt{Key(0, 512, 0, 512, 1, "s"), 7, Blocks(0, 2 * bpc), "", 0};
  ASSERT_TRUE(svc_->Retrieve(rt).ok());
  EXPECT_EQ(std::memcmp(b.Block(0, 0, 0), want.data(), want.size()), 0)
      << "the store read, or the retrieve wrote, the old segment";
  std::vector<uint8_t> zero(FakeWorker::kBlockBytes, 0);
  EXPECT_EQ(std::memcmp(a.Block(0, 0, 0), zero.data(), zero.size()), 0);
  // a is free again: another instance may register it.
  EXPECT_TRUE(svc_->RegisterKvCache(a.Registration(8, 1)).ok());
}

TEST_F(KvServiceTest, Finding4AnyDescriptorChangeRebuilds) {
  FakeWorker a("/kvd_test_f4c");
  a.Fill(3);
  const int64_t bpc = kChunk / kBlock;
  auto reg = a.Registration(9, 1);
  ASSERT_TRUE(svc_->RegisterKvCache(reg).ok());
  // Same segment, same tensor count, but the worker now keeps layer 0 where layer 1 was
  // (storage offsets swapped): the store must gather with the new descriptors.
  auto swapped = reg;
  std::swap(swapped.tensors[0].storage_offset, swapped.tensors[1].storage_offset);
  ASSERT_TRUE(svc_->RegisterKvCache(swapped).ok());
  ASSERT_TRUE(svc_->Store(wire::TransferRequest{Key(0, 512, 0, 512, 1, "s"), 9, Blocks(0, 2 * bpc), "", 0}).ok());
  std::vector<uint8_t> layer1(FakeWorker::kBlockBytes);
  std::memcpy(layer1.data(), a.Block(1, 0, 0), layer1.size());
  // Back to the original descriptors, then retrieve: the object's layer 0 (read from where
  // layer 1 lives) lands in layer 0.
  ASSERT_TRUE(svc_->RegisterKvCache(reg).ok());
  a.Zero();
  ASSERT_TRUE(svc_->Retrieve(wire::TransferRequest{Key(0, 512, 0, 512, 1, "s"), 9, Blocks(0, 2 * bpc), "", 0}).ok());
  EXPECT_EQ(std::memcmp(a.Block(0, 0, 0), layer1.data(), layer1.size()), 0)
      << "a re-registration with other offsets kept the old layout";
  // The identical registration again only refreshes liveness.
  clock_.AdvanceSeconds(10);
  ASSERT_TRUE(svc_->RegisterKvCache(reg).ok());
  const auto st = svc_->StatusSnapshot();
  ASSERT_EQ(st.instances.size(), 1u);
  EXPECT_DOUBLE_EQ(st.instances[0].idle_seconds, 0.0);
}

}  // namespace
}  // namespace kvd::server

namespace kvd::server {
namespace {

// Issue 11, finding 6: PREPARE_STORE / PREPARE_RETRIEVE check the key's model and world size
// against the engine-driven instance, as STORE / RETRIEVE do.
TEST_F(KvServiceTest, Finding6PrepareOpsCheckModelAndWorldSize) {
  wire::RegisterEngineDrivenRequest reg;
  reg.instance_id = 40;
  reg.model_name = "llama";
  reg.world_size = 1;
  reg.block_size = 16;
  reg.num_layers = 1;
  reg.hidden_dim_size = 16;
  reg.dtype_str = "bfloat16";
  ASSERT_TRUE(svc_->RegisterEngineDriven(reg).ok());
  auto other_model = Key(0, 512, 0, 512, 1, "p1");
  other_model.model_name = "mistral";
  auto st = svc_->PrepareStore(wire::EngineDrivenRequest{other_model, 40, ""});
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(svc_->l1_stats().staging_objects, 0u);
  auto other_ws = Key(0, 512, 0, 512, 2, "p2");  // world size 2, rank 0
  EXPECT_EQ(svc_->PrepareStore(wire::EngineDrivenRequest{other_ws, 40, ""}).status().code(),
            StatusCode::kInvalidArgument);
  // Objects of the instance's own model, then a retrieve that names another model.
  auto own = Key(0, 512, 0, 512, 1, "p3");
  own.model_name = "llama";
  ASSERT_TRUE(svc_->PrepareStore(wire::EngineDrivenRequest{own, 40, ""}).ok());
  ASSERT_TRUE(svc_->CommitStore(wire::EngineDrivenRequest{own, 40, ""}).ok());
  auto read_other = Key(0, 512, 0, 512, 1, "p4");
  read_other.model_name = "mistral";
  EXPECT_EQ(svc_->PrepareRetrieve(wire::EngineDrivenRequest{read_other, 40, ""}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
  auto read_own = Key(0, 512, 0, 512, 1, "p5");
  EXPECT_TRUE(svc_->PrepareRetrieve(wire::EngineDrivenRequest{read_own, 40, ""}).ok());
}

}  // namespace
}  // namespace kvd::server

// The labelled series (docs/metrics.md): lookups per (model_name, cache_salt) with lmcache's
// early-exit reasons, lmcache-driven transfers per device, copy throughput per instance.
namespace kvd::server {
namespace {

struct LookupCounts {
  uint64_t lookups = 0, requested = 0, l1 = 0, l2 = 0, l1_keys = 0, l2_keys = 0;
  std::array<uint64_t, static_cast<size_t>(EarlyExit::kCount)> early{};
  bool operator==(const LookupCounts&) const = default;
};

// The counters of one (model, salt); nullopt when the pair has no label set.
std::optional<LookupCounts> LookupsOf(const KvService& svc, const std::string& model,
                                      const std::string& salt) {
  std::optional<LookupCounts> out;
  svc.counters().lookups.ForEach([&](const std::array<std::string, 2>& l, const LookupValues& v) {
    if (l[0] != model || l[1] != salt) return;
    LookupCounts c{v.lookups.load(), v.requested_chunks.load(), v.hit_l1_chunks.load(),
                   v.hit_l2_chunks.load(), v.hit_l1_keys.load(), v.hit_l2_keys.load(), {}};
    for (size_t i = 0; i < c.early.size(); ++i) c.early[i] = v.early_exits[i].load();
    out = c;
  });
  return out;
}

constexpr size_t kNoGpu = static_cast<size_t>(EarlyExit::kNoGpuContext);
constexpr size_t kEmpty = static_cast<size_t>(EarlyExit::kEmptyChunkHashes);
constexpr size_t kMixed = static_cast<size_t>(EarlyExit::kMixedLayouts);

TEST_F(KvServiceTest, LookupsAreCountedPerModelAndSaltWithTheirEarlyExits) {
  FakeWorker w0("/kvd_test_w0"), w1("/kvd_test_w1");
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 2)).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(w1.Registration(101, 2)).ok());
  for (int rank = 0; rank < 2; ++rank) {
    wire::TransferRequest st{Key(rank, 800, 0, 512, 2, "s"), 100 + rank, Blocks(0, 32), "", 0};
    ASSERT_TRUE(svc_->Store(st).ok());
  }
  EXPECT_EQ(LookupHits(Key(std::nullopt, 800, 0, 768, 2, "a")), 2);  // 3 chunks asked, 2 hit
  auto salted = Key(std::nullopt, 800, 0, 768, 2, "b");
  salted.cache_salt = "tenant \"x\"";
  EXPECT_EQ(LookupHits(salted), 0);
  EXPECT_EQ(LookupHits(Key(std::nullopt, 100, 0, 0, 2, "short")), 0);  // no full chunk
  auto other = Key(std::nullopt, 512, 0, 512, 1, "c");
  other.model_name = "mistral";  // no worker registered it
  EXPECT_EQ(LookupHits(other), 0);

  LookupCounts plain{2, 3, 2, 0, 4, 0, {}};  // keys: 2 hit chunks x 2 ranks
  plain.early[kEmpty] = 1;
  EXPECT_EQ(LookupsOf(*svc_, "llama", ""), plain);
  EXPECT_EQ(LookupsOf(*svc_, "llama", "tenant \"x\""), (LookupCounts{1, 3, 0, 0, 0, 0, {}}));
  LookupCounts unknown{1, 0, 0, 0, 0, 0, {}};  // lmcache counts no tokens for an early exit
  unknown.early[kNoGpu] = 1;
  EXPECT_EQ(LookupsOf(*svc_, "mistral", ""), unknown);
  EXPECT_EQ(svc_->counters().lookups.size(), 3u);
}

TEST_F(KvServiceTest, LookupsOfAModelWhoseWorkersDisagreeOnLayoutExitEarly) {
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(7, 128, true)).ok());
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenRegistration(8, 32, true)).ok());
  EXPECT_EQ(LookupHits(Key(std::nullopt, 256, 0, 256, 1, "b")), 0);
  LookupCounts want{1, 0, 0, 0, 0, 0, {}};
  want.early[kMixed] = 1;
  EXPECT_EQ(LookupsOf(*svc_, "llama", ""), want);
}

TEST_F(KvServiceTest, LabelSetsBeyondTheCapAreCountedUnderOther) {
  svc_.reset();
  cfg_.metrics_max_label_sets = 2;
  auto s = KvService::Create(cfg_, &clock_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  svc_ = std::move(s).value();
  for (const char* salt : {"a", "b", "c", "d", "c"}) {
    auto k = Key(std::nullopt, 512, 0, 512, 1, std::string("r") + salt);
    k.cache_salt = salt;
    LookupHits(k);
  }
  EXPECT_TRUE(LookupsOf(*svc_, "llama", "a"));
  EXPECT_TRUE(LookupsOf(*svc_, "llama", "b"));
  EXPECT_FALSE(LookupsOf(*svc_, "llama", "c"));
  const auto& t = svc_->counters().lookups;
  EXPECT_EQ(t.overflow().lookups.load(), 3u);  // c, d, c
  EXPECT_EQ(t.refused(), 2u);                  // distinct pairs: c, d
  EXPECT_EQ(t.overflow_labels(), (std::array<std::string, 2>{"__other__", "__other__"}));
}

TEST_F(KvServiceTest, TransfersAreCountedPerDeviceAndTimedPerInstance) {
  FakeWorker w0("/kvd_test_w0");
  w0.Fill(9);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 1)).ok());
  ASSERT_TRUE(svc_->Store({Key(0, 512, 0, 512, 1, "s"), 100, Blocks(0, 32), "", 0}).ok());
  // The same chunks again: nothing to copy, still a submitted and finished STORE.
  ASSERT_TRUE(svc_->Store({Key(0, 512, 0, 512, 1, "s2"), 100, Blocks(0, 32), "", 0}).ok());
  ASSERT_TRUE(svc_->Retrieve({Key(0, 512, 0, 512, 1, "s"), 100, Blocks(32, 32), "", 0}).ok());
  // A RETRIEVE of chunks L1 does not have is submitted and over (failed) before any copy.
  EXPECT_FALSE(svc_->Retrieve({Key(0, 512, 0, 512, 1, "m", 7), 100, Blocks(32, 32), "", 0}).ok());
  // Requests of an unknown instance name no device: not counted there.
  EXPECT_FALSE(svc_->Store({Key(0, 512, 0, 512, 1, "u"), 999, Blocks(0, 32), "", 0}).ok());
  // Engine-driven transfers are not lmcache-driven transfers (lmcache does not count them).
  ASSERT_TRUE(svc_->RegisterEngineDriven(EngineDrivenLlama()).ok());
  wire::EngineDrivenRequest ps{Key(0, 256, 0, 256, 1, "e", 3), 7, ""};
  ASSERT_TRUE(svc_->PrepareStore(ps).ok());
  ASSERT_TRUE(svc_->CommitStore(ps).ok());

  std::vector<std::string> devices;
  const auto& counters = svc_->counters();
  counters.transfers.ForEach([&](const std::array<std::string, 1>& l, const TransferValues& v) {
    devices.push_back(l[0]);
    EXPECT_EQ(v.submitted_stores.load(), 2u);
    EXPECT_EQ(v.finished_stores.load(), 2u);
    EXPECT_EQ(v.submitted_retrieves.load(), 2u);
    EXPECT_EQ(v.finished_retrieves.load(), 2u);
  });
  EXPECT_EQ(devices, std::vector<std::string>{"cpu"});
  // Throughput: one sample per copy that moved bytes (the first STORE, the first RETRIEVE).
  int instances = 0;
  counters.throughput.ForEach([&](const std::array<std::string, 3>& l, const ThroughputValues& v) {
    ++instances;
    EXPECT_EQ(l, (std::array<std::string, 3>{"cpu", "100", "llama"}));
    uint64_t stores = 0, loads = 0;
    for (const auto& b : v.store.buckets) stores += b.load();
    for (const auto& b : v.load.buckets) loads += b.load();
    EXPECT_EQ(stores, 1u);
    EXPECT_EQ(loads, 1u);
    EXPECT_GT(v.store.sum.load(), 0);
    EXPECT_GT(v.load.sum.load(), 0);
  });
  EXPECT_EQ(instances, 1);
}

TEST(ThroughputHistogram, BucketsFollowPrometheusLeAndSkipEmptyCopies) {
  ThroughputHistogram h;
  h.Record(5'000'000'000, 1.0);   // exactly 5 GB/s: the le="5" bucket
  h.Record(6'000'000'000, 1.0);   // 6 GB/s: le="10"
  h.Record(1'000'000'000, 1e-5);  // 100000 GB/s: +Inf
  h.Record(0, 1.0);               // no bytes: not a sample
  h.Record(100, 0.0);             // no time: not a sample
  EXPECT_EQ(h.buckets[1].load(), 1u);
  EXPECT_EQ(h.buckets[2].load(), 1u);
  EXPECT_EQ(h.buckets[kThroughputBoundsGBps.size()].load(), 1u);
  uint64_t n = 0;
  for (const auto& b : h.buckets) n += b.load();
  EXPECT_EQ(n, 3u);
  EXPECT_DOUBLE_EQ(h.sum.load(), 5 + 6 + 100000);
}

}  // namespace
}  // namespace kvd::server

namespace kvd::server {
namespace {

// The families /status, /metrics and the dashboard read are registered by the service and
// follow its requests: stores and retrieves, L1, sessions and instances.
TEST_F(KvServiceTest, RegisteredFamiliesFollowStoresRetrievesAndL1) {
  metrics::Registry registry;
  svc_->RegisterMetrics(registry);
  auto value = [&](const char* name) { return metrics::ValueOf(registry.Collect(), name, -1); };
  EXPECT_EQ(value("kvd_registered_instances"), 0);
  EXPECT_EQ(value("kvd_store_requests_total"), 0);
  FakeWorker w("/kvd_test_wm");
  w.Fill(5);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(70, 1)).ok());
  const int64_t bpc = kChunk / kBlock;
  ASSERT_TRUE(svc_->Store(wire::TransferRequest{Key(0, 512, 0, 512, 1, "m1"), 70, Blocks(0, 2 * bpc), "", 0}).ok());
  ASSERT_TRUE(svc_->Retrieve(wire::TransferRequest{Key(0, 512, 0, 512, 1, "m1"), 70, Blocks(0, 2 * bpc), "", 0}).ok());
  const l1::L1Stats l1 = svc_->l1_stats();
  EXPECT_EQ(value("kvd_registered_instances"), 1);
  EXPECT_EQ(value("kvd_store_requests_total"), 1);
  EXPECT_EQ(value("kvd_retrieve_requests_total"), 1);
  EXPECT_EQ(value("lmcache_mp_l1_write_chunks_total"), 2);
  EXPECT_EQ(value("lmcache_mp_l1_read_chunks_total"), 2);
  EXPECT_EQ(value("kvd_stored_bytes_total"), static_cast<double>(l1.used_bytes));
  EXPECT_EQ(value("kvd_retrieved_bytes_total"), static_cast<double>(l1.used_bytes));
  EXPECT_EQ(value("kvd_l1_entries"), 2);
  EXPECT_EQ(value("lmcache_mp_l1_memory_usage_bytes"), static_cast<double>(l1.used_bytes));
  EXPECT_EQ(value("kvd_active_sessions"), static_cast<double>(svc_->CountsSnapshot().sessions));
  EXPECT_EQ(value("kvd_chunk_key_memo_misses_total"), static_cast<double>(svc_->CountsSnapshot().chunk_key_memo_misses));
  const std::vector<metrics::FamilySnapshot> families = registry.Collect();
  EXPECT_NE(metrics::FindSeries(families, "kvd_engine_driven_pending_operations", {"store"}), nullptr);
  // A LOOKUP's result is held until QUERY_PREFETCH_STATUS takes it.
  EXPECT_EQ(value("kvd_lookup_results"), 0);
  ASSERT_TRUE(svc_->Lookup({Key(std::nullopt, 512, 0, 512, 1, "m1"), 1}).ok());
  EXPECT_EQ(value("kvd_lookup_results"), 1);
  EXPECT_EQ(svc_->QueryPrefetchStatus("m1"), std::optional<int64_t>(2));
  EXPECT_EQ(value("kvd_lookup_results"), 0);
  EXPECT_EQ(value("kvd_lookup_results_evicted_total"), 0);
  // /metrics/reset rebases the counters, not the gauges.
  registry.ResetCounters();
  EXPECT_EQ(value("kvd_stored_bytes_total"), 0);
  EXPECT_EQ(value("lmcache_mp_l1_write_chunks_total"), 0);
  EXPECT_EQ(value("kvd_l1_entries"), 2);
  svc_.reset();  // unregisters its families before the registry goes
  EXPECT_FALSE(registry.Has("kvd_l1_entries"));
  EXPECT_FALSE(registry.Has("kvd_store_requests_total"));
}

}  // namespace
}  // namespace kvd::server
