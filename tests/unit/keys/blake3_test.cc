// Tests for the BLAKE3 implementation: official test vectors (all modes, extended
// output), agreement between the portable, SSE4.1 and AVX2 backends, incremental
// hashing, and agreement with Debian's b3sum on random files.
//
// Single-threaded. Tests that force an implementation restore automatic selection
// when they finish; the b3sum test writes (and removes) one temp file in /tmp.
#include "keys/blake3.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "keys/blake3_internal.h"

namespace kvd::keys {

// Lets GoogleTest print implementation parameters by name.
void PrintTo(Blake3Impl impl, std::ostream* os) { *os << Blake3ImplName(impl); }

namespace {

// All implementations this CPU can run.
std::vector<Blake3Impl> SupportedImpls() {
  std::vector<Blake3Impl> impls;
  for (Blake3Impl impl : {Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2}) {
    if (Blake3ImplSupported(impl)) impls.push_back(impl);
  }
  return impls;
}

// Forces an implementation for the lifetime of the guard.
class ImplGuard {
 public:
  explicit ImplGuard(Blake3Impl impl) { EXPECT_TRUE(SetBlake3ImplForTesting(impl)); }
  ~ImplGuard() { SetBlake3ImplForTesting(Blake3Impl::kAuto); }
  ImplGuard(const ImplGuard&) = delete;
  ImplGuard& operator=(const ImplGuard&) = delete;
};

std::vector<uint8_t> PatternInput(size_t len) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(i % 251);
  return v;
}

std::vector<uint8_t> RandomBytes(size_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(len);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::string HashHex(Blake3Hasher hasher, const std::vector<uint8_t>& input, size_t out_len) {
  hasher.Update(input.data(), input.size());
  std::vector<uint8_t> out(out_len);
  hasher.Finalize(out.data(), out.size());
  return HexEncode(out.data(), out.size());
}

// ---- Test vector file --------------------------------------------------------

struct VectorCase {
  size_t input_len = 0;
  std::string hash;
  std::string keyed_hash;
  std::string derive_key;
};

struct VectorFile {
  std::string key;
  std::string context;
  std::vector<VectorCase> cases;
};

// Value of the string field `name` at or after `pos` (advances pos past it).
std::string StringField(const std::string& text, const std::string& name, size_t* pos) {
  size_t k = text.find("\"" + name + "\"", *pos);
  if (k == std::string::npos) return {};
  size_t open = text.find('"', text.find(':', k) + 1);
  size_t close = text.find('"', open + 1);
  *pos = close + 1;
  return text.substr(open + 1, close - open - 1);
}

// A minimal reader for the fixed layout of test_vectors.json (flat string and
// integer fields only; no escapes occur in it).
VectorFile LoadVectors() {
  VectorFile f;
  std::ifstream in(std::string(KVD_SOURCE_DIR) + "/tests/data/blake3/test_vectors.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  size_t pos = text.find("\"key\"");
  if (pos == std::string::npos) return f;
  f.key = StringField(text, "key", &pos);
  f.context = StringField(text, "context_string", &pos);
  while (true) {
    size_t k = text.find("\"input_len\"", pos);
    if (k == std::string::npos) break;
    VectorCase c;
    c.input_len = std::stoul(text.substr(text.find(':', k) + 1));
    pos = k + 1;
    c.hash = StringField(text, "hash", &pos);
    c.keyed_hash = StringField(text, "keyed_hash", &pos);
    c.derive_key = StringField(text, "derive_key", &pos);
    f.cases.push_back(std::move(c));
  }
  return f;
}

TEST(Blake3VectorsTest, FileHasExpectedCases) {
  VectorFile f = LoadVectors();
  ASSERT_EQ(f.key.size(), kBlake3KeyLen);
  ASSERT_FALSE(f.context.empty());
  std::vector<size_t> lens;
  for (const auto& c : f.cases) lens.push_back(c.input_len);
  for (size_t want : {0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 3072, 3073, 4096, 4097, 5120, 5121,
                      6144, 6145, 7168, 7169, 8192, 8193, 16384, 31744, 102400}) {
    EXPECT_NE(std::find(lens.begin(), lens.end(), want), lens.end()) << "missing input_len " << want;
  }
}

class Blake3ImplTest : public ::testing::TestWithParam<Blake3Impl> {
 protected:
  void SetUp() override {
    if (!Blake3ImplSupported(GetParam())) GTEST_SKIP() << "CPU lacks " << Blake3ImplName(GetParam());
    guard_ = std::make_unique<ImplGuard>(GetParam());
  }
  void TearDown() override { guard_.reset(); }
  std::unique_ptr<ImplGuard> guard_;
};

TEST_P(Blake3ImplTest, OfficialVectorsAllModes) {
  VectorFile f = LoadVectors();
  ASSERT_GE(f.cases.size(), 30u);
  for (const auto& c : f.cases) {
    SCOPED_TRACE("input_len=" + std::to_string(c.input_len));
    const std::vector<uint8_t> input = PatternInput(c.input_len);
    const size_t xof_len = c.hash.size() / 2;

    // Default mode, extended output and 32-byte prefix.
    EXPECT_EQ(HashHex(Blake3Hasher(), input, xof_len), c.hash);
    EXPECT_EQ(HexEncode(Blake3(input.data(), input.size())), c.hash.substr(0, 64));
    // Short outputs are prefixes of the extended output.
    EXPECT_EQ(HashHex(Blake3Hasher(), input, 7), c.hash.substr(0, 14));
    EXPECT_EQ(HashHex(Blake3Hasher(), input, 65), c.hash.substr(0, 130));

    EXPECT_EQ(HashHex(Blake3Hasher::Keyed(reinterpret_cast<const uint8_t*>(f.key.data())), input, xof_len),
              c.keyed_hash);
    EXPECT_EQ(HashHex(Blake3Hasher::DeriveKey(f.context), input, xof_len), c.derive_key);
  }
}

TEST_P(Blake3ImplTest, OfficialVectorsIncremental) {
  VectorFile f = LoadVectors();
  for (const auto& c : f.cases) {
    const std::vector<uint8_t> input = PatternInput(c.input_len);
    for (size_t piece : {1, 3, 64, 1000, 1024, 1025, 4099}) {
      SCOPED_TRACE("input_len=" + std::to_string(c.input_len) + " piece=" + std::to_string(piece));
      Blake3Hasher h;
      for (size_t off = 0; off < input.size(); off += piece) {
        h.Update(input.data() + off, std::min(piece, input.size() - off));
      }
      EXPECT_EQ(HexEncode(h.Finalize()), c.hash.substr(0, 64));
    }
  }
}

TEST_P(Blake3ImplTest, IncrementalOddPiecesMatchOneShot) {
  std::mt19937_64 rng(42);
  for (size_t len : {0, 1, 1023, 1024, 1025, 65 * 1024, 64 * 1024 + 1, 300 * 1024 + 17, 1 << 20}) {
    const std::vector<uint8_t> input = RandomBytes(len, len + 1);
    const Hash32 one_shot = Blake3(input.data(), input.size());
    for (size_t piece : {1, 7, 63, 65, 1023, 1025, 4097, 65537}) {
      if (len > 70000 && piece < 63) continue;  // keep the test quick
      Blake3Hasher h;
      for (size_t off = 0; off < input.size(); off += piece) {
        h.Update(input.data() + off, std::min(piece, input.size() - off));
      }
      EXPECT_EQ(h.Finalize(), one_shot) << "len=" << len << " piece=" << piece;
    }
    // Random piece sizes, including empty updates.
    Blake3Hasher h;
    size_t off = 0;
    while (off < input.size()) {
      size_t piece = std::min<size_t>(rng() % 5000, input.size() - off);
      h.Update(input.data() + off, piece);
      off += piece;
    }
    EXPECT_EQ(h.Finalize(), one_shot) << "len=" << len << " random pieces";
  }
}

// ---- Cross-implementation agreement ----------------------------------------

TEST(Blake3CrossImplTest, AllImplsAgreeOnRandomInputs) {
  const std::vector<Blake3Impl> impls = SupportedImpls();
  std::printf("BLAKE3 implementations on this CPU:");
  for (Blake3Impl impl : impls) std::printf(" %s", Blake3ImplName(impl));
  std::printf(" (auto: %s)\n", Blake3ImplName(Blake3ActiveImpl()));
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 40; ++iter) {
    size_t len = iter < 20 ? rng() % 20000 : rng() % (600 * 1024);
    const std::vector<uint8_t> input = RandomBytes(len, iter);
    std::vector<std::string> outs;
    for (Blake3Impl impl : impls) {
      ImplGuard guard(impl);
      outs.push_back(HashHex(Blake3Hasher(), input, 100));
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i], outs[0]) << "len=" << len << " impl " << Blake3ImplName(impls[i]);
    }
  }
}

