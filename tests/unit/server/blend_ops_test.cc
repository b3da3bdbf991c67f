// BlendOps (--engine-type blend) through KvService on real POSIX shared memory: a fake
// worker's bf16 KV tensors and a float32 cos/sin cache live in segments this test creates,
// as the lmcache client's CpuShmTensorWrapper makes them.
#include "server/blend_ops.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <thread>

#include "blend/rope.h"
#include "server/handlers.h"
#include "server/kv_service.h"
#include "transfer/copy_engine.h"
#include "transfer/shm_mapping.h"

namespace kvd::server {
namespace {

constexpr int64_t kChunk = 256;
constexpr int64_t kBlock = 16;
constexpr int64_t kBlocks = 64;
constexpr int64_t kHeads = 2, kHead = 8;  // a row: 16 bf16 elements
constexpr int64_t kLayers = 2;
constexpr int64_t kRowElems = kHeads * kHead;
constexpr int64_t kPlane = kBlocks * kBlock * kRowElems;
constexpr int64_t kLayerElems = 2 * kPlane;
constexpr uint64_t kLayerBytes = kLayerElems * 2;
constexpr int64_t kMaxPos = 2048;

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

class Shm {
 public:
  Shm(std::string name, uint64_t bytes) : name_(std::move(name) + "_" + std::to_string(getpid())), bytes_(bytes) {
    shm_unlink(name_.c_str());
    int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Shm() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string name_;
  uint64_t bytes_;
  uint8_t* data_ = nullptr;
};

// kLayers tensors [2, NB, BS, NH, HS] bf16 in one segment.
class FakeWorker {
 public:
  explicit FakeWorker(std::string name) : shm_(std::move(name), kLayerBytes * kLayers) {}
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
      t.stride = {kPlane, kBlock * kRowElems, kRowElems, kHead, 1};
      t.storage_offset = l * kLayerElems;
      t.shm_name = shm_.name();
      t.nbytes = shm_.bytes();
      t.device_uuid = "cpu";
      r.tensors.push_back(t);
    }
    return r;
  }
  // Token row of (layer, kv) at request position `pos` through block table `first_block`...
  uint8_t* Row(int64_t layer, int64_t kv, int64_t block, int64_t slot) const {
    return shm_.data() + layer * kLayerBytes + (kv * kPlane + (block * kBlock + slot) * kRowElems) * 2;
  }
  static constexpr size_t kRowBytes = kRowElems * 2;
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    auto* p = reinterpret_cast<uint16_t*>(shm_.data());
    for (uint64_t i = 0; i < shm_.bytes() / 2; ++i) p[i] = ToBf16(d(rng));
  }
  void ZeroBlocks(int64_t first, int64_t count) {
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t kv = 0; kv < 2; ++kv) std::memset(Row(l, kv, first, 0), 0, count * kBlock * kRowBytes);
  }
  bool BlocksAreZero(int64_t first, int64_t count) const {
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t kv = 0; kv < 2; ++kv) {
        const uint8_t* p = Row(l, kv, first, 0);
        if (std::any_of(p, p + count * kBlock * kRowBytes, [](uint8_t b) { return b != 0; })) return false;
      }
    return true;
  }

 private:
  Shm shm_;
};

// vLLM's cos/sin cache [kMaxPos, kHead] float32: kHead/2 cosines then kHead/2 sines.
class FakeRope {
 public:
  FakeRope() : shm_("/kvd_test_rope", kMaxPos * kHead * 4) {
    auto* f = reinterpret_cast<float*>(shm_.data());
    for (int64_t p = 0; p < kMaxPos; ++p) {
      for (int64_t i = 0; i < kHead / 2; ++i) {
        const double inv = std::pow(10000.0, -2.0 * static_cast<double>(i) / kHead);
        f[p * kHead + i] = static_cast<float>(std::cos(p * inv));
        f[p * kHead + kHead / 2 + i] = static_cast<float>(std::sin(p * inv));
      }
    }
  }
  wire::TensorDescriptor Descriptor() const {
    wire::TensorDescriptor t;
    t.dtype = "float32";
    t.shape = {kMaxPos, kHead};
    t.stride = {kHead, 1};
    t.shm_name = shm_.name();
    t.nbytes = shm_.bytes();
    t.device_uuid = "cpu";
    return t;
  }
  blend::RopeTable Table() const {
    const int64_t shape[] = {kMaxPos, kHead};
    return std::move(blend::RopeTable::FromCosSinCache({shm_.data(), shm_.bytes()}, "float32", shape)).value();
  }

 private:
  Shm shm_;
};

// Tokens of a 256-token segment named by `seed`.
std::vector<int64_t> Segment(int64_t seed) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < kChunk; ++i) t.push_back((i * 7919 + seed * 104729) % 32000);
  return t;
}

wire::CacheKey Key(std::optional<int64_t> worker, std::vector<std::vector<int64_t>> segs,
                   const std::string& rid, int64_t world_size = 1) {
  wire::CacheKey k;
  k.model_name = "llama";
  k.world_size = world_size;
  k.worker_id = worker;
  for (const auto& s : segs)
    for (int64_t v : s) k.token_ids.push_back(v);
  k.start = 0;
  k.end = static_cast<int64_t>(k.token_ids.size());
  k.request_id = rid;
  k.num_kv_readers = 1;
  return k;
}

std::vector<std::vector<int64_t>> Blocks(int64_t first, int64_t count) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(first + i);
  return {ids};
}

// Asks `b` until the lookup answers (nil: still loading); `nils` counts the nil replies.
wire::CbUnifiedLookupResult PollUnifiedLookup(BlendOps& b, const wire::CacheKey& key, int* nils) {
  for (int i = 0; i < 2000; ++i) {
    auto r = b.UnifiedLookup({key, 1});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) break;
    if (r->has_value()) return **r;
    ++*nils;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "the lookup never answered";
  return {};
}

class BlendOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.l1_size_gb = 64.0 / 1024;
    cfg_.eviction_policy = "LRU";
    cfg_.engine_type = "blend";
    cfg_.null_block_id = -1;
    cfg_.shm_name = "kvd_test_blend_pool_" + std::to_string(getpid());
    auto s = KvService::Create(cfg_, &clock_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    svc_ = std::move(s).value();
    ASSERT_NE(svc_->blend(), nullptr);
  }
  BlendOps& blend() { return *svc_->blend(); }
  wire::CbRegisterRopeRequest Rope(int64_t id) const {
    wire::CbRegisterRopeRequest r;
    r.instance_id = id;
    r.cos_sin_caches = {rope_.Descriptor()};
    r.head_size = kHead;
    r.is_neox_style = true;
    return r;
  }
  wire::CbUnifiedLookupResult UnifiedLookup(const wire::CacheKey& key) {
    auto r = blend().UnifiedLookup({key, 1});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r.ok() && r->has_value());
    return r.ok() && r->has_value() ? **r : wire::CbUnifiedLookupResult{};
  }
  // A second service on this fixture's settings as `change` alters them (its own L1 segment,
  // "_<suffix>"), its metrics registered in `registry`, which must outlive it. Null (and a
  // test failure) when it does not start.
  std::unique_ptr<KvService> OtherService(const std::function<void(ServerConfig&)>& change,
                                          const std::string& suffix, metrics::Registry& registry) {
    ServerConfig cfg = cfg_;
    change(cfg);
    cfg.shm_name += "_" + suffix;
    auto created = KvService::Create(cfg, &clock_);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (!created.ok()) return nullptr;
    (*created)->RegisterMetrics(registry);
    return std::move(created).value();
  }
  // Stores sys + doc at [0, 512) from blocks 0..31 of w (instance 100, worker 0).
  void StoreSysDoc() {
    wire::TransferRequest st{Key(0, {Segment(1), Segment(2)}, "store"), 100, Blocks(0, 32), "", 0};
    ASSERT_TRUE(svc_->Store(st).ok());
  }

  ServerConfig cfg_;
  FakeClock clock_;
  FakeRope rope_;
  std::unique_ptr<KvService> svc_;
};

