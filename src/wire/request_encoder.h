// Client-side encoders: the frames an lmcache 0.5.6 client sends, byte for byte as its
// msgspec encoder writes them (dataclass fields in declaration order, smallest integer
// encodings, str for names, bin for bytes, ext type 1 for device IPC descriptors). kvd
// itself never sends requests: these are for kvd-bench, tests and tools that speak the
// protocol to a server (tests/unit/wire/request_encoder_test.cc checks them against the
// golden frames captured from the real client). Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/messages.h"

namespace kvd::wire {

// A msgpack integer / string / bytes document (e.g. the uid and op frames).
std::string EncodeRequestInt(int64_t v);
std::string EncodeRequestStr(std::string_view v);
std::string EncodeRequestBin(std::string_view v);

// token_ids as a msgpack array (the part of a key that dominates its size; callers that
// send the same tokens many times encode it once and pass it to EncodeCacheKey).
std::string EncodeTokenArray(std::span<const int64_t> tokens);

// IPCCacheServerKey: {model_name, world_size, worker_id, token_ids, start, end, request_id,
// cache_salt, request_configs (nil), num_kv_readers}. `token_array` is EncodeTokenArray's
// output for the key's tokens; key.token_ids is not read.
std::string EncodeCacheKey(const CacheKey& key, std::string_view token_array);

// block_ids: one array of ids per KV group.
std::string EncodeBlockIds(std::span<const std::vector<int64_t>> groups);

// The ext-1 descriptor of a CPU shared-memory tensor (TensorMemory::kCpuShm), as one
// element of REGISTER_KV_CACHE's kv_cache list: {type: "cpu_shm", shm_name, nbytes,
// version: 1, metadata: {dtype, shape, stride, storage_offset, device_uuid}}.
std::string EncodeCpuShmDescriptorExt(const TensorDescriptor& d);
// A msgpack array of already-encoded elements (e.g. ext descriptors).
std::string EncodeArrayOf(std::span<const std::string> encoded_elements);

// ---- CacheBlend ops (payloads as the 0.5.6 client writes them) ----
std::string EncodeRequestBool(bool v);                      // is_neox_style
std::string EncodeIntList(std::span<const int64_t> v);      // group_to_cache, group_head_size
// group_rot: [offset, width] per window, [] for a skipped group.
std::string EncodeGroupRot(std::span<const std::optional<RopeWindow>> windows);
// match_results of cb_retrieve_pre_computed: [{old_st, old_ed, cur_st, cur_ed, hash}, ...].
std::string EncodeCbMatchResults(std::span<const CbMatchResult> matches);

}  // namespace kvd::wire