TEST(Blake3CrossImplTest, HashManyAgreesWithPortable) {
  using namespace internal;
  const std::vector<uint8_t> data = RandomBytes(20 * kChunkLen, 99);
  uint32_t key[8];
  for (int i = 0; i < 8; ++i) key[i] = kIv[i] ^ (0x01010101u * static_cast<uint32_t>(i));
  struct Variant {
    const char* name;
    Blake3Impl impl;
    HashManyFn fn;
  };
  const Variant variants[] = {{"sse4.1", Blake3Impl::kSse41, HashManySse41},
                              {"avx2", Blake3Impl::kAvx2, HashManyAvx2}};
  // Counters that straddle the 32-bit boundary exercise the high counter word.
  for (uint64_t counter : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 3, uint64_t{0x123456789ab}}) {
    for (size_t n = 0; n <= 19; ++n) {
      for (size_t blocks : {1, 2, 15, 16}) {
        for (bool inc : {false, true}) {
          std::vector<uint8_t> want(32 * n + 1, 0xEE);
          HashManyPortable(data.data(), kChunkLen, n, blocks, key, counter, inc, kKeyedHash, kChunkStart,
                           kChunkEnd, want.data());
          for (const Variant& v : variants) {
            if (!Blake3ImplSupported(v.impl)) continue;
            std::vector<uint8_t> got(32 * n + 1, 0xEE);
            v.fn(data.data(), kChunkLen, n, blocks, key, counter, inc, kKeyedHash, kChunkStart, kChunkEnd,
                 got.data());
            EXPECT_EQ(got, want) << v.name << " n=" << n << " blocks=" << blocks << " counter=" << counter
                                 << " inc=" << inc;
          }
        }
      }
    }
  }
  // Parent-style inputs: 64-byte stride, one block.
  for (size_t n = 1; n <= 33; ++n) {
    std::vector<uint8_t> want(32 * n);
    HashManyPortable(data.data(), 64, n, 1, kIv, 0, false, kParent, 0, 0, want.data());
    for (const Variant& v : variants) {
      if (!Blake3ImplSupported(v.impl)) continue;
      std::vector<uint8_t> got(32 * n);
      v.fn(data.data(), 64, n, 1, kIv, 0, false, kParent, 0, 0, got.data());
      EXPECT_EQ(got, want) << v.name << " parents n=" << n;
    }
  }
}