TEST_F(BlendOpsTest, RegisterRopeRefusesAsLmcache) {
  FakeWorker w("/kvd_test_blend_w");
  auto r = Rope(100);
  EXPECT_NE(blend().RegisterRope(r).message().find("has no paged KV cache registered"), std::string::npos);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  r.group_to_cache = {1};
  EXPECT_NE(blend().RegisterRope(r).message().find("contains indices outside [-1, 1)"), std::string::npos);
  r.group_to_cache = {};
  r.group_rot = {wire::RopeWindow{-1, 8}};
  EXPECT_NE(blend().RegisterRope(r).message().find("group_rot[0]"), std::string::npos);
  r.group_rot = {};
  r.kv_quant = "int4";
  EXPECT_NE(blend().RegisterRope(r).message().find("kv_quant='int4'"), std::string::npos);
  r.kv_quant = "";
  auto cuda = Rope(100);
  cuda.cos_sin_caches[0].memory = wire::TensorMemory::kCuda;
  EXPECT_NE(blend().RegisterRope(cuda).message().find("GPU memory"), std::string::npos);
  auto past = Rope(100);
  past.cos_sin_caches[0].storage_offset = 1;  // the view's last element lies past the segment
  EXPECT_NE(blend().RegisterRope(past).message().find("extends past its shared-memory segment"),
            std::string::npos);
  EXPECT_FALSE(blend().has_rope(100));
  ASSERT_TRUE(blend().RegisterRope(r).ok());
  EXPECT_TRUE(blend().has_rope(100));
  EXPECT_TRUE(blend().UnregisterRope(100));
  EXPECT_FALSE(blend().has_rope(100));
}

TEST_F(BlendOpsTest, FingerprintsFromWorkerZeroCommittedChunksRemovedWithL1) {
  FakeWorker w0("/kvd_test_blend_w0"), w1("/kvd_test_blend_w1");
  w0.Fill(1);
  w1.Fill(2);
  ASSERT_TRUE(svc_->RegisterKvCache(w0.Registration(100, 2)).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(w1.Registration(101, 2)).ok());
  const auto tokens = std::vector<std::vector<int64_t>>{Segment(1), Segment(2)};
  ASSERT_TRUE(svc_->Store({Key(1, tokens, "s", 2), 101, Blocks(0, 32), "", 0}).ok());
  EXPECT_EQ(blend().matcher().Stats().live, 0u) << "worker 1's stores register nothing";
  ASSERT_TRUE(svc_->Store({Key(0, tokens, "s", 2), 100, Blocks(0, 32), "", 0}).ok());
  EXPECT_EQ(blend().matcher().Stats().live, 2u) << "both chunks, chunk 0 included";
  // A repeated store commits nothing new: nothing registered again.
  ASSERT_TRUE(svc_->Store({Key(0, tokens, "s", 2), 100, Blocks(0, 32), "", 0}).ok());
  EXPECT_EQ(blend().matcher().Stats().registered, 2u);
  svc_->Clear();
  EXPECT_EQ(blend().matcher().Stats().live, 0u) << "removed with their L1 entries";
}

// Every layer's K rows of `w`'s blocks [dst_block, +16) hold RotateK(old_st + t -> cur_st + t)
// of the rows in [src_block, +16), and V rows are byte-identical. Returns the K rows the
// rotation changed.
size_t ExpectScatteredRotated(const FakeWorker& w, const blend::RopeTable& table, int64_t src_block,
                              int64_t dst_block, int64_t old_st, int64_t cur_st) {
  blend::KRowGeometry g;
  g.elem = blend::KvElem::kBFloat16;
  g.num_heads = kHeads;
  g.head_stride = kHead;
  g.rot_dim = kHead;
  size_t k_diff = 0, v_diff = 0, k_changed = 0;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t t = 0; t < kChunk; ++t) {
      const int64_t sb = src_block + t / kBlock, db = dst_block + t / kBlock, slot = t % kBlock;
      std::vector<uint8_t> ref(w.Row(l, 0, sb, slot), w.Row(l, 0, sb, slot) + FakeWorker::kRowBytes);
      std::vector<uint8_t> orig = ref;
      EXPECT_TRUE(blend::RotateK(table, old_st + t, cur_st + t, g, ref).ok());
      if (ref != orig) ++k_changed;
      if (std::memcmp(ref.data(), w.Row(l, 0, db, slot), FakeWorker::kRowBytes) != 0) ++k_diff;
      if (std::memcmp(w.Row(l, 1, sb, slot), w.Row(l, 1, db, slot), FakeWorker::kRowBytes) != 0) ++v_diff;
    }
  }
  EXPECT_EQ(k_diff, 0u);
  EXPECT_EQ(v_diff, 0u);
  return k_changed;
}

