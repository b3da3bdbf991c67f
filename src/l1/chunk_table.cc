#include "l1/chunk_table.h"

namespace kvd::l1::detail {
namespace {

inline uint8_t TagOf(uint64_t digest) { return static_cast<uint8_t>(digest >> 50); }

}  // namespace

std::optional<uint32_t> Shard::NewRecord(uint16_t num_slots) {
  int free_arena = -1;
  for (uint32_t a = 0; a < kMaxArenas; ++a) {
    if (arenas_[a] && arenas_[a]->num_slots() == num_slots) {
      auto index = arenas_[a]->Allocate();
      if (!index) return std::nullopt;
      return a << kIndexBits | *index;
    }
    if (!arenas_[a] && free_arena < 0) free_arena = static_cast<int>(a);
  }
  if (free_arena < 0) return std::nullopt;
  arenas_[free_arena] = std::make_unique<EntryArena>(num_slots);
  auto index = arenas_[free_arena]->Allocate();
  if (!index) return std::nullopt;
  return static_cast<uint32_t>(free_arena) << kIndexBits | *index;
}

size_t Shard::arena_bytes() const {
  size_t n = 0;
  for (const auto& a : arenas_) n += a ? a->reserved_bytes() : 0;
  return n;
}

void Shard::ResizeIndex(uint32_t buckets) {
  std::vector<uint32_t> old = std::move(buckets_);
  buckets_.assign(buckets, kNoRef);
  tags_.assign(buckets, 0);
  mask_ = buckets - 1;
  for (uint32_t local : old) {
    if (local == kNoRef) continue;
    const uint64_t d = Digest(Rec(local)->key());
    uint32_t b = static_cast<uint32_t>(d) & mask_;
    while (buckets_[b] != kNoRef) b = (b + 1) & mask_;
    buckets_[b] = local;
    tags_[b] = TagOf(d);
  }
}

uint32_t Shard::Find(const ChunkKey& key, uint64_t digest) {
  const uint8_t tag = TagOf(digest);
  for (uint32_t b = static_cast<uint32_t>(digest) & mask_;; b = (b + 1) & mask_) {
    const uint32_t local = buckets_[b];
    if (local == kNoRef) return kNoRef;
    if (tags_[b] != tag) continue;
    const EntryRec* r = Rec(local);
    if (r->ns == key.ns && r->chunk_hash == key.chunk_hash) return local;
  }
}

void Shard::Insert(uint32_t local, uint64_t digest) {
  if (uint64_t{count_ + 1} * 5 > uint64_t{mask_ + 1} * 4) ResizeIndex((mask_ + 1) * 2);
  uint32_t b = static_cast<uint32_t>(digest) & mask_;
  while (buckets_[b] != kNoRef) b = (b + 1) & mask_;
  buckets_[b] = local;
  tags_[b] = TagOf(digest);
  ++count_;
}

void Shard::Erase(uint32_t local) {
  uint32_t b = static_cast<uint32_t>(Digest(Rec(local)->key())) & mask_;
  while (buckets_[b] != local) {
    if (buckets_[b] == kNoRef) return;  // not indexed
    b = (b + 1) & mask_;
  }
  // Backward-shift deletion: move later members of the probe run into the hole when their
  // home bucket is at or before it.
  uint32_t hole = b;
  for (uint32_t j = (b + 1) & mask_; buckets_[j] != kNoRef; j = (j + 1) & mask_) {
    const uint32_t home = static_cast<uint32_t>(Digest(Rec(buckets_[j])->key())) & mask_;
    // Does home lie cyclically in (hole, j]? Then the member stays.
    const bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    buckets_[hole] = buckets_[j];
    tags_[hole] = tags_[j];
    hole = j;
  }
  buckets_[hole] = kNoRef;
  --count_;
}

}  // namespace kvd::l1::detail
