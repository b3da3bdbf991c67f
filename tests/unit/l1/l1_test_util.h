// Shared helpers for the l1 tests: keys, byte patterns derived from (key, slot), and a
// one-call "write an object" helper.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "l1/chunk_key.h"
#include "l1/l1_cache.h"

namespace kvd::l1::testing {

// Key number i in namespace `ns` (interned by the test's cache; see Ns below).
inline ChunkKey Key(uint64_t i, NamespaceId ns = 0) {
  ChunkKey key;
  key.ns = ns;
  // Spread i over the hash bytes like a real digest would (splitmix-style steps).
  uint64_t x = i + 0x9e3779b97f4a7c15ULL;
  for (size_t off = 0; off < key.chunk_hash.size(); off += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(key.chunk_hash.data() + off, &z, 8);
  }
  return key;
}

// The id of (model, world_size, salt) in `cache`.
inline NamespaceId Ns(L1Cache& cache, const std::string& model = "model", int32_t world_size = 1,
                      const std::string& salt = "") {
  auto ns = cache.namespaces().Intern(model, world_size, salt);
  EXPECT_TRUE(ns.ok());
  return ns.ok() ? *ns : 0;
}

// The byte at position i of the object (key, slot).
inline uint8_t PatternByte(const ChunkKey& key, uint32_t slot, uint64_t i) {
  uint64_t seed = ChunkKeyHash{}(key) ^ (uint64_t{slot} * 0x100000001b3ULL);
  uint64_t v = (seed + i * 0x9e3779b97f4a7c15ULL);
  return static_cast<uint8_t>(v >> 56 ^ v >> 17 ^ i);
}

inline void FillPattern(uint8_t* data, uint64_t size, const ChunkKey& key, uint32_t slot) {
  for (uint64_t i = 0; i < size; ++i) data[i] = PatternByte(key, slot, i);
}

inline bool CheckPattern(const uint8_t* data, uint64_t size, const ChunkKey& key, uint32_t slot) {
  for (uint64_t i = 0; i < size; ++i) {
    if (data[i] != PatternByte(key, slot, i)) return false;
  }
  return true;
}

// Reserve + fill + commit. Returns the status of the reservation (OK when committed).
inline Status WriteObject(L1Cache& cache, const ChunkKey& key, uint32_t num_slots, uint32_t slot,
                          uint64_t size) {
  auto res = cache.ReserveWrite(key, num_slots, slot, size);
  if (!res.ok()) return res.status();
  FillPattern(res->data(), res->size(), key, slot);
  if (!res->Commit()) return Status::Internal("commit failed");
  return Status::Ok();
}

}  // namespace kvd::l1::testing