TEST_F(BlendOpsTest, LookupFindsDocumentElsewhereAndRetrieveScattersRotatedK) {
  FakeWorker w("/kvd_test_blend_w");
  w.Fill(7);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  ASSERT_TRUE(blend().RegisterRope(Rope(100)).ok());
  StoreSysDoc();
  // sys + other + doc: the prefix (sys) by the prefix leg, doc at 512 (stored at 256).
  const auto key = Key(std::nullopt, {Segment(1), Segment(3), Segment(2)}, "q");
  auto res = UnifiedLookup(key);
  EXPECT_EQ(res.prefix_coverage_tokens, 256);
  ASSERT_EQ(res.non_prefix_segments.size(), 1u);
  const auto m = res.non_prefix_segments[0];
  EXPECT_EQ(m.old_st, 256);
  EXPECT_EQ(m.old_ed, 512);
  EXPECT_EQ(m.cur_st, 512);
  EXPECT_EQ(m.cur_ed, 768);
  EXPECT_EQ(blend().requests_held(), 1u);
  const uint64_t locks_before = svc_->l1_stats().lookup_locks;  // the prefix's and blend's

  // Retrieve into blocks 16..63 (positions 512..767 land in blocks 48..63).
  w.ZeroBlocks(48, 16);
  wire::CbRetrievePreComputedRequest rr;
  rr.key = Key(0, {Segment(1), Segment(3), Segment(2)}, "q");
  rr.match_results = {m};
  rr.block_ids = Blocks(16, 48);
  rr.instance_id = 100;
  auto ran = blend().RetrievePreComputed(rr);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_TRUE(*ran);
  // V byte-identical; K = RotateK(256 + t -> 512 + t) of the stored row.
  EXPECT_GT(ExpectScatteredRotated(w, rope_.Table(), 16, 48, 256, 512), 0u) << "the rotation moved K";
  // Done for the only worker: state and locks gone, pins dropped. A repeat is a no-op.
  EXPECT_EQ(blend().requests_held(), 0u);
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
  EXPECT_EQ(svc_->l1_stats().lookup_locks, locks_before - 1) << "blend's locks released";
  const uint64_t locks_after = svc_->l1_stats().lookup_locks;
  auto again = blend().RetrievePreComputed(rr);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again) << "a repeated retrieve is a no-op";
  EXPECT_EQ(svc_->l1_stats().lookup_locks, locks_after);
  svc_->EndSession("q");
}

TEST_F(BlendOpsTest, RepeatDeferredStraddleAndUntrustedMatches) {
  FakeWorker w("/kvd_test_blend_w");
  w.Fill(9);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  wire::CbRetrievePreComputedRequest rr;
  rr.key = Key(0, {Segment(4), Segment(5), Segment(2)}, "d");
  rr.instance_id = 100;
  rr.block_ids = Blocks(16, 48);
  // Before the rope registration: an error.
  EXPECT_FALSE(blend().RetrievePreComputed(rr).ok());
  ASSERT_TRUE(blend().RegisterRope(Rope(100)).ok());
  StoreSysDoc();
  auto res = UnifiedLookup(Key(std::nullopt, {Segment(4), Segment(5), Segment(2)}, "d"));
  EXPECT_EQ(res.prefix_coverage_tokens, 0);
  ASSERT_EQ(res.non_prefix_segments.size(), 1u);
  EXPECT_EQ(res.non_prefix_segments[0].cur_st, 512);
  rr.match_results = res.non_prefix_segments;
  // A match the lookup did not find (another position): refused, nothing written.
  auto forged = rr;
  forged.match_results[0].cur_st = 256;
  forged.match_results[0].cur_ed = 512;
  EXPECT_FALSE(*blend().RetrievePreComputed(forged));
  // The same request id with another cache salt: not the lookup's namespace.
  auto salted = rr;
  salted.key.cache_salt = "other-tenant";
  EXPECT_FALSE(*blend().RetrievePreComputed(salted));
  // Beyond the allocation (2 chunks of blocks): deferred, true, nothing written.
  auto deferred = rr;
  deferred.block_ids = Blocks(16, 32);
  EXPECT_TRUE(*blend().RetrievePreComputed(deferred));
  EXPECT_EQ(blend().requests_held(), 1u) << "deferred keeps the locks";
  // Straddling the allocation: false.
  auto straddle = rr;
  straddle.block_ids = Blocks(16, 40);
  EXPECT_FALSE(*blend().RetrievePreComputed(straddle));
  EXPECT_EQ(blend().requests_held(), 0u);
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
}

TEST_F(BlendOpsTest, EndSessionReleasesTheLookupsLocks) {
  FakeWorker w("/kvd_test_blend_w");
  w.Fill(3);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  StoreSysDoc();
  const uint64_t base_locks = svc_->l1_stats().lookup_locks;
  auto res = UnifiedLookup(Key(std::nullopt, {Segment(6), Segment(6), Segment(2)}, "e"));
  ASSERT_EQ(res.non_prefix_segments.size(), 1u);
  EXPECT_GT(svc_->l1_stats().lookup_locks, base_locks);
  EXPECT_EQ(blend().requests_held(), 1u);
  svc_->EndSession("e");
  EXPECT_EQ(blend().requests_held(), 0u);
  EXPECT_EQ(svc_->l1_stats().lookup_locks, base_locks);
}

TEST_F(BlendOpsTest, OverlappingMatchesKeepTheEarliest) {
  FakeWorker w("/kvd_test_blend_w");
  w.Fill(5);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  StoreSysDoc();  // sys = Segment(1), doc = Segment(2), adjacent when stored
  // x + (sys + doc) + the same doc again: sys at 256, doc at 512 and 768; doc is one
  // fingerprint, reported once at its first position >= the prefix.
  auto res = UnifiedLookup(Key(std::nullopt, {Segment(8), Segment(1), Segment(2), Segment(2)}, "o"));
  ASSERT_GE(res.non_prefix_segments.size(), 2u);
  for (size_t i = 1; i < res.non_prefix_segments.size(); ++i) {
    EXPECT_GE(res.non_prefix_segments[i].cur_st, res.non_prefix_segments[i - 1].cur_ed);
  }
  EXPECT_EQ(res.non_prefix_segments[0].cur_st, 256);
  EXPECT_EQ(res.non_prefix_segments[0].old_st, 0);
  svc_->EndSession("o");
}

// Regression (found by tests/e2e/test_blend_vllm.py): the lmcache connector's lookup key ends
// at the prompt's last full chunk (`end`), but its token ids are the whole prompt, and lmcache
// probes all of them. kvd probed only [0, end): a document at an unaligned offset whose window
// runs past `end` was never found.
TEST_F(BlendOpsTest, UnalignedDocumentPastTheKeysEndIsFound) {
  FakeWorker w("/kvd_test_blend_w");
  w.Fill(5);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  StoreSysDoc();  // doc = Segment(2), stored at 256
  // 100 other tokens, the doc at [100, 356), then 37 more: 393 tokens, `end` = 256.
  const std::vector<int64_t> other = Segment(9), more = Segment(7);
  std::vector<int64_t> head(other.begin(), other.begin() + 100);
  std::vector<int64_t> tail(more.begin(), more.begin() + 37);
  auto key = Key(std::nullopt, {head, Segment(2), tail}, "u");
  key.end = 256;
  auto res = UnifiedLookup(key);
  ASSERT_EQ(res.non_prefix_segments.size(), 1u);
  EXPECT_EQ(res.non_prefix_segments[0].cur_st, 100);
  EXPECT_EQ(res.non_prefix_segments[0].cur_ed, 356);
  EXPECT_EQ(res.non_prefix_segments[0].old_st, 256);
  svc_->EndSession("u");
}

