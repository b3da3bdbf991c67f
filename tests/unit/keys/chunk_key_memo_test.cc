// ChunkKeyMemo: the keys it gives are the keys HashTokenChain computes, for every input;
// what it remembers is found again only for the same previous key, tokens and domain; it
// stays within its memory; it is safe from many threads.
#include "keys/chunk_key_memo.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "keys/chunk_hasher.h"
#include "keys/token_hash.h"

namespace kvd::keys {
namespace {

constexpr uint32_t kChunk = 256;

std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = rng() % 200000;
  return t;
}

std::vector<Hash32> Reference(const std::vector<uint32_t>& t, size_t chunks) {
  std::vector<Hash32> out(chunks);
  HashTokenChain(NoneHash(), t, kChunk, out);
  return out;
}

TEST(ChunkKeyMemo, KeysAreTheChainsKeysAndASecondPassFindsThemAll) {
  ChunkKeyMemo memo(4 << 20, kChunk);
  const auto t = Tokens(8 * kChunk, 1);
  const uint64_t d = memo.Domain("");
  std::vector<Hash32> a(8), b(8);
  EXPECT_EQ(memo.HashChain(d, NoneHash(), t, kChunk, a), 0u);
  EXPECT_EQ(a, Reference(t, 8));
  EXPECT_EQ(memo.HashChain(d, NoneHash(), t, kChunk, b), 8u);
  EXPECT_EQ(b, a);
  auto s = memo.stats();
  EXPECT_EQ(s.hits, 8u);
  EXPECT_EQ(s.misses, 8u);
  EXPECT_LE(s.bytes, uint64_t{4} << 20);
}

TEST(ChunkKeyMemo, OneTokenChangedIsHashedFromThatChunkOn) {
  ChunkKeyMemo memo(4 << 20, kChunk);
  const uint64_t d = memo.Domain("");
  auto t = Tokens(6 * kChunk, 2);
  std::vector<Hash32> first(6), second(6);
  memo.HashChain(d, NoneHash(), t, kChunk, first);
  t[2 * kChunk + 17] ^= 1;  // chunk 2 differs: chunks 0, 1 are remembered, 2.. are not
  EXPECT_EQ(memo.HashChain(d, NoneHash(), t, kChunk, second), 2u);
  EXPECT_EQ(second, Reference(t, 6));
  EXPECT_NE(second[2], first[2]);
  // The same tokens after another previous key are other chunks.
  std::vector<Hash32> shifted(4);
  Hash32 other = NoneHash();
  other[0] ^= 1;
  EXPECT_EQ(memo.HashChain(d, other, std::span(t).subspan(2 * kChunk), kChunk, shifted), 0u);
  std::vector<Hash32> want(4);
  HashTokenChain(other, std::span(t).subspan(2 * kChunk), kChunk, want);
  EXPECT_EQ(shifted, want);
}

TEST(ChunkKeyMemo, EntriesAreFoundOnlyInTheirDomain) {
  ChunkKeyMemo memo(4 << 20, kChunk);
  const auto t = Tokens(4 * kChunk, 3);
  std::vector<Hash32> out(4);
  memo.HashChain(memo.Domain("tenant-a"), NoneHash(), t, kChunk, out);
  EXPECT_EQ(memo.HashChain(memo.Domain("tenant-b"), NoneHash(), t, kChunk, out), 0u);
  EXPECT_EQ(memo.HashChain(memo.Domain(""), NoneHash(), t, kChunk, out), 0u);
  EXPECT_EQ(memo.HashChain(memo.Domain("tenant-a"), NoneHash(), t, kChunk, out), 4u);
  EXPECT_EQ(out, Reference(t, 4));
}

TEST(ChunkKeyMemo, StaysWithinItsMemoryAndKeepsTheRecentlyUsed) {
  const uint64_t capacity = 16 * ChunkKeyMemo::EntryBytes(kChunk);  // 16 entries, 4 sets
  ChunkKeyMemo memo(capacity, kChunk);
  EXPECT_EQ(memo.stats().entries, 16u);
  EXPECT_LE(memo.stats().bytes, capacity);
  const uint64_t d = memo.Domain("");
  for (uint32_t i = 0; i < 200; ++i) {
    const auto t = Tokens(2 * kChunk, 100 + i);
    std::vector<Hash32> out(2);
    memo.HashChain(d, NoneHash(), t, kChunk, out);
    ASSERT_EQ(out, Reference(t, 2)) << i;
  }
  // The last chain is still there; the first is long gone.
  std::vector<Hash32> out(2);
  EXPECT_EQ(memo.HashChain(d, NoneHash(), Tokens(2 * kChunk, 299), kChunk, out), 2u);
  EXPECT_EQ(memo.HashChain(d, NoneHash(), Tokens(2 * kChunk, 100), kChunk, out), 0u);
}

TEST(ChunkKeyMemo, OffOrAnotherChunkSizeOnlyHashes) {
  const auto t = Tokens(4 * 128, 5);
  ChunkKeyMemo off(0, kChunk);
  std::vector<Hash32> out(2);
  EXPECT_EQ(off.HashChain(0, NoneHash(), std::span(t).first(2 * kChunk), kChunk, out), 0u);
  EXPECT_EQ(off.HashChain(0, NoneHash(), std::span(t).first(2 * kChunk), kChunk, out), 0u);
  EXPECT_EQ(out, Reference(t, 2));
  ChunkKeyMemo memo(1 << 20, kChunk);
  std::vector<Hash32> small(4), want(4);
  HashTokenChain(NoneHash(), t, 128, want);
  memo.HashChain(0, NoneHash(), t, 128, small);
  EXPECT_EQ(memo.HashChain(0, NoneHash(), t, 128, small), 0u);
  EXPECT_EQ(small, want);
}

TEST(ChunkKeyMemo, ManyThreadsOverSharedPrefixesGetTheRightKeys) {
  ChunkKeyMemo memo(64 * ChunkKeyMemo::EntryBytes(kChunk), kChunk);  // smaller than the work
  const uint64_t d = memo.Domain("");
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<std::vector<Hash32>> want;
  for (uint32_t i = 0; i < 12; ++i) {
    prompts.push_back(Tokens(8 * kChunk, 1000 + i));
    // Half of them share a 4-chunk prefix with the first.
    if (i % 2 == 1) std::copy(prompts[0].begin(), prompts[0].begin() + 4 * kChunk, prompts[i].begin());
    want.push_back(Reference(prompts[i], 8));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 30; ++round) {
        const size_t i = static_cast<size_t>((th * 7 + round) % 12);
        std::vector<Hash32> out(8);
        memo.HashChain(d, NoneHash(), prompts[i], kChunk, out);
        if (out != want[i]) wrong++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(memo.stats().hits, 0u);
}

}  // namespace
}  // namespace kvd::keys
