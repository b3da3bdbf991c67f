// Tier: one storage back-end behind L1 — a local directory (fs, fs_native), one Redis/Valkey
// server (resp, valkey), or a Redis/Valkey Cluster (valkey with cluster_mode). Tiers store
// and load whole objects by ObjectKey; they know nothing of L1, sessions or the wire.
//
// ASYNCHRONOUS CONTRACT. Every operation takes a batch and returns at once; `done` is called
// exactly once per call with one ItemResult per item, in item order, on a thread of the tier
// (never inside the call, except after Close(), when every call answers Unavailable inline).
// Batches may complete in any order relative to each other. `done` must not block for long:
// it runs on the tier's I/O thread.
//
// BUFFERS. StoreItem::data and LoadItem::dst are borrowed: the caller keeps them valid and
// unchanged (store) or unused (load) until `done` runs.
//
// RESULTS (ItemResult::status):
//   Store   OK: the object is in the tier (bytes = bytes written; 0 if it was already
//           there — objects are immutable, the first writer wins).
//           ResourceExhausted: no space. Unavailable: the back-end cannot be reached.
//   Exists  OK: present (bytes = stored size when the back-end tells it cheaply, else 0).
//           NotFound: absent.
//   Load    OK: dst holds the object (bytes = stored size). NotFound: absent.
//           Internal: present but not `size` bytes long (truncated, longer, corrupted): the
//           caller counts it and treats it as a miss; never partial data reported as OK.
//           With LoadItem::size_is_capacity the stored object may be shorter than `size`.
//   Delete  OK (bytes = bytes freed, 0 if absent).
// Any op may also answer Unavailable / Internal for back-end errors.
//
// THREADS. All methods are thread-safe. Close() stops accepting work, waits for running
// batches to answer, and is idempotent; the destructor calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "l2/object_key.h"

namespace kvd::l2 {

struct StoreItem {
  ObjectKey key;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

struct LoadItem {
  ObjectKey key;
  uint8_t* dst = nullptr;
  uint64_t size = 0;                // exact object size expected...
  bool size_is_capacity = false;    // ...or only the room in dst (variable-size stored forms)
};

struct ItemResult {
  Status status;
  uint64_t bytes = 0;
};

// One object found by Scan.
struct ScannedObject {
  ObjectKey key;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;  // last write (fs) or 0 when the back-end does not say
};

// Connection / device health for /status and the dashboard.
struct TierHealth {
  bool healthy = true;
  std::string detail;  // e.g. "connected to 3 masters", "127.0.0.1:6379: connection refused"
};

class Tier {
 public:
  using Done = std::function<void(std::vector<ItemResult>)>;
  using ScanDone = std::function<void(Result<std::vector<ScannedObject>>)>;

  virtual ~Tier() = default;

  // The adapter type as configured ("fs", "fs_native", "resp", "valkey", ...).
  virtual std::string_view type() const = 0;
  // One line naming the back-end, for logs and /status (no credentials).
  virtual std::string Describe() const = 0;

  virtual void Store(std::vector<StoreItem> items, Done done) = 0;
  virtual void Exists(std::vector<ObjectKey> keys, Done done) = 0;
  virtual void Load(std::vector<LoadItem> items, Done done) = 0;
  virtual void Delete(std::vector<ObjectKey> keys, Done done) = 0;
  // Every object the tier holds that parses as an ObjectKey (objects of earlier runs and of
  // other servers included), for capacity accounting and eviction.
  virtual void Scan(ScanDone done) = 0;

  virtual TierHealth Health() const = 0;
  virtual void Close() = 0;

  // False for a tier that only loads what others hold (P2P's peer tier, p2p/peer_tier.h):
  // store-behind passes it by, so it is never asked to Store.
  virtual bool stores() const { return true; }
};

}  // namespace kvd::l2
