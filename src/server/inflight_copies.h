// InFlightCopies: asynchronous engine copies (STORE gathers, RETRIEVE scatters on a GPU
// engine) that were submitted and have not reported completion yet, each with the time by
// which it should have completed (the write TTL for stores, the read TTL for retrieves).
// The memory of such a copy stays held by its completion however long it takes (l1_cache.h,
// COPY IN FLIGHT); this table lets the server notice copies that outlive their deadline and
// cancel their instance (KvdCopyTransfers::CancelOverdueCopies).
//
// Thread-safe: one mutex, held only to insert, erase or scan. Completions (engine threads)
// remove their entries; they hold the table by shared_ptr, so it outlives its owner.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/mutex.h"

namespace kvd::server {

struct Instance;

class InFlightCopies {
 public:
  using Id = uint64_t;  // never 0

  Id Add(const std::shared_ptr<const Instance>& instance, bool store, int64_t deadline_ns);
  void Remove(Id id);

  // Copies past their deadline at `now` that were not reported before, at most one per
  // instance (the oldest); they stay in the table until their completion removes them.
  struct Overdue {
    int64_t instance_id = 0;
    std::shared_ptr<const Instance> instance;  // null when the instance is gone already
    bool store = false;
    int64_t overdue_ns = 0;
  };
  std::vector<Overdue> TakeOverdue(int64_t now);

  // True while a copy of this instance is in the table.
  bool HasCopiesOf(const Instance* instance) const;
  size_t size() const;

 private:
  struct Copy {
    std::weak_ptr<const Instance> instance;
    const Instance* key = nullptr;  // identity only, never dereferenced
    int64_t instance_id = 0;
    bool store = false;
    int64_t deadline_ns = 0;
    bool reported = false;
  };
  mutable Mutex mu_;
  Id next_ KVD_GUARDED_BY(mu_) = 1;
  std::map<Id, Copy> copies_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd::server
