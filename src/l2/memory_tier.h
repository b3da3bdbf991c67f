// MemoryTier: a tier held in process memory, for unit tests of what sits above tiers and as
// the reference implementation the tier contract suite runs against. Optional capacity:
// a store that would exceed it answers ResourceExhausted (a "full disk").
//
// Threads: see tier.h; answers come from one worker thread.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "l2/tier.h"
#include "l2/worker_pool.h"

namespace kvd::l2 {

class MemoryTier final : public Tier {
 public:
  explicit MemoryTier(uint64_t capacity_bytes = 0, std::string type = "memory");
  ~MemoryTier() override;

  std::string_view type() const override { return type_; }
  std::string Describe() const override { return type_ + " (in process)"; }
  void Store(std::vector<StoreItem> items, Done done) override;
  void Exists(std::vector<ObjectKey> keys, Done done) override;
  void Load(std::vector<LoadItem> items, Done done) override;
  void Delete(std::vector<ObjectKey> keys, Done done) override;
  void Scan(ScanDone done) override;
  TierHealth Health() const override { return {}; }
  void Close() override;

  // Direct access for tests.
  size_t size() const;
  uint64_t bytes() const;
  // Replaces an object's stored bytes (to plant a truncated or foreign object).
  void Put(const ObjectKey& key, std::vector<uint8_t> bytes);

 private:
  const uint64_t capacity_;
  const std::string type_;
  mutable Mutex mu_;
  std::unordered_map<ObjectKey, std::vector<uint8_t>, ObjectKeyHash> objects_ KVD_GUARDED_BY(mu_);
  uint64_t bytes_ KVD_GUARDED_BY(mu_) = 0;
  WorkerPool pool_{1, "kvd-memtier"};
};

}  // namespace kvd::l2
