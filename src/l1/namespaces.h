// Namespaces: interns the (model name, world size, cache salt) of chunk keys into small
// integer ids, so that an L1 entry carries 4 bytes instead of two strings, and gives every
// distinct cache salt a group id (the unit of IsolatedLRU quotas).
//
// Ids are never reused or removed. At most kMaxNamespaces namespaces and kMaxSalts salts:
// Intern then fails with ResourceExhausted (new tenants cannot be stored; existing ones keep
// working).
//
// Threads: Find, Get and the salt lookups are lock-free and may run on any thread; Intern
// takes a mutex only to add an id. A NamespaceInfo returned by Get lives as long as the
// Namespaces object and never changes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "common/status.h"
#include "l1/chunk_key.h"

namespace kvd::l1 {

struct NamespaceInfo {
  std::string model_name;
  int32_t world_size = 0;
  std::string cache_salt;
  uint16_t salt_group = 0;
};

// A lock-free-read string -> id table (ids 0, 1, 2, ... in insertion order).
class InternTable {
 public:
  explicit InternTable(uint32_t max_ids);
  ~InternTable();
  InternTable(const InternTable&) = delete;
  InternTable& operator=(const InternTable&) = delete;

  std::optional<uint32_t> Find(std::string_view key) const;
  // The id of `key`, adding it when absent; ResourceExhausted when full.
  Result<uint32_t> Intern(std::string_view key) KVD_EXCLUDES(mu_);
  // Precondition: id < size().
  const std::string& Key(uint32_t id) const;
  uint32_t size() const { return size_.load(std::memory_order_acquire); }
  uint32_t max_ids() const { return max_ids_; }

 private:
  static constexpr uint32_t kPage = 1024;
  std::optional<uint32_t> Probe(std::string_view key, uint64_t hash, uint32_t* empty) const;

  const uint32_t max_ids_;
  const uint32_t mask_;                                 // slots - 1 (slots >= 2 x max_ids)
  std::unique_ptr<std::atomic<uint32_t>[]> slots_;      // id + 1; 0 = empty
  std::unique_ptr<std::atomic<std::string*>[]> pages_;  // kPage keys per page, by id
  std::atomic<uint32_t> size_{0};
  Mutex mu_;  // serialises Intern
};

class Namespaces {
 public:
  static constexpr uint32_t kMaxNamespaces = 16384;
  static constexpr uint32_t kMaxSalts = 16384;

  Namespaces();
  ~Namespaces();

  Result<NamespaceId> Intern(std::string_view model, int32_t world_size, std::string_view salt);
  std::optional<NamespaceId> Find(std::string_view model, int32_t world_size,
                                  std::string_view salt) const;
  // Precondition: `ns` came from Intern or Find.
  const NamespaceInfo& Get(NamespaceId ns) const;
  uint32_t size() const { return table_.size(); }

  Result<uint16_t> InternSalt(std::string_view salt);
  std::optional<uint16_t> FindSalt(std::string_view salt) const;
  // Precondition: `group` came from InternSalt or FindSalt.
  const std::string& SaltOf(uint16_t group) const { return salts_.Key(group); }
  uint32_t num_salts() const { return salts_.size(); }

 private:
  InternTable table_;
  InternTable salts_;
  std::unique_ptr<std::atomic<NamespaceInfo*>[]> infos_;  // by id, set before the id is published
  Mutex mu_;  // serialises Intern (so an id's info is set before another thread can Find it)
};

}  // namespace kvd::l1