// --enable-segmented-prefix (issue 24): a prompt's chunk 1 left L1 while chunks 0 and 2 stay.
// The prefix ends at the gap; chunk 2 (its chained key: the same tokens before it) comes back
// at its own position as a segmented-prefix segment, locked, and its retrieve copies it
// unrotated. Without the flag the lookup's answer has no such segment (before the flag was
// accepted and did nothing).
TEST_F(BlendOpsTest, SegmentedPrefixDeliversTheChunksAfterAGapAtTheirOwnPositions) {
  const auto prompt = std::vector<std::vector<int64_t>>{Segment(1), Segment(2), Segment(3)};
  for (const bool segmented : {false, true}) {
    SCOPED_TRACE(segmented ? "segmented" : "plain");
    ServerConfig cfg = cfg_;
    cfg.enable_segmented_prefix = segmented;
    cfg.shm_name += segmented ? "_seg" : "_plain";
    auto created = KvService::Create(cfg, &clock_);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    KvService& svc = **created;
    BlendOps& b = *svc.blend();
    FakeWorker w("/kvd_test_blend_wseg");
    w.Fill(11);
    ASSERT_TRUE(svc.RegisterKvCache(w.Registration(100, 1)).ok());
    ASSERT_TRUE(b.RegisterRope(Rope(100)).ok());
    // Chunk 0 alone, then chunk 2 alone (a STORE's block ids start at key.start: chunk 2
    // from blocks 32..47): chunk 1 is a gap.
    ASSERT_TRUE(svc.Store({Key(0, {Segment(1)}, "s0"), 100, Blocks(0, 16), "", 0}).ok());
    wire::CacheKey third = Key(0, prompt, "s2");
    third.start = 2 * kChunk;
    ASSERT_TRUE(svc.Store({third, 100, Blocks(32, 16), "", 0}).ok());

    auto r = b.UnifiedLookup({Key(std::nullopt, prompt, "q"), 1});
    ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
    const wire::CbUnifiedLookupResult res = **r;
    EXPECT_EQ(res.prefix_coverage_tokens, kChunk);
    if (!segmented) {
      EXPECT_TRUE(res.segmented_prefix_segments.empty());
      svc.EndSession("q");
      continue;
    }
    ASSERT_EQ(res.segmented_prefix_segments.size(), 1u);
    const wire::CbMatchResult m = res.segmented_prefix_segments[0];
    EXPECT_EQ(m.old_st, 2 * kChunk);
    EXPECT_EQ(m.cur_st, 2 * kChunk);
    EXPECT_EQ(m.old_ed, 3 * kChunk);
    EXPECT_EQ(m.cur_ed, 3 * kChunk);
    EXPECT_EQ(m.hash.size(), 32u);
    // The same chunk is not also reported as a same-position non-prefix match.
    for (const auto& n : res.non_prefix_segments) EXPECT_NE(n.cur_st, 2 * kChunk);
    EXPECT_EQ(b.requests_held(), 1u);

    // Retrieve it into blocks 48..63 (the request's third chunk): a plain copy.
    w.ZeroBlocks(48, 16);
    wire::CbRetrievePreComputedRequest rr;
    rr.key = Key(0, prompt, "q");
    rr.match_results = {m};
    rr.block_ids = {[] {
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < 32; ++i) ids.push_back(i);
      for (int64_t i = 48; i < 64; ++i) ids.push_back(i);
      return ids;
    }()};
    rr.instance_id = 100;
    auto ran = b.RetrievePreComputed(rr);
    ASSERT_TRUE(ran.ok()) << ran.status().ToString();
    EXPECT_TRUE(*ran);
    size_t diff = 0;
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int64_t kv = 0; kv < 2; ++kv) {
        for (int64_t t = 0; t < kChunk; ++t) {
          const int64_t src = 32 + t / kBlock, dst = 48 + t / kBlock, slot = t % kBlock;
          if (std::memcmp(w.Row(l, kv, src, slot), w.Row(l, kv, dst, slot), FakeWorker::kRowBytes) != 0) ++diff;
        }
      }
    }
    EXPECT_EQ(diff, 0u) << "K and V copied as stored";
    EXPECT_EQ(b.requests_held(), 0u);
    svc.EndSession("q");
  }
}

TEST_F(BlendOpsTest, ParityModeLeavesChunkZeroToThePrefix) {
  ServerConfig cfg = cfg_;
  cfg.blend_lmcache_parity = true;
  cfg.shm_name += "_parity";
  auto s = KvService::Create(cfg, &clock_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  FakeWorker w("/kvd_test_blend_wp");
  w.Fill(4);
  ASSERT_TRUE((*s)->RegisterKvCache(w.Registration(100, 1)).ok());
  ASSERT_TRUE((*s)->Store({Key(0, {Segment(1), Segment(2)}, "p"), 100, Blocks(0, 32), "", 0}).ok());
  EXPECT_EQ((*s)->blend()->matcher().Stats().live, 1u) << "lmcache skips chunk 0 of a prompt";
}

TEST_F(BlendOpsTest, EngineDrivenCommitStoreRegistersFingerprints) {
  wire::RegisterEngineDrivenRequest r;
  r.instance_id = 200;
  r.model_name = "llama";
  r.world_size = 1;
  r.block_size = kBlock;
  r.num_layers = kLayers;
  r.hidden_dim_size = kRowElems;
  r.dtype_str = "bfloat16";
  ASSERT_TRUE(svc_->RegisterEngineDriven(r).ok());
  wire::EngineDrivenRequest st{Key(0, {Segment(1), Segment(2)}, "ed"), 200, ""};
  auto slots = svc_->PrepareStore(st);
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  ASSERT_EQ(slots->first.size(), 2u);
  EXPECT_EQ(blend().matcher().Stats().live, 0u) << "nothing before the commit";
  ASSERT_TRUE(svc_->CommitStore(st).ok());
  EXPECT_EQ(blend().matcher().Stats().live, 2u);
}

// The ops are routed only with --engine-type blend; otherwise answered as before (nil).
TEST_F(BlendOpsTest, HandshakeRoutedOnlyForBlend) {
  const wire::OpInfo* op = wire::FindOpById(33);
  ASSERT_NE(op, nullptr);
  const std::string one = wire::EncodeInt(1);
  std::vector<std::string_view> frames{one};
  EXPECT_EQ(HandleRequest(*svc_, *op, frames, "c"), wire::EncodeCbProtocolHandshake(1));
  ServerConfig plain = cfg_;
  plain.engine_type = "default";
  plain.shm_name += "_plain";
  auto s = KvService::Create(plain, &clock_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->blend(), nullptr);
  EXPECT_EQ(HandleRequest(**s, *op, frames, "c"), wire::EncodeNil());
}

TEST_F(BlendOpsTest, ReorderPlanServesTheStoredPromptsOrderFromWorkerZerosStores) {
  metrics::Registry registry;  // outlives the service, which unregisters from it
  auto other = OtherService([](ServerConfig& c) { c.enable_blend_reorder = true; }, "reorder", registry);
  ASSERT_NE(other, nullptr);
  KvService& svc = *other;
  FakeWorker w("/kvd_test_blend_wro");
  w.Fill(3);
  ASSERT_TRUE(svc.RegisterKvCache(w.Registration(100, 1)).ok());
  // Stored: sys + doc (worker 0). Asked: doc + sys + a question: the plan serves sys + doc
  // first (2 whole chunks; the prompt's own prefix has none), the question last.
  ASSERT_TRUE(svc.Store({Key(0, {Segment(1), Segment(2)}, "s"), 100, Blocks(0, 32), "", 0}).ok());
  svc.EndSession("s");
  auto gauge = [&](const char* name) { return metrics::ValueOf(registry.Collect(), name, -1); };
  EXPECT_EQ(gauge("kvd_blend_reorder_stored_prompts"), 1);
  EXPECT_EQ(gauge("kvd_blend_reorder_stored_tokens"), 512);
  wire::CbReorderPlanRequest req;
  req.key = Key(std::nullopt, {Segment(2), Segment(1), Segment(5)}, "q");
  req.budget_ms = 1000;
  const std::vector<uint32_t> plan = svc.blend()->ReorderPlan(req);
  std::vector<uint32_t> want;
  for (const auto& seg : {Segment(1), Segment(2), Segment(5)})
    for (int64_t t : seg) want.push_back(static_cast<uint32_t>(t));
  EXPECT_EQ(plan, want);
  // Keeping the first token in place rules the copy out; another salt has no stored prompt.
  req.keep_prefix = 1;
  EXPECT_TRUE(svc.blend()->ReorderPlan(req).empty());
  req.keep_prefix = 0;
  req.key.cache_salt = "other";
  EXPECT_TRUE(svc.blend()->ReorderPlan(req).empty());
  EXPECT_EQ(gauge("kvd_blend_reorder_requests_total"), 3);
  EXPECT_EQ(gauge("kvd_blend_reorder_plans_total"), 1);
}

// With a tier (fs) behind L1: a fingerprint whose chunk left L1 stays, and the lookup asks
// the tier for the chunk, answers nil while it loads, then reports it like an L1 hit.
class BlendOpsTierTest : public BlendOpsTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvd_blend_tier_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cfg_.l2_adapters = {R"({"type":"fs","base_path":")" + dir_ + "\"" + TierExtra() + "}"};
    BlendOpsTest::SetUp();
    svc_->RegisterMetrics(registry_);
  }
  void TearDown() override {
    svc_.reset();
    std::filesystem::remove_all(dir_);
  }
  wire::CbUnifiedLookupResult LookupPolling(const wire::CacheKey& key, int* nils) {
    return PollUnifiedLookup(blend(), key, nils);
  }
  // More fields of the tier's adapter JSON (a subclass's).
  virtual std::string TierExtra() const { return ""; }
  double Metric(const std::string& name) { return metrics::ValueOf(registry_.Collect(), name, -1); }
  // `w` registered, sys + doc stored and written to the tier, then dropped from L1; with
  // `empty_tier` the tier's objects are deleted too.
  void StoredThenOutOfL1(FakeWorker& w, bool empty_tier) {
    ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
    StoreSysDoc();
    ASSERT_TRUE(svc_->WaitTiersIdle(10));
    svc_->Clear();
    if (!empty_tier) return;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) std::filesystem::remove_all(e.path());
  }

  std::string dir_;
  metrics::Registry registry_;
};

