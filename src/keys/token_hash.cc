// Token-chunk hashing (see token_hash.h): dispatch to the active backend's one-shot
// kernels, and the general hasher for chunks longer than two BLAKE3 chunks.
//
// Stateless and thread-safe; no heap use.
#include "keys/token_hash.h"

#include <algorithm>
#include <cstring>

#include "keys/blake3_internal.h"

namespace kvd::keys {
namespace {

using internal::kMaxOneShotTokens;

// Chunks of more than kMaxOneShotTokens tokens: the general hasher, fed big-endian tokens
// in stack batches.
Hash32 HashLongChunk(const Hash32& prev, const uint32_t* tokens, size_t n) {
  constexpr size_t kBatch = 256;
  Blake3Hasher hasher;
  hasher.Update(prev.data(), prev.size());
  uint8_t encoded[kBatch * 4];
  for (size_t start = 0; start < n; start += kBatch) {
    const size_t k = std::min(kBatch, n - start);
    for (size_t i = 0; i < k; ++i) internal::StoreBe32(encoded + 4 * i, tokens[start + i]);
    hasher.Update(encoded, 4 * k);
  }
  return hasher.Finalize();
}

void Chain(const internal::Blake3Backend* backend, const Hash32& prev, const uint32_t* tokens,
           uint32_t chunk_size, size_t num_chunks, Hash32* out) {
  if (num_chunks == 0) return;
  if (chunk_size <= kMaxOneShotTokens) {
    backend->token_chain(prev.data(), tokens, chunk_size, num_chunks, out->data());
    return;
  }
  Hash32 chain = prev;
  for (size_t c = 0; c < num_chunks; ++c) {
    chain = HashLongChunk(chain, tokens + c * chunk_size, chunk_size);
    out[c] = chain;
  }
}

}  // namespace

Hash32 HashTokenChunk(const Hash32& prev, std::span<const uint32_t> tokens) {
  if (tokens.empty()) return Blake3(prev.data(), prev.size());
  Hash32 out;
  Chain(internal::ActiveBackend(), prev, tokens.data(), static_cast<uint32_t>(tokens.size()), 1,
        &out);
  return out;
}

void HashTokenChain(const Hash32& prev, std::span<const uint32_t> tokens, uint32_t chunk_size,
                    std::span<Hash32> out) {
  Chain(internal::ActiveBackend(), prev, tokens.data(), chunk_size, out.size(), out.data());
}

std::string TokenChainDescription() {
  const internal::OneChainChoice& c = internal::AutoOneChainChoice();
  std::string out = Blake3ImplName(Blake3ActiveImpl());
  out += "; one chain: ";
  out += c.name;
  if (c.other_ns_per_chunk > 0) {
    out += ", " + std::to_string(static_cast<long>(c.chosen_ns_per_chunk)) +
           " ns per 256-token chunk (the other kernel: " +
           std::to_string(static_cast<long>(c.other_ns_per_chunk)) + " ns)";
  }
  return out;
}

size_t TokenChainLanes() { return internal::ActiveBackend()->token_chains8 ? 8 : 1; }

void HashTokenChains(std::span<const TokenChainJob> jobs, uint32_t chunk_size) {
  const internal::Blake3Backend* backend = internal::ActiveBackend();
  if (backend->token_chains8 == nullptr || chunk_size > kMaxOneShotTokens || jobs.size() < 2) {
    for (const auto& j : jobs) Chain(backend, j.prev, j.tokens, chunk_size, j.num_chunks, j.out);
    return;
  }
  // Eight lanes, each working through its own job. A round hashes as many chunks as the
  // lane with the fewest left; lanes that run dry take the next job. When fewer than
  // two jobs remain active, the rest runs one chain at a time.
  struct Lane {
    const TokenChainJob* job = nullptr;
    size_t done = 0;  // chunks of job hashed
  };
  Lane lanes[8];
  size_t next = 0;
  auto refill = [&](Lane& lane) {
    lane = Lane{};
    while (next < jobs.size() && jobs[next].num_chunks == 0) ++next;
    if (next < jobs.size()) lane.job = &jobs[next++];
  };
  for (auto& lane : lanes) refill(lane);
  // An idle lane repeats an active lane's tokens (readable for the whole round) into
  // scratch keys; a round with idle lanes is capped at kScratch chunks.
  constexpr size_t kScratch = 64;
  Hash32 scratch[kScratch];
  for (;;) {
    size_t active = 0;
    size_t step = SIZE_MAX;
    const Lane* some_active = nullptr;
    for (const auto& lane : lanes) {
      if (!lane.job) continue;
      ++active;
      some_active = &lane;
      step = std::min(step, lane.job->num_chunks - lane.done);
    }
    if (active < 2) break;
    if (active < 8) step = std::min(step, kScratch);
    const uint8_t* prev[8];
    const uint32_t* tokens[8];
    uint8_t* out[8];
    for (int l = 0; l < 8; ++l) {
      const Lane& lane = lanes[l].job ? lanes[l] : *some_active;
      prev[l] = lane.done == 0 ? lane.job->prev.data() : lane.job->out[lane.done - 1].data();
      tokens[l] = lane.job->tokens + lane.done * chunk_size;
      out[l] = lanes[l].job ? lane.job->out[lane.done].data() : scratch[0].data();
    }
    backend->token_chains8(prev, tokens, chunk_size, step, out);
    for (auto& lane : lanes) {
      if (!lane.job) continue;
      lane.done += step;
      if (lane.done == lane.job->num_chunks) refill(lane);
    }
  }
  for (const auto& lane : lanes) {
    if (!lane.job) continue;
    const TokenChainJob& j = *lane.job;
    const Hash32& prev = lane.done == 0 ? j.prev : j.out[lane.done - 1];
    Chain(backend, prev, j.tokens + lane.done * chunk_size, chunk_size, j.num_chunks - lane.done,
          j.out + lane.done);
  }
}

}  // namespace kvd::keys
