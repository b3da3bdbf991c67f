// AdapterConfig: one `--l2-adapter '<JSON>'`, parsed and validated with lmcache 0.5.6's keys
// for the types kvd implements: fs, fs_native, resp, valkey (standalone or cluster_mode).
// Every other type lmcache knows is refused by name; so are unknown keys (lmcache ignores
// them; kvd says so, since a misspelt key silently falls back to a default there).
//
// Common keys (all types): type, affinity_tag, shared, persist_enabled, eviction
// {eviction_policy, trigger_watermark, eviction_ratio}, serde {type, ...}.
// Plain value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvd::l2 {

struct TierEvictionConfig {
  std::string policy;             // LRU | ARC | IsolatedLRU | noop (lmcache's names)
  double trigger_watermark = 0.8; // evict when used / capacity >= this
  double eviction_ratio = 0.2;    // then free this fraction of the capacity
};

struct AdapterConfig {
  int index = 0;                  // position among --l2-adapter flags (0 = highest priority)
  std::string type;               // fs | fs_native | resp | valkey

  // Common.
  std::string affinity_tag = "_default";
  bool shared = false;
  bool persist_enabled = true;
  std::optional<TierEvictionConfig> eviction;
  std::string serde_json;         // the "serde" object as JSON text; empty: none

  // fs, fs_native.
  std::string base_path;
  std::string relative_tmp_dir;
  bool use_odirect = false;
  int64_t read_ahead_size = 0;    // 0: not set

  // fs_native, resp, valkey.
  int num_workers = 0;            // fs: 4 (kvd's thread pool), fs_native 4, resp/valkey 8
  double max_capacity_gb = 0;     // 0: no declared capacity

  // resp (host/port) and valkey (startup_nodes).
  std::vector<std::pair<std::string, int>> nodes;
  std::string username;
  std::string password;           // never logged or shown
  bool cluster_mode = false;
  std::string key_prefix;
  std::optional<int64_t> database_id;
  double request_timeout_s = 5;
  double connection_timeout_s = 10;
  std::optional<int64_t> ttl_seconds;

  uint64_t capacity_bytes() const {
    return static_cast<uint64_t>(max_capacity_gb * static_cast<double>(1ull << 30));
  }
  // The configuration as JSON for GET /config and /status, password replaced by "***".
  std::string RedactedJson() const;
  // "fs /data/kv", "resp 127.0.0.1:6379", "valkey cluster 10.0.0.1:7000,…".
  std::string Describe() const;
};

// Parses flag number index+1. Errors are one line:
//   "--l2-adapter #2: invalid JSON: ..."
//   "--l2-adapter #1: adapter type 's3' is an lmcache adapter type that kvd does not
//    implement (kvd implements: fs, fs_native, resp, valkey)"
//   "--l2-adapter #1 ('fs'): unknown key 'base_pth'"
// Environment defaults as lmcache: LMCACHE_RESP_USERNAME / LMCACHE_RESP_PASSWORD for resp
// when the JSON leaves them empty.
Result<AdapterConfig> ParseAdapterConfig(std::string_view json, int index);

}  // namespace kvd::l2
