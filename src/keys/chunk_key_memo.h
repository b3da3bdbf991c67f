// ChunkKeyMemo: the keys of recently hashed chunks, so a prefix many requests share (a system
// prompt, a conversation's history, the prompt a LOOKUP just hashed and its RETRIEVEs send
// again under another request id) is not hashed again by each of them. BLAKE3 of a 256-token
// chunk is 17 compressions in a row (about 1.4 us); finding it here is one pass of a
// multiply-mix hash over the same bytes and a compare (about 0.1 us).
//
// EXACT. An entry keeps what its key was computed from - the previous chunk's key and the
// chunk's tokens - and a lookup compares all of it byte for byte, so the memo never gives a
// key for other input whatever a client sends; the mix hash only picks the set to look in.
//
// PER TENANT. Entries belong to a domain (Domain(cache_salt), a keyed hash of the salt) and
// are found only from the same domain: a client cannot learn from a faster lookup that a
// client of another salt hashed a prefix.
//
// BOUNDED. capacity_bytes / EntryBytes(chunk_size) entries in sets of kWays; an insert into
// a full set replaces its least recently used entry. Capacity 0 disables the memo (HashChain
// then only hashes).
//
// THREADS. All methods are thread-safe: one mutex per set, held for one probe or insert
// (a compare or copy of one chunk), never while hashing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "keys/blake3.h"

namespace kvd::keys {

class ChunkKeyMemo {
 public:
  static constexpr size_t kWays = 4;

  ChunkKeyMemo(uint64_t capacity_bytes, uint32_t chunk_size);
  ~ChunkKeyMemo();
  ChunkKeyMemo(const ChunkKeyMemo&) = delete;
  ChunkKeyMemo& operator=(const ChunkKeyMemo&) = delete;

  // Bytes one entry takes (its key, the previous key, its tokens, bookkeeping).
  static uint64_t EntryBytes(uint32_t chunk_size);
  // The domain of a cache salt (keyed per process).
  uint64_t Domain(std::string_view cache_salt) const;

  // out[i] = key of chunk i of `tokens` (chunk_size tokens each) chained from `prev`, as
  // HashTokenChain computes it; remembered keys are taken from the memo, the others hashed
  // and remembered. Preconditions as HashTokenChain's; a chunk size other than the memo's
  // is hashed without it. Returns how many keys came from the memo.
  size_t HashChain(uint64_t domain, const Hash32& prev, std::span<const uint32_t> tokens,
                   uint32_t chunk_size, std::span<Hash32> out);

  struct Stats {
    uint64_t hits = 0;      // keys found
    uint64_t misses = 0;    // keys hashed
    uint64_t entries = 0;   // capacity in entries
    uint64_t bytes = 0;     // memory the memo holds
  };
  Stats stats() const;

 private:
  struct Set;
  uint64_t Tag(uint64_t domain, const Hash32& prev, const uint32_t* tokens) const;
  bool Find(uint64_t domain, uint64_t tag, const Hash32& prev, const uint32_t* tokens, Hash32* key);
  void Insert(uint64_t domain, uint64_t tag, const Hash32& prev, const uint32_t* tokens,
              const Hash32& key);

  const uint32_t chunk_size_;
  const uint64_t seed_;
  size_t num_sets_ = 0;
  std::unique_ptr<Set[]> sets_;
  std::unique_ptr<uint32_t[]> tokens_;  // per entry (set * kWays + way), chunk_size_ tokens
  std::atomic<uint64_t> clock_{0};      // recency stamps
  std::atomic<uint64_t> hits_{0}, misses_{0};
};

}  // namespace kvd::keys