TEST(Blake3CrossImplTest, SingleCompressAgreesWithPortable) {
  using namespace internal;
  if (!Blake3ImplSupported(Blake3Impl::kSse41)) GTEST_SKIP() << "no SSE4.1";
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<uint8_t> block = RandomBytes(kBlockLen, 1000 + iter);
    uint32_t cv[8];
    for (auto& w : cv) w = static_cast<uint32_t>(rng());
    const uint64_t counter = rng();
    const uint8_t len = static_cast<uint8_t>(rng() % 65);
    const uint8_t flags = static_cast<uint8_t>(rng() & 0x7F);
    uint32_t a[8], b[8];
    std::memcpy(a, cv, sizeof(cv));
    std::memcpy(b, cv, sizeof(cv));
    CompressInPlacePortable(a, block.data(), len, counter, flags);
    CompressInPlaceSse41(b, block.data(), len, counter, flags);
    EXPECT_EQ(0, std::memcmp(a, b, sizeof(a)));
    uint8_t xa[64], xb[64];
    CompressXofPortable(cv, block.data(), len, counter, flags, xa);
    CompressXofSse41(cv, block.data(), len, counter, flags, xb);
    EXPECT_EQ(0, std::memcmp(xa, xb, sizeof(xa)));
  }
}

// ---- Independent tree reference ---------------------------------------------