TEST_F(BlendOpsTierTest, NonPrefixMatchLeftL1IsLoadedFromTheTierThenScattered) {
  FakeWorker w("/kvd_test_blend_tw");
  w.Fill(11);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  ASSERT_TRUE(blend().RegisterRope(Rope(100)).ok());
  StoreSysDoc();
  ASSERT_TRUE(svc_->WaitTiersIdle(10));
  svc_->Clear();
  ASSERT_EQ(svc_->l1_stats().entries, 0u);
  EXPECT_EQ(blend().matcher().Stats().live, 2u) << "a tier may hold them: fingerprints stay";

  // other + other2 + doc: no prefix anywhere; doc (stored at 256) matches at 512, in the tier.
  const auto segs = std::vector<std::vector<int64_t>>{Segment(3), Segment(4), Segment(2)};
  int nils = 0;
  auto res = LookupPolling(Key(std::nullopt, segs, "q"), &nils);
  EXPECT_GE(nils, 1) << "answered nil while the tier loaded the chunk";
  EXPECT_EQ(res.prefix_coverage_tokens, 0);
  ASSERT_EQ(res.non_prefix_segments.size(), 1u);
  const auto m = res.non_prefix_segments[0];
  EXPECT_EQ(m.old_st, 256);
  EXPECT_EQ(m.cur_st, 512);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 1);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_loaded_chunks_total"), 1);
  EXPECT_EQ(Metric("lmcache_blend_lookup_requests_total"), 1) << "the polls are one lookup";
  EXPECT_EQ(Metric("lmcache_blend_lookup_non_prefix_hit_tokens_total"), 256);
  EXPECT_EQ(Metric("lmcache_blend_lookup_requested_tokens_total"), 768) << "counted once";

  // The bytes came back from the tier: the retrieve scatters them, re-rotated.
  w.ZeroBlocks(48, 16);
  wire::CbRetrievePreComputedRequest rr;
  rr.key = Key(0, segs, "q");
  rr.match_results = {m};
  rr.block_ids = Blocks(16, 48);
  rr.instance_id = 100;
  auto ran = blend().RetrievePreComputed(rr);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_TRUE(*ran);
  EXPECT_GT(ExpectScatteredRotated(w, rope_.Table(), 16, 48, 256, 512), 0u);
  svc_->EndSession("q");
}

TEST_F(BlendOpsTierTest, AChunkNoTierHoldsIsAskedForOnceThenAMiss) {
  FakeWorker w("/kvd_test_blend_tw2");
  w.Fill(12);
  ASSERT_NO_FATAL_FAILURE(StoredThenOutOfL1(w, /*empty_tier=*/true));
  const auto segs = std::vector<std::vector<int64_t>>{Segment(3), Segment(4), Segment(2)};
  int nils = 0;
  auto res = LookupPolling(Key(std::nullopt, segs, "q"), &nils);
  EXPECT_GE(nils, 1);
  EXPECT_EQ(res.non_prefix_segments.size(), 0u);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 1);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_loaded_chunks_total"), 0);
  EXPECT_EQ(Metric("lmcache_blend_lookup_stale_chunks_total"), 1);
  EXPECT_EQ(blend().requests_held(), 0u);
  svc_->EndSession("q");
}

