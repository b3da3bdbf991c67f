// Read-only snapshots of the server's state for operators (/status, /metrics, the
// dashboard). Plain data, copied out under the owners' locks; holding one pins nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvd::server {

// One registered worker instance.
struct InstanceStatus {
  int64_t instance_id = 0;
  bool engine_driven = false;       // false: kvd copies (lmcache_driven)
  std::string model_name;
  int64_t world_size = 0;
  std::string layout;               // KvLayout::Describe(), or the engine-driven object shape
  uint64_t object_bytes = 0;        // bytes of one chunk object of this worker
  size_t num_mappings = 0;          // shared-memory segments kvd has mapped for it
  double idle_seconds = 0;          // since its last request or PING
  bool pinged = false;              // has sent at least one PING (reaped on the short timeout)
};

// Everything KvService can say about itself beyond its L1 stats and counters.
struct ServiceStatus {
  std::vector<InstanceStatus> instances;  // ordered by instance id
  size_t sessions = 0;                    // live request sessions
  uint64_t session_bytes = 0;             // bytes they hold (sessions.h)
  uint64_t sessions_evicted = 0;          // dropped to stay within --max-sessions/-memory-mb
  uint64_t chunk_key_memo_hits = 0;       // chunk keys found in the memo (keys/chunk_key_memo.h)
  uint64_t chunk_key_memo_misses = 0;     // chunk keys hashed
  uint64_t chunk_key_memo_bytes = 0;      // memory the memo holds
  size_t pending_engine_stores = 0;       // engine-driven PREPARE_STORE awaiting COMMIT
  size_t pending_engine_retrieves = 0;    // engine-driven PREPARE_RETRIEVE awaiting COMMIT
  size_t device_copies_in_flight = 0;     // asynchronous (GPU) copies not completed yet
};

}  // namespace kvd::server
