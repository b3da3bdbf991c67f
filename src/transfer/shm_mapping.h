// ShmMapping: a read-write mapping of a POSIX shared-memory segment a client created
// (CPU KV tensors of a vLLM worker). RAII: unmapped on destruction. Move-only.
// The name is untrusted: only "/name" or "name" with no further '/', no "..", at most
// 255 bytes, is opened, and the segment must be at least as large as the client says.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace kvd::transfer {

class ShmMapping {
 public:
  static Result<ShmMapping> Open(const std::string& name, uint64_t nbytes);
  ShmMapping() = default;
  ShmMapping(ShmMapping&& o) noexcept { *this = std::move(o); }
  ShmMapping& operator=(ShmMapping&& o) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string name_;
};

// Checks a client-supplied shared-memory name; returns the "/name" form.
Result<std::string> ValidateShmName(const std::string& name);

}  // namespace kvd::transfer