// Issue 24: with tiers, a fingerprint whose chunk is in neither L1 nor any tier stayed
// registered for ever; every lookup that matched it asked the tiers again and counted a
// miss. It goes once every tier answered "not found" for it.
TEST_F(BlendOpsTierTest, Issue24FingerprintOfAChunkInNoTierIsRemovedOnTheTiersAnswer) {
  FakeWorker w("/kvd_test_blend_tw3");
  w.Fill(14);
  ASSERT_NO_FATAL_FAILURE(StoredThenOutOfL1(w, /*empty_tier=*/true));
  ASSERT_EQ(blend().matcher().Stats().live, 2u);
  const auto segs = std::vector<std::vector<int64_t>>{Segment(3), Segment(4), Segment(2)};
  int nils = 0;
  auto res = LookupPolling(Key(std::nullopt, segs, "q"), &nils);
  EXPECT_EQ(res.non_prefix_segments.size(), 0u);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 1);
  EXPECT_EQ(blend().matcher().Stats().live, 1u) << "doc's fingerprint went; sys's was not asked for";
  EXPECT_EQ(Metric("lmcache_blend_chunks_evicted_total"), 1);
  // The next lookup matches nothing, so it asks the tiers for no non-prefix chunk.
  res = LookupPolling(Key(std::nullopt, segs, "q"), &nils);
  EXPECT_EQ(res.non_prefix_segments.size(), 0u);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 1);
  EXPECT_EQ(Metric("lmcache_blend_lookup_stale_chunks_total"), 1);
  svc_->EndSession("q");
  // Stored again, it is found again.
  StoreSysDoc();
  EXPECT_EQ(blend().matcher().Stats().live, 2u);
  res = LookupPolling(Key(std::nullopt, segs, "q2"), &nils);
  EXPECT_EQ(res.non_prefix_segments.size(), 1u);
  svc_->EndSession("q2");
}

// Issue 24: a tier that fails its existence check proves nothing: the fingerprint stays.
TEST_F(BlendOpsTierTest, Issue24FingerprintStaysWhenTheTierFailsToAnswer) {
  FakeWorker w("/kvd_test_blend_tw4");
  w.Fill(15);
  ASSERT_NO_FATAL_FAILURE(StoredThenOutOfL1(w, /*empty_tier=*/false));
  // The tier's directory becomes a file: every stat under it fails with ENOTDIR.
  std::filesystem::remove_all(dir_);
  { std::ofstream(dir_) << "not a directory"; }
  const auto segs = std::vector<std::vector<int64_t>>{Segment(3), Segment(4), Segment(2)};
  int nils = 0;
  auto res = LookupPolling(Key(std::nullopt, segs, "q"), &nils);
  EXPECT_EQ(res.non_prefix_segments.size(), 0u);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 1);
  EXPECT_EQ(blend().matcher().Stats().live, 2u);
  EXPECT_EQ(Metric("lmcache_blend_chunks_evicted_total"), 0);
  svc_->EndSession("q");
  // The next lookup asks the tier again.
  res = LookupPolling(Key(std::nullopt, segs, "q"), &nils);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 2);
  svc_->EndSession("q");
}

TEST_F(BlendOpsTierTest, SegmentedPrefixChunksInTheTierOnlyAreLoadedAndDelivered) {
  metrics::Registry registry;  // outlives the service, which unregisters from it
  auto other = OtherService([](ServerConfig& c) { c.enable_segmented_prefix = true; }, "seg", registry);
  ASSERT_NE(other, nullptr);
  KvService& svc = *other;
  BlendOps& b = *svc.blend();
  FakeWorker w("/kvd_test_blend_tseg");
  w.Fill(13);
  ASSERT_TRUE(svc.RegisterKvCache(w.Registration(100, 1)).ok());
  ASSERT_TRUE(b.RegisterRope(Rope(100)).ok());
  // Chunks 0 and 2 of the prompt stored (chunk 1 never: the gap), written to the tier, then
  // gone from L1.
  const auto prompt = std::vector<std::vector<int64_t>>{Segment(1), Segment(2), Segment(3)};
  ASSERT_TRUE(svc.Store({Key(0, {Segment(1)}, "s0"), 100, Blocks(0, 16), "", 0}).ok());
  wire::CacheKey third = Key(0, prompt, "s2");
  third.start = 2 * kChunk;
  ASSERT_TRUE(svc.Store({third, 100, Blocks(32, 16), "", 0}).ok());
  ASSERT_TRUE(svc.WaitTiersIdle(10));
  svc.Clear();
  ASSERT_EQ(svc.l1_stats().entries, 0u);

  int nils = 0;
  std::optional<wire::CbUnifiedLookupResult> res = PollUnifiedLookup(b, Key(std::nullopt, prompt, "q"), &nils);
  EXPECT_EQ(res->prefix_coverage_tokens, kChunk) << "chunk 0 through the prefix leg's prefetch";
  ASSERT_EQ(res->segmented_prefix_segments.size(), 1u) << "chunk 2 from the tier";
  EXPECT_EQ(res->segmented_prefix_segments[0].cur_st, 2 * kChunk);
  EXPECT_EQ(res->segmented_prefix_segments[0].old_st, 2 * kChunk);
  for (const auto& n : res->non_prefix_segments) EXPECT_NE(n.cur_st, 2 * kChunk);
  EXPECT_EQ(metrics::ValueOf(registry.Collect(), "kvd_blend_lookup_tier_loaded_chunks_total", -1), 1);

  // Delivered unrotated: chunk 2's stored rows (blocks 32..47) land in blocks 48..63.
  w.ZeroBlocks(48, 16);
  wire::CbRetrievePreComputedRequest rr;
  rr.key = Key(0, prompt, "q");
  rr.match_results = res->segmented_prefix_segments;
  rr.block_ids = Blocks(16, 48);
  rr.instance_id = 100;
  auto ran = b.RetrievePreComputed(rr);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_TRUE(*ran);
  EXPECT_EQ(ExpectScatteredRotated(w, rope_.Table(), 32, 48, 512, 512), 0u) << "not rotated";
  svc.EndSession("q");
}

// ---- GPU instances, without a GPU ------------------------------------------------------
// A gated host engine stands in for the CUDA engine (transfer::SetDeviceEngineFactoryForTesting):
// the worker's "GPU" tensors and the "GPU" cos/sin cache are the same shared-memory segments,
// named by "cuda" descriptors. It queues copies and device work and runs them on Run(), as a
// device runs them after the client's event; device work gets host scratch and its launch a
// null stream, so the server's device plan runs through the kernel's host emulator.
class GatedDeviceEngine final : public transfer::CopyEngine {
 public:
  GatedDeviceEngine(const layout::KvLayout& l, transfer::ShmMapping map, size_t tensors)
      : layout_(l), map_(std::move(map)), bases_(tensors, map_.data()), sizes_(tensors, map_.size()) {
    caps_.name = "gated";
    caps_.asynchronous = true;
    caps_.device_memory = true;
    caps_.exports_events = true;
  }
  const transfer::EngineCaps& caps() const override { return caps_; }
  Result<transfer::Submitted> Submit(transfer::CopyPlan plan) override {
    queue_.push_back({std::move(plan), {}, {}, nullptr});
    return Issued();
  }
  std::span<uint8_t* const> device_tensor_bases() const override { return bases_; }
  std::span<const uint64_t> device_tensor_sizes() const override { return sizes_; }
  Result<transfer::Submitted> SubmitDeviceWork(transfer::DeviceWork work) override {
    if (refuse_next) {
      refuse_next = false;
      return Status::Internal("engine refused the work");
    }
    last_wait_event = work.wait_event;
    auto scratch = std::make_shared<std::vector<uint8_t>>(work.scratch_bytes);
    auto steps = work.prepare(scratch->data());
    if (!steps.ok()) return steps.status();
    Pending p;
    p.work_done = std::move(work.on_complete);
    p.steps = std::move(steps).value();
    p.scratch = std::move(scratch);
    queue_.push_back(std::move(p));
    auto out = Issued();
    if (out.ok() && cut_short_next) {
      cut_short_next = false;
      out->status = Status::Internal("enqueue failed half-way");
      queue_.back().fail = true;
    }
    return out;
  }
  Result<std::vector<uint8_t>> ReadDeviceTensor(const layout::TensorDescriptor& d, uint64_t offset,
                                                uint64_t length) override {
    ++reads;
    auto m = transfer::ShmMapping::Open(d.shm_name, d.cuda_storage_size);
    if (!m.ok()) return m.status();
    if (offset > m->size() || length > m->size() - offset) return Status::InvalidArgument("past the storage");
    return std::vector<uint8_t>(m->data() + offset, m->data() + offset + length);
  }
  Result<bool> Poll(transfer::Ticket t) override { return t <= done_; }
  Status Wait(transfer::Ticket, std::chrono::milliseconds) override { return Status::Ok(); }
  std::string Describe() const override { return "gated host engine"; }
  void Cancel() override {}

