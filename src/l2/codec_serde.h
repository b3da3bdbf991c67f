// The codec's serdes for the tiers (src/codec): "cachegen" and "fp8", built by MakeSerde
// (serde.h) from an adapter's `"serde": {...}` object.
//
//   {"type": "fp8", "fp8_dtype": "float8_e4m3fn" | "float8_e5m2", "max_workers": N}
//       lmcache 0.5.6's fp8 serde: one byte per element, the same bytes lmcache writes
//       (max_workers is accepted for compatibility; the tier's workers do the work).
//   {"type": "cachegen", "bins": "lmcache" | N | "k=0-10:32,10-:16 v=0-2:32,2-:16",
//    "anchor_group": G, "anchor_bins": B, "threads": N}
//       kvd's CacheGen format (docs/compression.md); "lmcache" (the default) is lmcache's
//       bin schedule for the object's layer count. Objects of dtypes CacheGen does not
//       quantize (fp8, uint8 pages) are stored raw inside the format.
// Unknown keys are refused by name. Both serdes are immutable and thread-safe.
#pragma once

#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "l2/serde.h"

namespace kvd::l2 {

Result<std::shared_ptr<const Serde>> MakeCachegenSerde(const nlohmann::json& spec);
Result<std::shared_ptr<const Serde>> MakeFp8Serde(const nlohmann::json& spec);

}  // namespace kvd::l2
