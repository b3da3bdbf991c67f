// Tests for the one-shot token-chunk hash and the lane-parallel chains (keys/token_hash.h):
// the official BLAKE3 test vectors read as (prev, big-endian tokens) messages, chains
// computed by pip's `blake3` and checked against lmcache 0.5.6's TokenHasher
// (tests/data/token_chains/), agreement of every implementation with the general hasher on
// every chunk size from 1 to 600 tokens, and lanes == one chain at a time on ragged jobs.
//
// Single-threaded; tests that force an implementation restore automatic selection.
#include "keys/token_hash.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "keys/blake3_internal.h"
#include "keys/chunk_hasher.h"

namespace kvd::keys {
namespace {

// Each implementation forced, and kAuto: the best backend with the one-chain kernel that
// timed faster on this CPU (which may be the portable one inside the AVX2 backend).
std::vector<Blake3Impl> SupportedImpls() {
  std::vector<Blake3Impl> impls;
  for (Blake3Impl impl : {Blake3Impl::kAuto, Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2}) {
    if (Blake3ImplSupported(impl)) impls.push_back(impl);
  }
  return impls;
}

class ImplGuard {
 public:
  explicit ImplGuard(Blake3Impl impl) { EXPECT_TRUE(SetBlake3ImplForTesting(impl)); }
  ~ImplGuard() { SetBlake3ImplForTesting(Blake3Impl::kAuto); }
  ImplGuard(const ImplGuard&) = delete;
  ImplGuard& operator=(const ImplGuard&) = delete;
};

nlohmann::json LoadJson(const std::string& rel) {
  std::ifstream in(std::string(KVD_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in.good()) << rel;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

Hash32 FromHex(const std::string& hex) {
  Hash32 h{};
  for (size_t i = 0; i < 32; ++i) h[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return h;
}

// The reference: the general hasher over explicitly encoded bytes.
Hash32 Reference(const Hash32& prev, std::span<const uint32_t> tokens) {
  std::vector<uint8_t> msg(prev.begin(), prev.end());
  for (uint32_t t : tokens) {
    for (int s = 24; s >= 0; s -= 8) msg.push_back(static_cast<uint8_t>(t >> s));
  }
  return Blake3(msg.data(), msg.size());
}

std::vector<uint32_t> RandomTokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& v : t) {
    switch (rng() % 4) {  // small ids, 16-bit ids, full 32-bit values, the extremes
      case 0: v = static_cast<uint32_t>(rng() % 128); break;
      case 1: v = static_cast<uint32_t>(rng() % 65536); break;
      case 2: v = static_cast<uint32_t>(rng()); break;
      default: v = rng() % 2 ? 0u : 0xFFFFFFFFu; break;
    }
  }
  return t;
}

std::vector<uint32_t> Generate(const nlohmann::json& g) {
  const std::string kind = g["kind"];
  const uint64_t n = g["n"], a = g["a"], b = g["b"], mod = g["mod"];
  std::vector<uint32_t> out;
  if (kind == "affine") {
    for (uint64_t i = 0; i < n; ++i) {
      out.push_back(static_cast<uint32_t>((static_cast<unsigned __int128>(i) * a + b) % mod));
    }
  } else if (kind == "xorshift") {
    uint32_t x = a ? static_cast<uint32_t>(a) : 1;
    for (uint64_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      out.push_back(static_cast<uint32_t>(x % mod));
    }
  } else {
    ADD_FAILURE() << "unknown generator " << kind;
  }
  return out;
}

TEST(TokenHashTest, OfficialVectorsAsPrevAndBigEndianTokens) {
  // Official input i % 251 of length L = 32 + 4n: prev = its first 32 bytes, tokens = the
  // rest read as big-endian words. Covers one block, one chunk, two chunks (one-shot) and
  // longer messages (general hasher).
  const nlohmann::json v = LoadJson("tests/data/blake3/test_vectors.json");
  size_t checked = 0;
  for (Blake3Impl impl : SupportedImpls()) {
    ImplGuard guard(impl);
    SCOPED_TRACE(Blake3ImplName(impl));
    for (const auto& c : v["cases"]) {
      const size_t len = c["input_len"];
      if (len < 32 || (len - 32) % 4 != 0) continue;
      std::vector<uint8_t> in(len);
      for (size_t i = 0; i < len; ++i) in[i] = static_cast<uint8_t>(i % 251);
      Hash32 prev;
      std::copy(in.begin(), in.begin() + 32, prev.begin());
      std::vector<uint32_t> tokens((len - 32) / 4);
      for (size_t i = 0; i < tokens.size(); ++i) {
        const uint8_t* p = in.data() + 32 + 4 * i;
        tokens[i] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
      }
      const std::string want = std::string(c["hash"]).substr(0, 64);
      EXPECT_EQ(HexEncode(HashTokenChunk(prev, tokens)), want) << "input_len " << len;
      // The same message as a one-chunk chain and as one lane among others.
      Hash32 chained;
      HashTokenChain(prev, tokens, static_cast<uint32_t>(tokens.size()), {&chained, 1});
      EXPECT_EQ(HexEncode(chained), want) << "input_len " << len;
      ++checked;
    }
  }
  EXPECT_GE(checked, 8u);  // 64, 128, 1024, 2048, 3072, 4096, ... per implementation
}

TEST(TokenHashTest, ChainsMatchPipBlake3AndLmcacheTokenHasher) {
  const nlohmann::json v = LoadJson("tests/data/token_chains/token_chain_vectors.json");
  ASSERT_TRUE(v["checked_against_lmcache_token_hasher"].get<bool>());
  ASSERT_EQ(HexEncode(NoneHash()), v["none_hash"].get<std::string>());
  for (Blake3Impl impl : SupportedImpls()) {
    ImplGuard guard(impl);
    SCOPED_TRACE(Blake3ImplName(impl));
    std::vector<std::vector<uint32_t>> all_tokens;
    std::vector<std::vector<Hash32>> lane_out;
    std::vector<TokenChainJob> jobs;
    all_tokens.reserve(v["cases"].size());  // jobs point into these: no reallocation
    lane_out.reserve(v["cases"].size());
    for (const auto& c : v["cases"]) {
      const uint32_t chunk = c["chunk_size"];
      std::vector<uint32_t> tokens = Generate(c["tokens"]);
      std::vector<Hash32> want;
      for (const auto& k : c["keys"]) want.push_back(FromHex(k));
      std::vector<Hash32> got(want.size());
      HashTokenChain(NoneHash(), tokens, chunk, got);
      EXPECT_EQ(got, want) << "chunk_size " << chunk;
      if (chunk == 256) {  // the server's chunk size: also as lanes
        all_tokens.push_back(std::move(tokens));
        lane_out.emplace_back(want.size());
        jobs.push_back({NoneHash(), all_tokens.back().data(), want.size(), lane_out.back().data()});
      }
    }
    ASSERT_GE(jobs.size(), 4u);
    HashTokenChains(jobs, 256);
    size_t i = 0;
    for (const auto& c : v["cases"]) {
      if (c["chunk_size"] != 256) continue;
      std::vector<Hash32> want;
      for (const auto& k : c["keys"]) want.push_back(FromHex(k));
      EXPECT_EQ(lane_out[i++], want);
    }
  }
}

TEST(TokenHashTest, EveryChunkSizeAgreesWithTheGeneralHasher) {
  const std::vector<uint32_t> tokens = RandomTokens(3 * 600, 42);
  for (Blake3Impl impl : SupportedImpls()) {
    ImplGuard guard(impl);
    SCOPED_TRACE(Blake3ImplName(impl));
    for (uint32_t c = 1; c <= 600; ++c) {
      Hash32 prev = Reference(NoneHash(), std::span(tokens).first(c));  // any 32 bytes
      Hash32 want[3];
      Hash32 p = prev;
      for (int k = 0; k < 3; ++k) {
        want[k] = Reference(p, std::span(tokens).subspan(k * c, c));
        p = want[k];
      }
      Hash32 got[3];
      HashTokenChain(prev, tokens, c, got);
      for (int k = 0; k < 3; ++k) ASSERT_EQ(got[k], want[k]) << "chunk_size " << c << " chunk " << k;
      ASSERT_EQ(HashTokenChunk(prev, std::span(tokens).first(c)), want[0]) << "chunk_size " << c;
    }
  }
}

TEST(TokenHashTest, LanesEqualOneChainAtATimeOnRaggedJobs) {
  for (Blake3Impl impl : SupportedImpls()) {
    ImplGuard guard(impl);
    SCOPED_TRACE(Blake3ImplName(impl));
    for (uint32_t chunk : {256u, 16u, 249u, 300u, 504u, 505u}) {
      SCOPED_TRACE(chunk);
      std::mt19937_64 rng(chunk);
      // 0..70 chunks per job: empty jobs, jobs longer than the scratch round, 1..23 jobs.
      for (size_t njobs : {1u, 2u, 7u, 8u, 9u, 23u}) {
        std::vector<std::vector<uint32_t>> toks(njobs);
        std::vector<std::vector<Hash32>> got(njobs), want(njobs);
        std::vector<TokenChainJob> jobs(njobs);
        for (size_t j = 0; j < njobs; ++j) {
          const size_t n = rng() % 71;
          toks[j] = RandomTokens(n * chunk, rng());
          got[j].assign(n, Hash32{});
          want[j].assign(n, Hash32{});
          Hash32 prev{};
          for (auto& b : prev) b = static_cast<uint8_t>(rng());
          jobs[j] = {prev, toks[j].data(), n, got[j].data()};
          HashTokenChain(prev, toks[j], chunk, want[j]);
        }
        HashTokenChains(jobs, chunk);
        for (size_t j = 0; j < njobs; ++j) ASSERT_EQ(got[j], want[j]) << "job " << j << " of " << njobs;
      }
    }
  }
}

TEST(TokenHashTest, LanesAreUsedWhereTheCpuHasThem) {
  if (!Blake3ImplSupported(Blake3Impl::kAvx2)) GTEST_SKIP() << "no AVX2";
  {
    ImplGuard guard(Blake3Impl::kAvx2);
    EXPECT_EQ(TokenChainLanes(), 8u);
  }
  ImplGuard guard(Blake3Impl::kPortable);
  EXPECT_EQ(TokenChainLanes(), 1u);
}

TEST(TokenHashTest, AutomaticSelectionKeepsTheFasterOneChainKernel) {
  const internal::OneChainChoice& c = internal::AutoOneChainChoice();
  ASSERT_NE(c.kernel, nullptr);
  const Blake3Impl best = Blake3ActiveImpl();
  if (best == Blake3Impl::kPortable) {
    EXPECT_EQ(c.kernel, internal::TokenChainPortable);
    EXPECT_EQ(c.other_ns_per_chunk, 0.0) << "nothing else to time";
    return;
  }
  // Both kernels were timed; the SIMD one stays unless the portable one was 5% faster.
  ASSERT_GT(c.chosen_ns_per_chunk, 0.0);
  ASSERT_GT(c.other_ns_per_chunk, 0.0);
  if (c.kernel == internal::TokenChainPortable) {
    EXPECT_STREQ(c.name, "portable");
    EXPECT_LT(c.chosen_ns_per_chunk, 0.95 * c.other_ns_per_chunk);
  } else {
    EXPECT_EQ(c.kernel, internal::TokenChainSse41);
    EXPECT_GE(c.other_ns_per_chunk, 0.95 * c.chosen_ns_per_chunk);
  }
  // What kvd logs at startup names the choice.
  const std::string line = TokenChainDescription();
  EXPECT_NE(line.find(std::string("one chain: ") + c.name), std::string::npos) << line;
  // The automatic backend hashes with that kernel and still has its lanes.
  ImplGuard guard(Blake3Impl::kAuto);
  EXPECT_EQ(internal::ActiveBackend()->token_chain, c.kernel);
  EXPECT_EQ(TokenChainLanes(), Blake3ImplSupported(Blake3Impl::kAvx2) ? 8u : 1u);
}

}  // namespace
}  // namespace kvd::keys