  // Runs everything queued, in order (a failed entry writes nothing and reports failure).
  void Run() {
    while (!queue_.empty()) {
      Pending p = std::move(queue_.front());
      queue_.pop_front();
      Status st;
      if (p.steps.launch) {  // device work
        if (!p.fail) {
          for (const auto& u : p.steps.uploads) std::memcpy(p.scratch->data() + u.scratch_offset, u.host, u.bytes);
          st = p.steps.launch(nullptr, reinterpret_cast<uint64_t>(p.steps.params.data()));
        } else {
          st = Status::Internal("device work failed");
        }
        ++done_;
        if (p.work_done) p.work_done(st);
        continue;
      }
      if (p.plan.direction == transfer::CopyDirection::kGather) {
        transfer::GatherChunks(layout_, bases_, p.plan.block_ids, p.plan.tasks, 1);
      } else {
        transfer::ScatterChunks(layout_, bases_, p.plan.block_ids, p.plan.tasks, 1);
      }
      ++done_;
      if (p.plan.on_complete) p.plan.on_complete(Status::Ok());
    }
  }
  size_t queued() const { return queue_.size(); }

  bool refuse_next = false;
  bool cut_short_next = false;
  std::string last_wait_event;
  int reads = 0;

 private:
  struct Pending {
    transfer::CopyPlan plan;
    transfer::DeviceSteps steps;
    std::function<void(const Status&)> work_done;
    std::shared_ptr<std::vector<uint8_t>> scratch;
    bool fail = false;
  };
  Result<transfer::Submitted> Issued() {
    transfer::Submitted s;
    s.ticket = ++issued_;
    s.event_handle = "fake-event-" + std::to_string(s.ticket);
    return s;
  }
  layout::KvLayout layout_;
  transfer::ShmMapping map_;
  std::vector<uint8_t*> bases_;
  std::vector<uint64_t> sizes_;
  transfer::EngineCaps caps_;
  std::deque<Pending> queue_;
  transfer::Ticket issued_ = 0, done_ = 0;
};

class BlendDeviceTest : public BlendOpsTest {
 protected:
  void SetUp() override {
    transfer::SetDeviceEngineFactoryForTesting(
        [this](const std::vector<wire::TensorDescriptor>& tensors, const layout::KvLayout& l,
               const transfer::HostPool&, int64_t) -> Result<std::unique_ptr<transfer::CopyEngine>> {
          auto m = transfer::ShmMapping::Open(tensors[0].shm_name, tensors[0].nbytes);
          if (!m.ok()) return m.status();
          auto e = std::make_unique<GatedDeviceEngine>(l, std::move(m).value(), tensors.size());
          engine_ = e.get();
          return std::unique_ptr<transfer::CopyEngine>(std::move(e));
        });
    BlendOpsTest::SetUp();
  }
  void TearDown() override {
    svc_.reset();
    transfer::SetDeviceEngineFactoryForTesting(nullptr);
  }
  // The worker's tensors as a GPU worker names them (CUDA IPC descriptors).
  static wire::RegisterKvCacheRequest OnGpu(wire::RegisterKvCacheRequest r) {
    for (auto& t : r.tensors) {
      t.memory = wire::TensorMemory::kCuda;
      t.cuda_storage_size = t.nbytes;
      t.device_uuid = kGpu;
    }
    return r;
  }
  wire::CbRegisterRopeRequest GpuRope(int64_t id) const {
    auto r = Rope(id);
    auto& d = r.cos_sin_caches[0];
    d.memory = wire::TensorMemory::kCuda;
    d.cuda_storage_size = d.nbytes;
    d.device_uuid = kGpu;
    return r;
  }
  // Registers w on the "GPU" with its rope, stores sys + doc and looks up sys + other + doc:
  // the retrieve request of doc's match at 512 into blocks 16..63.
  wire::CbRetrievePreComputedRequest StoreAndLookUp(FakeWorker& w, const std::string& rid) {
    EXPECT_TRUE(svc_->RegisterKvCache(OnGpu(w.Registration(100, 1))).ok());
    EXPECT_NE(engine_, nullptr);
    Status rope = blend().RegisterRope(GpuRope(100));
    EXPECT_TRUE(rope.ok()) << rope.ToString();
    EXPECT_EQ(engine_->reads, 1) << "the table was read from the engine's device memory";
    std::string handle;
    wire::TransferRequest st{Key(0, {Segment(1), Segment(2)}, "store"), 100, Blocks(0, 32), "", 0};
    EXPECT_TRUE(svc_->Store(st, &handle).ok());
    engine_->Run();  // the gather completes: the chunks are committed and fingerprinted
    auto res = UnifiedLookup(Key(std::nullopt, {Segment(1), Segment(3), Segment(2)}, rid));
    EXPECT_EQ(res.non_prefix_segments.size(), 1u);
    wire::CbRetrievePreComputedRequest rr;
    rr.key = Key(0, {Segment(1), Segment(3), Segment(2)}, rid);
    rr.match_results = res.non_prefix_segments;
    rr.block_ids = Blocks(16, 48);
    rr.instance_id = 100;
    rr.event_handle = "client-event-" + rid;
    return rr;
  }
  static constexpr const char* kGpu = "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
  GatedDeviceEngine* engine_ = nullptr;
};