// Straightforward recursive BLAKE3 (default mode) following the spec's tree
// definition, on top of the portable compression function; checks the
// incremental hasher's stack and lazy-merge logic.
struct RefNode {
  uint32_t cv[8];
  uint8_t block[64];
  uint8_t block_len;
  uint64_t counter;
  uint8_t flags;
};

RefNode RefChunk(const uint8_t* p, size_t len, uint64_t chunk_index) {
  using namespace internal;
  RefNode n;
  std::memcpy(n.cv, kIv, sizeof(n.cv));
  size_t blocks = len == 0 ? 1 : (len + 63) / 64;
  for (size_t b = 0; b + 1 < blocks; ++b) {
    CompressInPlacePortable(n.cv, p + 64 * b, 64, chunk_index, b == 0 ? kChunkStart : 0);
  }
  std::memset(n.block, 0, 64);
  n.block_len = static_cast<uint8_t>(len - 64 * (blocks - 1));
  if (n.block_len > 0) std::memcpy(n.block, p + 64 * (blocks - 1), n.block_len);  // p may be null
  n.counter = chunk_index;
  n.flags = kChunkEnd | (blocks == 1 ? kChunkStart : 0);
  return n;
}

void RefCv(const RefNode& n, uint8_t out[32]) {
  uint32_t cv[8];
  std::memcpy(cv, n.cv, sizeof(cv));
  internal::CompressInPlacePortable(cv, n.block, n.block_len, n.counter, n.flags);
  for (int i = 0; i < 8; ++i) internal::StoreLe32(out + 4 * i, cv[i]);
}

RefNode RefSubtree(const uint8_t* p, size_t len, uint64_t first_chunk) {
  if (len <= internal::kChunkLen) return RefChunk(p, len, first_chunk);
  size_t left_chunks = 1;
  while ((2 * left_chunks) * internal::kChunkLen < len) left_chunks *= 2;
  const size_t left_len = left_chunks * internal::kChunkLen;
  RefNode n;
  std::memcpy(n.cv, internal::kIv, sizeof(n.cv));
  RefCv(RefSubtree(p, left_len, first_chunk), n.block);
  RefCv(RefSubtree(p + left_len, len - left_len, first_chunk + left_chunks), n.block + 32);
  n.block_len = 64;
  n.counter = 0;
  n.flags = internal::kParent;
  return n;
}

Hash32 RefHash(const std::vector<uint8_t>& input) {
  RefNode root = RefSubtree(input.data(), input.size(), 0);
  uint8_t out[64];
  internal::CompressXofPortable(root.cv, root.block, root.block_len, 0, root.flags | internal::kRoot, out);
  Hash32 h;
  std::memcpy(h.data(), out, 32);
  return h;
}

