// The plain types of the tiers behind L1, shared by TierSet (tier_set.h) and its parts
// (store_behind.h, prefetcher.h, tier_state.h): a configured tier, the tier format of a
// layout, what store-behind and a prefetch are given and answer, and the stats.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "l1/l1_cache.h"
#include "l2/adapter_config.h"
#include "l2/object_key.h"
#include "l2/serde.h"
#include "l2/tier.h"

namespace kvd::l2 {

// One configured tier.
struct TierSpec {
  AdapterConfig config;
  std::shared_ptr<Tier> tier;
  std::shared_ptr<const Serde> serde;
};

// What the objects of one registered layout look like in the tiers.
struct ObjectFormat {
  uint64_t object_bytes = 0;
  std::string layout_tag;  // "" : lmcache-compatible names; else kvd-private (object_key.h)
  ObjectLayout layout;     // for serdes
};

// An object just committed to L1.
struct CommittedObject {
  l1::ChunkKey chunk;
  uint32_t num_slots = 0;  // slots of its L1 entry (world size)
  uint32_t slot = 0;       // its slot (rank)
  ObjectKey key;
};

// The chunks a lookup wants from the tiers, in prefix order.
struct PrefetchRequest {
  std::vector<l1::ChunkKey> chunks;
  std::vector<std::array<uint8_t, 32>> hashes;  // one per chunk
  std::string model_name;
  std::string cache_salt;
  uint32_t world_size = 0;
  ObjectFormat format;
};

// What a prefetch found (PrefetchWithAnswer).
struct PrefetchAnswer {
  size_t chunks = 0;  // leading chunks of the request now resident in L1
  // The chunk after them is known to be in no tier: every tier answered "not found" (no
  // error, no timeout) for one of its objects that L1 lacked too. False when the prefix ended
  // for any other reason (a tier failed or was late, no room in L1, a load failed) or covers
  // the whole request.
  bool next_in_no_tier = false;
};

struct TierStats {
  std::string name;          // l2_name label: the type, or "<type>#<index>" when repeated
  std::string type;
  std::string describe;
  TierHealth health;
  uint64_t capacity_bytes = 0;
  uint64_t usage_bytes = 0;  // bytes of accounted objects; 0 for a tier without a capacity (no index)
  uint64_t objects = 0;      // accounted objects
  bool scanned = false;      // the index covers objects of earlier runs
  // store-behind
  uint64_t store_requests = 0, store_objects = 0;            // submitted
  uint64_t store_completed_requests = 0, stored_objects = 0, stored_bytes = 0;
  uint64_t store_existing_objects = 0;                       // already in the tier
  uint64_t store_failed_objects = 0, store_full_objects = 0; // errors (full: no space)
  uint64_t store_skipped_objects = 0;                        // over the in-flight budget
  uint64_t inflight_store_objects = 0, inflight_store_bytes = 0;
  double store_seconds = 0;                                  // summed batch latency
  // prefetch
  uint64_t prefetch_lookup_objects = 0, prefetch_found_objects = 0;
  uint64_t load_requests = 0, load_objects = 0;              // submitted
  uint64_t load_completed_requests = 0, loaded_objects = 0, loaded_bytes = 0;
  uint64_t load_missing_objects = 0, load_corrupt_objects = 0, load_failed_objects = 0;
  uint64_t inflight_load_objects = 0;
  double load_seconds = 0;
  uint64_t lookup_errors = 0;
  // eviction
  uint64_t evicted_objects = 0, evicted_bytes = 0;
};

struct TierSetStats {
  std::vector<TierStats> tiers;
  uint64_t prefetch_requests = 0;        // lookups that went to the tiers
  uint64_t prefetch_hit_chunks = 0;      // chunks they brought into L1
  uint64_t prefetch_failed_chunks = 0;   // planned chunks that did not arrive
  uint64_t prefetch_timeouts = 0;
  uint64_t active_prefetch_jobs = 0;
  uint64_t queued_prefetch_jobs = 0;
  uint64_t temporary_chunks = 0;         // prefetched chunks waiting to leave L1 (default)
  uint64_t skip_l1_removed_chunks = 0;
  uint64_t skip_l1_waiting_chunks = 0;  // skip_l1: chunks in L1 with some ranks' objects in a tier
  std::string store_policy, prefetch_policy;
};

}  // namespace kvd::l2
