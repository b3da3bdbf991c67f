// Tests for chained chunk hashing: agreement with lmcache 0.5.6's Python hasher
// (hard-coded digests), chunking rules, chaining, resuming, and token validation.
// Single-threaded; the test that forces BLAKE3 implementations restores kAuto.
#include "keys/chunk_hasher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvd::keys {
namespace {

// Expected digests below were produced with the pip package `blake3` (1.0.11) in a
// throwaway venv (python3 -m venv /tmp/b3venv && /tmp/b3venv/bin/pip install blake3):
//
//   import struct, blake3
//   def chain(tokens, C):
//       prev = blake3.blake3((0).to_bytes(8, "big", signed=True) + struct.pack(">I", 0)).digest()
//       out = []
//       for i in range(0, len(tokens) - len(tokens) % C, C):
//           prev = blake3.blake3(prev + struct.pack(f">{C}I", *tokens[i:i + C])).digest()
//           out.append(prev.hex())
//       return out
//   print(blake3.blake3(bytes(12)).hexdigest())                         # none hash
//   print(chain([(i * 7919 + 13) % 50257 for i in range(1000)], 256))    # list A
//   print(chain([(i * 2654435761) % 2**32 for i in range(100)], 16))     # list B
//
// The same values were also obtained from lmcache's own TokenHasher(chunk_size,
// "blake3").compute_chunk_hashes (lmcache/v1/multiprocess/token_hasher.py, loaded
// with its numba/numpy/logging imports stubbed out).
constexpr char kNoneHashHex[] = "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b";
const std::vector<std::string> kListAHex = {
    "b072719b20284b65dc4bdd95be64c11ff51aa420903ed0f4aad58c9db208fc74",
    "80e952bb4361f26b4584e3e8883b0e91ea7c019052e9f1bc93cb678d291435fe",
    "c42e4e83043cb0c7a5722ec469aa24ea5c0d0f660a245f6b5fbca15e603103aa",
};
const std::vector<std::string> kListBHex = {
    "060fe37cc6317fb6c67029a826c91a310b888bc8658ec9f09c9103fa583804e6",
    "ddee5a4d71dd1c9e2e85b78316a533b7092a88438b6ad978e32da62684a5880d",
    "c7ae1b7416cd4c1bee9139a768a92aab95b53d4f77e759eda2ed40c1b3755f74",
    "40437830cef1b1cc27a2c4cba6df2a4152ef1039683c1edf8511f72399864142",
    "81566b2c410b499aa160710bdde2c7ecb6294719735817c516ad682a63a33326",
    "ef14e3f11b9a66475e333c37e60e566a78ebbcabfc538cf6b5713727a9465959",
};

std::vector<int64_t> ListA() {
  std::vector<int64_t> t(1000);
  for (int64_t i = 0; i < 1000; ++i) t[i] = (i * 7919 + 13) % 50257;
  return t;
}

std::vector<int64_t> ListB() {
  std::vector<int64_t> t(100);
  for (int64_t i = 0; i < 100; ++i) t[i] = (i * int64_t{2654435761}) % (int64_t{1} << 32);
  return t;
}

std::vector<std::string> ToHex(const std::vector<Hash32>& hashes) {
  std::vector<std::string> out;
  for (const auto& h : hashes) out.push_back(HexEncode(h));
  return out;
}

std::vector<std::string> HashAllHex(const std::vector<int64_t>& tokens, uint32_t chunk_size) {
  auto r = ComputeChunkHashes(tokens, chunk_size);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? ToHex(r.value()) : std::vector<std::string>{};
}

TEST(ChunkHasherTest, NoneHashMatchesPython) {
  EXPECT_EQ(HexEncode(NoneHash()), kNoneHashHex);
  const uint8_t zeros[12] = {};
  EXPECT_EQ(NoneHash(), Blake3(zeros, sizeof(zeros)));
}

TEST(ChunkHasherTest, MatchesPythonOnAllImpls) {
  for (Blake3Impl impl : {Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2}) {
    if (!SetBlake3ImplForTesting(impl)) continue;
    SCOPED_TRACE(Blake3ImplName(impl));
    EXPECT_EQ(HashAllHex(ListA(), 256), kListAHex);  // 1000 tokens: 3 full chunks, 232 dropped
    EXPECT_EQ(HashAllHex(ListB(), 16), kListBHex);   // 100 tokens: 6 full chunks, 4 dropped
  }
  SetBlake3ImplForTesting(Blake3Impl::kAuto);
}

TEST(ChunkHasherTest, HashChunkIsBlake3OfPrevAndBigEndianTokens) {
  const std::vector<int64_t> tokens = {0, 1, 0x01020304, 0xFFFFFFFF};
  std::vector<uint8_t> msg(NoneHash().begin(), NoneHash().end());
  for (uint8_t b : {0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 0xFF, 0xFF, 0xFF, 0xFF}) msg.push_back(b);
  auto r = HashChunk(NoneHash(), tokens);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), Blake3(msg.data(), msg.size()));
}

