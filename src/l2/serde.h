// Serde: how an L1 object's bytes become a tier's stored bytes and back (compression,
// quantisation). The default, "none", stores the object bytes unchanged — the only form
// lmcache 0.5.6 writes without a `serde` block — and lets tiers read straight into L1.
//
// An adapter's JSON may carry `"serde": {"type": "<name>", ...}` (lmcache's key). MakeSerde
// builds the named serde or refuses an unknown name in one line; other modules (src/codec)
// add their types to the table in serde.cc.
//
// Threads: a Serde is immutable after creation; Encode/Decode may run concurrently on any
// thread. Buffers are borrowed for the call only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace kvd::l2 {

// What an object's bytes are: kernel groups back to back, each
// [kv_size][layers][tokens][hidden] elements of `dtype` (see docs/layouts.md).
struct ObjectLayout {
  struct Group {
    std::string dtype;      // torch name, e.g. "bfloat16"
    int64_t itemsize = 0;   // bytes per element
    int64_t kv_size = 0;
    int64_t layers = 0;
    int64_t tokens = 0;
    int64_t hidden = 0;
    uint64_t bytes() const {
      return static_cast<uint64_t>(itemsize * kv_size * layers * tokens * hidden);
    }
  };
  std::vector<Group> groups;
  uint64_t bytes = 0;       // sum of the groups' bytes: the L1 object size
};

class Serde {
 public:
  virtual ~Serde() = default;
  virtual std::string_view name() const = 0;
  // True when stored bytes are the object bytes (no buffer, no work).
  virtual bool identity() const { return false; }
  // Upper bound of the stored size of one object of `layout`.
  virtual uint64_t MaxStoredBytes(const ObjectLayout& layout) const = 0;
  // raw (layout.bytes bytes) → stored form in `out` (at least MaxStoredBytes); returns the
  // stored size.
  virtual Result<uint64_t> Encode(std::span<const uint8_t> raw, const ObjectLayout& layout,
                                  std::span<uint8_t> out) const = 0;
  // stored → raw; `raw` is exactly layout.bytes. A stored form that does not decode to this
  // layout is an error (the object is then treated as a miss), never garbage.
  virtual Status Decode(std::span<const uint8_t> stored, const ObjectLayout& layout,
                        std::span<uint8_t> raw) const = 0;
};

// `spec` is the adapter's "serde" object, or null (no serde block): "none".
// InvalidArgument names an unknown type: "serde type 'x' is not supported (known: none)".
Result<std::shared_ptr<const Serde>> MakeSerde(const nlohmann::json* spec);

// The type names MakeSerde knows, for messages and docs.
std::vector<std::string> KnownSerdeTypes();

}  // namespace kvd::l2