TEST_P(Blake3ImplTest, MatchesRecursiveReferenceAtChunkBoundaries) {
  const std::vector<uint8_t> all = RandomBytes(140 * 1024 + 1, 5);
  std::mt19937_64 rng(17);
  for (size_t chunks = 0; chunks <= 140; ++chunks) {
    for (int delta : {-1, 0, 1}) {
      if (chunks == 0 && delta < 0) continue;
      const size_t len = chunks * 1024 + delta;
      const std::vector<uint8_t> input(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(len));
      const Hash32 want = RefHash(input);
      EXPECT_EQ(Blake3(input.data(), input.size()), want) << "one-shot len=" << len;
      // Whole-chunk updates, an unaligned first piece, and random pieces.
      for (size_t first : {size_t{1024}, size_t{1}, size_t{3000}, size_t{0}}) {
        Blake3Hasher h;
        size_t off = std::min(first, len);
        h.Update(input.data(), off);
        while (off < len) {
          size_t piece = first == 0 ? rng() % 9000 : 1024;
          piece = std::min(piece, len - off);
          h.Update(input.data() + off, piece);
          off += piece;
        }
        EXPECT_EQ(h.Finalize(), want) << "len=" << len << " first=" << first;
      }
    }
  }
}

// ---- Hasher behaviour --------------------------------------------------------

TEST(Blake3HasherTest, FinalizeDoesNotConsumeAndResetRestarts) {
  const std::vector<uint8_t> input = RandomBytes(5000, 11);
  Blake3Hasher h;
  h.Update(input.data(), 2000);
  EXPECT_EQ(h.Finalize(), Blake3(input.data(), 2000));
  h.Update(input.data() + 2000, 3000);
  EXPECT_EQ(h.Finalize(), Blake3(input.data(), 5000));
  h.Reset();
  EXPECT_EQ(h.Finalize(), Blake3(nullptr, 0));
  h.Update(input.data(), 1);
  EXPECT_EQ(h.Finalize(), Blake3(input.data(), 1));
}

TEST(Blake3HasherTest, KnownEmptyAndAbcDigests) {
  EXPECT_EQ(HexEncode(Blake3("", 0)), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
  EXPECT_EQ(HexEncode(Blake3("abc", 3)), "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85");
}

// ---- Comparison with Debian's b3sum -----------------------------------------

std::string RunB3sum(const std::string& path) {
  std::string cmd = "/usr/bin/b3sum --no-names '" + path + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  char buf[256] = {};
  std::string out;
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

TEST(Blake3B3sumTest, MatchesB3sumOnRandomFiles) {
  if (access("/usr/bin/b3sum", X_OK) != 0) GTEST_SKIP() << "/usr/bin/b3sum not installed";
  char tmpl[] = "/tmp/kvd_blake3_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = tmpl;
  std::mt19937_64 rng(2024);
  const size_t sizes[] = {0, 1, 1024, 1025, 65536 + 7, (1 << 20) + 3, 3 * (1 << 20) + 1000 + rng() % 1000};
  for (size_t len : sizes) {
    const std::vector<uint8_t> input = RandomBytes(len, rng());
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
    }
    const std::string want = RunB3sum(path);
    ASSERT_EQ(want.size(), 64u) << "unexpected b3sum output: '" << want << "'";
    for (Blake3Impl impl : SupportedImpls()) {
      ImplGuard guard(impl);
      EXPECT_EQ(HexEncode(Blake3(input.data(), input.size())), want)
          << "len=" << len << " impl=" << Blake3ImplName(impl);
    }
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(AllImpls, Blake3ImplTest,
                         ::testing::Values(Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2),
                         [](const ::testing::TestParamInfo<Blake3Impl>& info) {
                           switch (info.param) {
                             case Blake3Impl::kPortable:
                               return std::string("Portable");
                             case Blake3Impl::kSse41:
                               return std::string("Sse41");
                             case Blake3Impl::kAvx2:
                               return std::string("Avx2");
                             default:
                               return std::string("Auto");
                           }
                         });

}  // namespace
}  // namespace kvd::keys
