// ShmMapping: a read-write mapping of a POSIX shared-memory segment a client created
// (CPU KV tensors of a vLLM worker). RAII: unmapped on destruction. Move-only.
//
// Nothing about the segment is trusted. The name must be "/name" or "name" with no further
// '/', no "..", at most 255 bytes. The segment is then opened and checked on the opened
// descriptor (fstat), never by name, against an access policy:
//   * it is a regular file at least as large as the client says;
//   * its owner is an allowed uid (by default only the uid kvd runs as: a client cannot make
//     kvd map memory of another user's processes);
//   * its name starts with the allowed prefix, when one is set;
//   * it is not one of kvd's own segments (the L1 pool), compared by device and inode, so
//     no alias of the name gets around it.
// Which instance maps which segment is the caller's business (SegmentId identifies one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvd::transfer {

// A segment's identity: the device and inode of the file behind it.
struct SegmentId {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const SegmentId&) const = default;
  std::string ToString() const;  // "dev:inode"
};

struct ShmAccessPolicy {
  std::vector<uint32_t> allowed_uids;  // owners accepted; empty: the effective uid of kvd
  std::string required_prefix;         // names must start with it (no leading '/'); empty: any
  std::vector<SegmentId> refused;      // never mapped for a client (kvd's own segments)
};

class ShmMapping {
 public:
  // Opens, checks (see above) and maps `nbytes` of the segment. Errors: InvalidArgument for
  // bad names, sizes, a non-file; NotFound when it does not exist; FailedPrecondition when
  // the policy refuses it (owner, prefix, kvd's own); Internal for mmap failures.
  static Result<ShmMapping> Open(const std::string& name, uint64_t nbytes,
                                 const ShmAccessPolicy& policy = {});
  ShmMapping() = default;
  ShmMapping(ShmMapping&& o) noexcept { *this = std::move(o); }
  ShmMapping& operator=(ShmMapping&& o) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  const SegmentId& id() const { return id_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string name_;
  SegmentId id_;
};

// Checks a client-supplied shared-memory name; returns the "/name" form.
Result<std::string> ValidateShmName(const std::string& name);

// The identity of the segment now behind `name` (NotFound if there is none).
Result<SegmentId> IdentifySegment(const std::string& name);

}  // namespace kvd::transfer
