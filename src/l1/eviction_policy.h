// EvictionPolicy: decides "who goes next"; the chunk table decides "where is it".
//
// The L1 table tells the policy when an entry is inserted, accessed and removed, and asks it
// for candidates in eviction order. The policy never owns memory and never decides whether an
// entry may be evicted: it proposes, the table checks locks and pins and either evicts the
// candidate (telling the policy to drop it) or skips it. Entries are opaque EntryIds to the
// policy, unique among inserted entries and stable from OnInsert until removal.
//
// Threads: not thread-safe; the table calls it under its own mutex. A policy must not call
// back into the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace kvd::l1 {

using EntryId = uintptr_t;

class EvictionPolicy {
 public:
  // What the table did with a candidate offered by ForEachCandidate.
  enum class Verdict {
    kSkip,           // keep it where it is (locked, pinned, ...), offer the next one
    kEvicted,        // the table removed it: forget it (no OnRemove follows), offer the next
    kEvictedAndStop, // as kEvicted, then stop iterating
    kStop,           // stop iterating, keep it
  };
  using Visitor = std::function<Verdict(EntryId)>;

  virtual ~EvictionPolicy() = default;

  // Precondition: `id` is not currently inserted.
  virtual void OnInsert(EntryId id) = 0;
  // A read, lookup hit, touch or write. Unknown ids are ignored.
  virtual void OnAccess(EntryId id) = 0;
  // The table removed the entry for another reason (abort, clear). Unknown ids are ignored.
  virtual void OnRemove(EntryId id) = 0;
  // Offers inserted entries, best victim first, until the visitor says stop or all were
  // offered once. The visitor may not call other methods of this policy.
  virtual void ForEachCandidate(const Visitor& visit) = 0;

  virtual size_t size() const = 0;
  virtual const char* name() const = 0;
};

// Least recently used first. OnInsert and OnAccess make an entry the most recent.
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

}  // namespace kvd::l1
