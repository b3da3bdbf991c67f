// PendingCommits: chunks whose STORE copy was handed to an asynchronous (GPU) copy engine
// and whose commit has not run yet (issue 26, item 2, "visibility").
//
// Why. A GPU engine commits a STORE's objects on its completion thread after the marker
// behind the client's event fired, so a client that saw its STORE's reply and its event
// complete may send a RETRIEVE (or its scheduler a LOOKUP) before the commit ran. Such a
// request must find the chunks, never a miss because of a commit still in flight. A LOOKUP
// or RETRIEVE that meets keys listed here therefore waits (bounded) until their commits ran
// (or failed: then they are a miss, as before), and only then probes L1.
//
// Bounds. A wait lasts at most kLookupWait (LOOKUP) or kRetrieveWait (RETRIEVE) of real
// time. A store whose client event has not fired yet (another request storing the same
// prefix) is also listed, so a lookup may wait its whole bound for it and then report a
// miss as before: the lookup bound is kept short for that reason. LOOKUPs run on the pool,
// not the socket thread, while anything is listed (ZmqServer asks any()), so a wait never
// stalls the request loop.
//
// Thread-safe: one mutex (never held with an L1 shard lock or any other lock of kvd), held
// to add, remove or test keys; waiters sleep on a condition variable under it. Holds
// (returned by Add) may be released on any thread; they keep the table alive (shared_ptr),
// so a completion may run after the table's owner is gone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "l1/chunk_key.h"

namespace kvd::server {

class PendingCommits : public std::enable_shared_from_this<PendingCommits> {
 public:
  // The longest a LOOKUP / RETRIEVE waits for commits in flight (real time). The window
  // between a GPU copy's event and its commit is the completion thread's wakeup plus the
  // commit: well under a millisecond when the thread is not behind, tens of milliseconds
  // when it is (many completions, write-behind to the tiers).
  static constexpr std::chrono::milliseconds kLookupWait{100};
  static constexpr std::chrono::milliseconds kRetrieveWait{250};

  // One store's keys, listed until Release (or destruction). Move-only.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&&) noexcept = default;
    Hold& operator=(Hold&& other) noexcept {
      Release();
      table_ = std::move(other.table_);
      keys_ = std::move(other.keys_);
      return *this;
    }
    ~Hold() { Release(); }
    // The store's commit ran (or failed): its keys are no longer pending; waiters re-check.
    void Release();

   private:
    friend class PendingCommits;
    std::shared_ptr<PendingCommits> table_;
    std::vector<l1::ChunkKey> keys_;
  };

  // Lists `keys` (a key may be listed by several stores: one per rank). The table must be
  // owned by a shared_ptr.
  Hold Add(std::vector<l1::ChunkKey> keys);

  // True while any key is listed (lock-free).
  bool any() const { return listed_.load(std::memory_order_acquire) > 0; }
  bool Contains(const l1::ChunkKey& key) const;

  // Waits until none of `keys` is listed, or `timeout` passed. Returns true when it had to
  // wait (counted in waits(); a wait that ran out of time is also counted in timeouts()).
  bool Wait(std::span<const l1::ChunkKey> keys, std::chrono::milliseconds timeout);

  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
  uint64_t timeouts() const { return timeouts_.load(std::memory_order_relaxed); }

 private:
  void Remove(std::span<const l1::ChunkKey> keys);
  bool AnyListedLocked(std::span<const l1::ChunkKey> keys) const KVD_REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar changed_;
  std::unordered_map<l1::ChunkKey, uint32_t, l1::ChunkKeyHash> keys_ KVD_GUARDED_BY(mu_);
  std::atomic<uint64_t> listed_{0};  // keys_ entries (with multiplicity)
  std::atomic<uint64_t> waits_{0}, timeouts_{0};
};

}  // namespace kvd::server