TEST(ChunkHasherTest, PartialChunkDropped) {
  std::vector<int64_t> tokens = ListA();
  auto full = ComputeChunkHashes(tokens, 256);
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->size(), 3u);
  // Changing or removing tokens of the trailing partial chunk changes nothing.
  tokens[999] = 7;
  tokens[768] = 12345;
  EXPECT_EQ(ComputeChunkHashes(tokens, 256).value(), full.value());
  tokens.resize(768);
  EXPECT_EQ(ComputeChunkHashes(tokens, 256).value(), full.value());
  tokens.resize(767);
  EXPECT_EQ(ComputeChunkHashes(tokens, 256)->size(), 2u);
  tokens.resize(255);
  EXPECT_TRUE(ComputeChunkHashes(tokens, 256)->empty());
  EXPECT_TRUE(ComputeChunkHashes({}, 256)->empty());
}

TEST(ChunkHasherTest, ChainingPropagatesEarlierChanges) {
  std::vector<int64_t> tokens = ListA();
  const std::vector<Hash32> base = ComputeChunkHashes(tokens, 256).value();

  std::vector<int64_t> changed0 = tokens;
  changed0[10] += 1;  // in chunk 0
  const std::vector<Hash32> h0 = ComputeChunkHashes(changed0, 256).value();
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(h0[i], base[i]) << "chunk " << i;

  std::vector<int64_t> changed1 = tokens;
  changed1[300] += 1;  // in chunk 1
  const std::vector<Hash32> h1 = ComputeChunkHashes(changed1, 256).value();
  EXPECT_EQ(h1[0], base[0]);
  EXPECT_NE(h1[1], base[1]);
  EXPECT_NE(h1[2], base[2]);

  // The same tokens as chunk 1 give a different hash when the prefix differs.
  EXPECT_NE(HashChunk(NoneHash(), std::span(tokens).subspan(256, 256)).value(), base[1]);
  EXPECT_EQ(HashChunk(base[0], std::span(tokens).subspan(256, 256)).value(), base[1]);
}

TEST(ChunkHasherTest, ResumeFromLaterChunkEqualsFullComputation) {
  const std::vector<int64_t> tokens = ListB();
  const std::vector<Hash32> full = ComputeChunkHashes(tokens, 16).value();
  ASSERT_EQ(full.size(), 6u);
  for (size_t first = 1; first <= 6; ++first) {
    std::vector<Hash32> out = {Hash32{}};  // appends after existing content
    ASSERT_TRUE(AppendChainedChunkHashes(tokens, 16, first, full[first - 1], &out).ok());
    ASSERT_EQ(out.size(), 1 + (6 - first));
    EXPECT_EQ(out[0], Hash32{});
    for (size_t i = first; i < 6; ++i) EXPECT_EQ(out[1 + i - first], full[i]) << "first=" << first;
  }
  std::vector<Hash32> out;
  ASSERT_TRUE(AppendChainedChunkHashes(tokens, 16, 100, NoneHash(), &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST(ChunkHasherTest, OutOfRangeTokenRejected) {
  std::vector<int64_t> tokens = ListB();
  tokens[37] = -1;
  std::vector<Hash32> out = {Hash32{}};
  Status st = AppendChainedChunkHashes(tokens, 16, 0, NoneHash(), &out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("index 37"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("-1"), std::string::npos) << st.message();
  EXPECT_EQ(out.size(), 1u);  // unchanged on error

  tokens[37] = int64_t{1} << 32;
  auto r = ComputeChunkHashes(tokens, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("4294967296"), std::string::npos) << r.status().message();

  // 2^32 - 1 is the largest valid token.
  tokens[37] = 0xFFFFFFFF;
  EXPECT_TRUE(ComputeChunkHashes(tokens, 16).ok());

  // A bad token in the dropped partial chunk is never encoded, so it is fine.
  tokens[99] = -5;
  EXPECT_TRUE(ComputeChunkHashes(tokens, 16).ok());

  EXPECT_FALSE(ComputeChunkHashes(tokens, 0).ok());
}

TEST(ChunkHasherTest, LongChunksSpanningManyBlake3Chunks) {
  // chunk_size 1000 -> 4000-byte messages (several BLAKE3 chunks per key).
  std::vector<int64_t> tokens(3500);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 31 % 100000);
  const std::vector<Hash32> got = ComputeChunkHashes(tokens, 1000).value();
  ASSERT_EQ(got.size(), 3u);
  Hash32 prev = NoneHash();
  for (size_t c = 0; c < 3; ++c) {
    std::vector<uint8_t> msg(prev.begin(), prev.end());
    for (size_t i = c * 1000; i < (c + 1) * 1000; ++i) {
      uint32_t v = static_cast<uint32_t>(tokens[i]);
      for (int s = 24; s >= 0; s -= 8) msg.push_back(static_cast<uint8_t>(v >> s));
    }
    prev = Blake3(msg.data(), msg.size());
    EXPECT_EQ(got[c], prev) << "chunk " << c;
  }
}

}  // namespace
}  // namespace kvd::keys
