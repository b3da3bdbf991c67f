// HoldLedger: what the engine-driven operations between PREPARE and COMMIT hold of L1, and
// the admission that bounds it (issue 27, finding 2). A prepared store holds staging objects
// (write reservations: not evictable, invisible), a prepared retrieve holds read pins (not
// evictable); a worker that never commits would otherwise keep them until the write / read
// TTL, and could fill L1 so that every other tenant's STOREs fail.
//
// Bounds, in bytes of L1 objects: all holds together at most Limits::total_bytes, those of
// one instance (one worker) at most Limits::instance_bytes, and at most
// Limits::instance_ops operations per instance (the pending maps' own memory). A hold is
// admitted whole, or (stores: `min_items` < the sizes) as the longest prefix of its items
// that fits; to make room the ledger sheds holds older than Limits::shed_age_ns: the
// instance's own oldest first, then, for the total, the oldest of anyone. Younger holds are
// never shed (a worker may still be copying into or out of their objects): when shedding
// what may be shed does not make room, nothing is shed and the request gets what fits now,
// or is refused.
//
// THREADS. Not thread-safe: the owner (WorkerCopyTransfers) calls it under its mutex.
// OWNERSHIP. Holds only numbers; the L1 handles stay with the owner, which drops what
// Admit answers as shed.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvd::server {

class HoldLedger {
 public:
  struct Limits {
    uint64_t total_bytes = 0;
    uint64_t instance_bytes = 0;
    size_t instance_ops = 4096;
    int64_t shed_age_ns = 0;
  };
  // One admitted operation. `kind` and `name` are the owner's (which map, which key).
  struct Hold {
    uint64_t id = 0;
    int64_t instance = 0;
    uint64_t bytes = 0;
    int64_t since_ns = 0;
    int kind = 0;
    std::string name;
  };
  struct Admission {
    bool admitted = false;
    uint64_t id = 0;              // the new hold (when admitted)
    size_t items = 0;             // the prefix of the sizes admitted
    std::vector<Hold> shed;       // removed from the ledger: the owner drops them
    std::string refusal;          // why not, when refused
  };

  explicit HoldLedger(Limits limits) : limits_(limits) {}

  // Admits an operation of `instance` holding objects of `sizes` (in request order) at
  // `now_ns`: all of them, or at least the first `min_items` (min_items == sizes.size():
  // all or nothing). An empty `sizes` holds nothing but still counts as an operation.
  Admission Admit(int64_t instance, std::span<const uint64_t> sizes, size_t min_items,
                  int64_t now_ns, int kind, std::string name);
  // The operation committed (or its owner dropped it): false when it is not held.
  bool Remove(uint64_t id);
  // Every hold of `instance`, removed.
  std::vector<Hold> RemoveInstance(int64_t instance);

  const Limits& limits() const { return limits_; }
  uint64_t held_bytes() const { return total_bytes_; }
  uint64_t held_bytes(int64_t instance) const;
  size_t held_ops() const { return holds_.size(); }

 private:
  struct InstanceUse {
    uint64_t bytes = 0;
    std::set<uint64_t> ids;  // oldest first
  };
  void Take(uint64_t id);  // removes a hold that exists

  const Limits limits_;
  uint64_t next_id_ = 1;
  uint64_t total_bytes_ = 0;
  std::map<uint64_t, Hold> holds_;  // by id: oldest first
  std::unordered_map<int64_t, InstanceUse> instances_;
};

}  // namespace kvd::server
