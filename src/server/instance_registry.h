// InstanceRegistry: the registered worker instances and their liveness (last request or
// PING, and whether the worker has ever pinged). It owns no copies and no L1 state: the
// transfer services build an Instance and Put it here; whoever removes one is responsible
// for what else belonged to it (KvService::Unregister).
//
// Thread-safe: one mutex, held only to find, insert or copy out shared_ptrs and times.
// Instances are immutable once registered; a caller holding the shared_ptr (e.g. for the
// duration of a copy) keeps the instance — and its engine and mappings — alive after it
// was replaced or removed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "l2/tier_set.h"
#include "layout/layout.h"
#include "server/service_counters.h"
#include "transfer/copy_engine.h"
#include "transfer/shm_mapping.h"

namespace kvd::server {

// How a registered worker's KV moves between its memory and L1. Exactly one per instance.
//
// KvdCopies (lmcache-driven: REGISTER_KV_CACHE, STORE, RETRIEVE): kvd's copy engine copies
// between the worker's registered tensors and L1.
struct KvdCopies {
  // The copy plan over the registered tensors and the engine executing it (CPU shared memory
  // or CUDA IPC). The engine owns the tensors' mappings.
  layout::KvLayout layout;
  std::shared_ptr<transfer::CopyEngine> engine;
  // The registration as received (RegistrationFingerprint) and the segment behind each
  // shared-memory name when it was mapped. A re-registration that matches both only
  // refreshes liveness; any difference rebuilds the instance.
  std::string registration;
  std::vector<std::pair<std::string, transfer::SegmentId>> shm_segments;
  size_t num_mappings = 0;  // shared-memory segments kvd mapped (CPU)
  // Where its KV lives, as lmcache's `device` label says it ("cpu" for shared memory,
  // "cuda:N" for a GPU, N its ordinal in kvd's process), and its counters in
  // ServiceCounters' tables (which outlive every instance).
  std::string device;
  TransferValues* transfer_counts = nullptr;
  ThroughputValues* throughput = nullptr;
  // On CPU shared memory: the first mapped byte and the mapped length of the segment behind
  // each registered tensor (owned by `engine`'s mappings, valid while the instance lives);
  // empty on a GPU. CacheBlend's scatter (server/blend_ops.h) writes through them.
  std::vector<uint8_t*> cpu_tensor_bases;
  std::vector<uint64_t> cpu_tensor_sizes;
  // The engine group id of each block-id list (the registration's engine_group_infos; empty:
  // list i is group i).
  std::vector<int64_t> engine_group_ids;
};

// WorkerCopies (engine-driven: PREPARE/COMMIT): the worker copies through the pool's shared
// memory itself; kvd hands it slots of this shape.
struct WorkerCopies {
  std::vector<int64_t> object_shape;
  std::string dtype;
};

// A registered worker: what both modes share, and how its KV is copied.
struct Instance {
  int64_t id = 0;
  std::string model_name;
  int64_t world_size = 0;
  // What goes into the keys of this instance's objects besides the model name (see
  // KeyModelName): empty for canonical objects, which every instance of the model shares.
  std::string key_namespace;
  // The client memory this instance maps, one id per segment or device allocation ("shm
  // dev:inode", "cuda <device> <handle>"). No two instances may map the same memory.
  std::vector<std::string> memory_ids;
  uint64_t object_bytes = 0;  // bytes of one chunk object
  // How its objects are named and laid out in the tiers (server/tiers.h).
  l2::ObjectFormat tier_format;
  std::variant<KvdCopies, WorkerCopies> copies;

  bool engine_driven() const { return std::holds_alternative<WorkerCopies>(copies); }
  // The mode's part. Only after checking the mode (std::get throws on the other one).
  const KvdCopies& kvd() const { return std::get<KvdCopies>(copies); }
  KvdCopies& kvd() { return std::get<KvdCopies>(copies); }
  const WorkerCopies& worker() const { return std::get<WorkerCopies>(copies); }
};

// The largest world size a registration may name (objects have one L1 slot per rank).
inline constexpr int64_t kMaxWorldSize = 4096;

// The checks every registration (either transfer mode) makes of the identity it names: a
// world size in [1, kMaxWorldSize] and a model name that is non-empty and has no '@' (the
// separator KeyModelName puts before a key namespace). InvalidArgument saying which.
Status CheckInstanceIdentity(const std::string& model_name, int64_t world_size);

class InstanceRegistry {
 public:
  explicit InstanceRegistry(const Clock* clock) : clock_(clock) {}

  // The instance, refreshing its liveness (a request from the worker); null if unknown.
  std::shared_ptr<const Instance> Find(int64_t id);
  // The instance without touching its liveness; null if unknown.
  std::shared_ptr<const Instance> Peek(int64_t id) const;
  // Inserts or replaces the instance of `inst->id` and marks it seen now. Replacing keeps
  // the id's "has pinged" mark.
  void Put(std::shared_ptr<const Instance> inst);
  // Put, unless another id maps some of the same client memory (Instance::memory_ids):
  // FailedPrecondition naming that instance, and nothing changes.
  Status PutExclusive(std::shared_ptr<const Instance> inst);
  // Marks the id seen now; false when it is not registered.
  bool Touch(int64_t id);
  // A PING: seen now, and from now on reaped on the (short) reap timeout.
  void Ping(int64_t id);
  // Removes the id; returns what was registered (null if nothing).
  std::shared_ptr<const Instance> Remove(int64_t id);
  // Removes the id only while it is still `expected` (not re-registered since); returns
  // whether it did.
  bool RemoveIf(int64_t id, const Instance* expected);

  // True when some instance registered this model and world size.
  bool ModelRegistered(const std::string& model, int64_t world_size) const;
  // The key namespace of the instances registered for this model and world size.
  struct Namespace {
    bool registered = false;  // some instance registered them
    bool agreed = true;       // all of those use `key_namespace`
    std::string key_namespace;
  };
  Namespace KeyNamespace(const std::string& model, int64_t world_size) const;
  size_t size() const;

  // Instances silent for longer than their limit at `now`: `pinged_limit_ns` for those
  // that have pinged, `unpinged_limit_ns` for the others.
  struct Silent {
    int64_t id = 0;
    int64_t silent_ns = 0;
    bool pinged = false;
  };
  std::vector<Silent> SilentSince(int64_t now, int64_t pinged_limit_ns,
                                  int64_t unpinged_limit_ns) const;

  // Every instance with its liveness, ordered by id (for status pages).
  struct Entry {
    std::shared_ptr<const Instance> instance;
    int64_t last_seen_ns = 0;
    bool pinged = false;
  };
  std::vector<Entry> Snapshot() const;

 private:
  const Clock* const clock_;
  mutable Mutex mu_;
  std::map<int64_t, Entry> entries_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd::server