TEST_F(BlendDeviceTest, GpuInstanceScattersRotatedKOnItsEngineAfterTheClientsEvent) {
  FakeWorker w("/kvd_test_blend_gw");
  w.Fill(11);
  auto rr = StoreAndLookUp(w, "g");
  w.ZeroBlocks(48, 16);
  const auto before = std::vector<uint8_t>(w.Row(0, 0, 48, 0), w.Row(0, 0, 48, 0) + 16 * FakeWorker::kRowBytes);
  std::string handle;
  auto ran = blend().RetrievePreComputed(rr, &handle);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_TRUE(*ran);
  EXPECT_EQ(handle, "fake-event-2") << "the reply carries the engine's event";
  EXPECT_EQ(engine_->last_wait_event, "client-event-g") << "the work waits for the client's event";
  // Enqueued, not run: nothing written yet, the object pinned, the worker's locks released.
  EXPECT_EQ(std::vector<uint8_t>(w.Row(0, 0, 48, 0), w.Row(0, 0, 48, 0) + 16 * FakeWorker::kRowBytes), before);
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 1u);
  EXPECT_EQ(blend().requests_held(), 0u);
  engine_->Run();
  // The device plan's bytes: V as stored, K turned from 256 + t to 512 + t.
  EXPECT_GT(ExpectScatteredRotated(w, rope_.Table(), 16, 48, 256, 512), 0u);
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u) << "unpinned by the completion";
  svc_->EndSession("g");
}

TEST_F(BlendDeviceTest, RefusedOrCutShortDeviceScatterAnswersFalseAndUnpins) {
  FakeWorker w("/kvd_test_blend_gw");
  w.Fill(12);
  auto rr = StoreAndLookUp(w, "r");
  w.ZeroBlocks(48, 16);
  engine_->refuse_next = true;
  std::string handle = "stale";
  auto ran = blend().RetrievePreComputed(rr, &handle);
  ASSERT_TRUE(ran.ok());
  EXPECT_FALSE(*ran);
  EXPECT_EQ(handle, "") << "nothing enqueued: no event";
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
  EXPECT_EQ(engine_->queued(), 0u);
  // A second lookup, and work cut short after part of it was enqueued: false with the event
  // (the client must wait for it), the pins held until the engine reports back.
  auto again = UnifiedLookup(Key(std::nullopt, {Segment(1), Segment(3), Segment(2)}, "r2"));
  ASSERT_EQ(again.non_prefix_segments.size(), 1u);
  rr.key.request_id = "r2";
  rr.match_results = again.non_prefix_segments;
  engine_->cut_short_next = true;
  ran = blend().RetrievePreComputed(rr, &handle);
  ASSERT_TRUE(ran.ok());
  EXPECT_FALSE(*ran);
  EXPECT_FALSE(handle.empty());
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 1u);
  engine_->Run();
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
  EXPECT_TRUE(w.BlocksAreZero(48, 16)) << "a failed device scatter wrote nothing";
  svc_->EndSession("r");
  svc_->EndSession("r2");
}

TEST_F(BlendDeviceTest, GpuRopeTableOnACpuInstanceOrUnreadableIsRefused) {
  FakeWorker w("/kvd_test_blend_gw");
  ASSERT_TRUE(svc_->RegisterKvCache(OnGpu(w.Registration(100, 1))).ok());
  auto bad = GpuRope(100);
  bad.cos_sin_caches[0].shm_name = "/kvd_test_no_such_table";
  Status st = blend().RegisterRope(bad);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("cos_sin_caches[0]: ", 0), 0u) << st.ToString();
  auto past = GpuRope(100);
  past.cos_sin_caches[0].storage_offset = 1;  // the engine is asked for bytes past the storage
  st = blend().RegisterRope(past);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("cos_sin_caches[0]: ", 0), 0u) << st.ToString();
  EXPECT_FALSE(blend().has_rope(100));
  ASSERT_TRUE(blend().RegisterRope(GpuRope(100)).ok());
  EXPECT_TRUE(blend().has_rope(100));
}

}  // namespace
}  // namespace kvd::server

namespace kvd::server {
namespace {

// Issue 24, synchronous removal with tiers: an fs tier with a capacity is indexed (kvd knows
// what it holds and deletes it itself), so a fingerprint goes as soon as its chunk is in
// neither L1 nor the tier, whichever of the two lets it go last; no lookup is needed.
class BlendOpsIndexedTierTest : public BlendOpsTierTest {
 protected:
  std::string TierExtra() const override { return R"(,"max_capacity_gb":1)"; }
  void SetUp() override {
    BlendOpsTierTest::SetUp();
    for (int i = 0; i < 2000 && !svc_->tiers()->stats().tiers[0].scanned; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(svc_->tiers()->stats().tiers[0].scanned);
  }
  // Deletes every object of the tier as the operator's DELETE /cache/objects does; returns
  // how many there were.
  size_t DeleteEveryTierObject() {
    std::promise<Result<std::vector<l2::ScannedObject>>> listed;
    svc_->tiers()->ListObjects(0, [&](Result<std::vector<l2::ScannedObject>> r) { listed.set_value(std::move(r)); });
    auto objects = listed.get_future().get();
    EXPECT_TRUE(objects.ok());
    if (!objects.ok()) return 0;
    std::vector<l2::ObjectKey> keys;
    for (const auto& o : *objects) keys.push_back(o.key);
    std::promise<std::vector<l2::ItemResult>> deleted;
    svc_->tiers()->DeleteObjects(0, keys, [&](std::vector<l2::ItemResult> r) { deleted.set_value(std::move(r)); });
    for (const auto& r : deleted.get_future().get()) EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    return keys.size();
  }
};

TEST_F(BlendOpsIndexedTierTest, Issue24TheTiersDeleteOfAChunkL1LacksRemovesItsFingerprintAtOnce) {
  FakeWorker w("/kvd_test_blend_itw1");
  w.Fill(16);
  ASSERT_NO_FATAL_FAILURE(StoredThenOutOfL1(w, /*empty_tier=*/false));
  EXPECT_EQ(blend().matcher().Stats().live, 2u) << "the tier holds both chunks";
  EXPECT_EQ(DeleteEveryTierObject(), 2u);
  EXPECT_EQ(blend().matcher().Stats().live, 0u);
  EXPECT_EQ(Metric("lmcache_blend_chunks_evicted_total"), 2);
  EXPECT_EQ(Metric("kvd_blend_lookup_tier_load_chunks_total"), 0) << "no lookup asked the tier";
}

TEST_F(BlendOpsIndexedTierTest, Issue24AnL1EvictionOfAChunkTheTierDroppedRemovesItsFingerprintAtOnce) {
  FakeWorker w("/kvd_test_blend_itw2");
  w.Fill(17);
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(100, 1)).ok());
  StoreSysDoc();
  ASSERT_TRUE(svc_->WaitTiersIdle(10));
  EXPECT_EQ(DeleteEveryTierObject(), 2u);
  EXPECT_EQ(blend().matcher().Stats().live, 2u) << "L1 still holds both chunks";
  svc_->Clear();
  EXPECT_EQ(blend().matcher().Stats().live, 0u);
  EXPECT_EQ(Metric("lmcache_blend_chunks_evicted_total"), 2);
  // Stored again, both are matchable again.
  StoreSysDoc();
  EXPECT_EQ(blend().matcher().Stats().live, 2u);
}

}  // namespace
}  // namespace kvd::server
