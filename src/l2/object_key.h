// ObjectKey: the name of one stored object in a tier, and its spellings as lmcache 0.5.6
// writes them, so that kvd and an `lmcache server` pointed at the same directory or the same
// Redis read each other's objects.
//
// One object = one chunk (chunk_hash) of one KV rank (kv_rank) of one object group of one
// model, optionally salted. lmcache's kv_rank packs (world_size, global_rank,
// local_world_size, local_rank) into bytes: (W << 24) | (r << 16) | (W << 8) | r for one node.
//
// Spellings (all checked against lmcache 0.5.6's own adapters):
//   RESP key   <model>@<kv_rank as 8 lower-case hex>@<group hex>@<hash hex>[@<salt>]
//              behind "<key_prefix>@" when a prefix is configured (valkey adapter)
//   file name  <model with '/' replaced by "-SEP-">@0x<kv_rank 8 hex>@<group hex>@<hash hex>
//              [@<salt>].data
//
// kvd-private objects. When kvd cannot prove that its bytes for a layout are the bytes
// lmcache would store (see docs/tiers.md), the key carries a layout tag and is spelled with
// "~k<tag>" after the hash: lmcache never looks such a name up and its own listing rejects it
// (the hash field is not hex), so the two servers never read each other's objects for that
// layout, while kvd servers with the same layout still share them.
//
// Plain value type; thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvd::l2 {

struct ObjectKey {
  std::string model_name;
  uint32_t kv_rank = 0;
  uint32_t object_group = 0;
  std::array<uint8_t, 32> chunk_hash{};
  std::string cache_salt;
  std::string layout_tag;  // empty: lmcache-compatible spelling; else kvd-private (hex)

  bool operator==(const ObjectKey&) const = default;
};

struct ObjectKeyHash {
  size_t operator()(const ObjectKey& key) const noexcept;
};

// lmcache's kv_rank for rank `rank` of `world_size` workers on one node. Both must be < 256.
uint32_t KvRank(uint32_t world_size, uint32_t rank);

// lmcache's ObjectKey invariants: model_name without '@'; cache_salt without '@', '/', '\\' or
// NUL and at most 128 characters; layout_tag lower-case hex. Also refuses a model name that
// would make a path component ("", ".", "..") or contain NUL.
Status ValidateObjectKey(const ObjectKey& key);

// "<prefix>@<model>@<rank:08x>@<group:x>@<hash>[~k<tag>][@<salt>]" (no "<prefix>@" if empty).
std::string RespKey(const ObjectKey& key, std::string_view key_prefix = {});
// The inverse; nullopt for anything that is not such a key (wrong prefix included).
std::optional<ObjectKey> ParseRespKey(std::string_view text, std::string_view key_prefix = {});

// "<model, '/'→-SEP->@0x<rank:08x>@<group:x>@<hash>[~k<tag>][@<salt>].data".
std::string FileName(const ObjectKey& key);
// The inverse; nullopt for anything else (temporary files, foreign files).
std::optional<ObjectKey> ParseFileName(std::string_view name);

// 64 lower-case hex digits.
std::string HashHex(const std::array<uint8_t, 32>& hash);

}  // namespace kvd::l2
