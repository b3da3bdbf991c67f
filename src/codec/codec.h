// codec: compression of one canonical KV object (layout/layout.h) for the tiers behind
// L1, independent of the server. Two codecs:
//
//   CacheGen  lossy, self-describing: per-token absmax quantization with a per-layer bin
//             schedule, optional delta-to-anchor token groups, one parametric symbol
//             distribution per (plane, channel) and a 32-lane interleaved rANS coder.
//             Encoded objects carry a versioned header (format version, layout id,
//             dtypes, sizes) and CRC32C checksums; Decode refuses anything that does not
//             check out (docs/compression.md has the byte format).
//   fp8       lmcache 0.5.6's `fp8` serde: every element cast to float8 (1 byte), no
//             header, the same bytes as lmcache's (the layout comes from the caller).
//
// An object is one or more groups back to back, each [kv_size][layers][tokens][hidden]
// in its dtype; a *plane* is one [tokens][hidden] slice (K or V of one layer).
//
// Threads: every function is reentrant and keeps no state between calls; `threads` > 1
// makes one call use that many threads, and the output never depends on it.
// Ownership: inputs are borrowed for the call; outputs are owned by the caller.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvd::codec {

// Element types of a group; the values are the format's dtype codes.
enum class Dtype : uint8_t {
  kBfloat16 = 1,
  kFloat16 = 2,
  kFloat32 = 3,
  kFloat8E4m3fn = 4,
  kFloat8E5m2 = 5,
  kUint8 = 6,
  kInt8 = 7,
};
// torch names: "bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2",
// "uint8", "int8" (also "torch.bfloat16", "half", "float").
Result<Dtype> DtypeFromName(std::string_view name);
const char* DtypeName(Dtype dtype);
uint32_t DtypeBytes(Dtype dtype);          // 0 for an unknown code
bool DtypeIsQuantizable(Dtype dtype);      // bf16, fp16, fp32: CacheGen applies

struct GroupShape {
  uint32_t kv_size = 2;   // 2: K planes then V planes; 1: one plane per layer
  uint32_t layers = 0;
  uint32_t tokens = 0;
  uint32_t hidden = 0;    // channels of a plane (heads x head_size)
  Dtype dtype = Dtype::kBfloat16;
  uint64_t Elements() const { return uint64_t{kv_size} * layers * tokens * hidden; }
  uint64_t Bytes() const { return Elements() * DtypeBytes(dtype); }
  bool operator==(const GroupShape&) const = default;
};

struct ObjectLayout {
  uint64_t layout_id = 0;          // the caller's name for the layout; kept, never interpreted
  std::vector<GroupShape> groups;  // back to back in the object
  uint64_t Bytes() const;
  // Every group has kv_size 1 or 2, non-zero sizes, a known dtype; sizes do not overflow.
  Status Validate() const;
  std::string Describe() const;    // "id 0x.. [2x6x256x128 bfloat16]"
  bool operator==(const ObjectLayout&) const = default;
};

// Bins for K (or V) layers [start_layer, end_layer). Symbols are 0..2M, M = bins/2 - 1.
struct BinSpan {
  uint32_t start_layer = 0;
  uint32_t end_layer = 0;
  uint32_t bins = 32;
  bool operator==(const BinSpan&) const = default;
};

// The layer-dependent bin schedule. A layer no span names takes the bins of the last
// span that starts at or before it (so {{0, 1, 32}} means 32 everywhere). Planes of
// kv_size-1 groups use the K schedule.
struct BinSchedule {
  std::vector<BinSpan> k;
  std::vector<BinSpan> v;
  uint32_t BinsFor(uint32_t kv, uint32_t layer) const;
  Status Validate() const;         // bins in [4, 64]; spans sorted, non-empty, start at 0
  std::string ToString() const;    // "k=0-10:32,10-:16 v=0-2:32,2-:16"
  // Parses ToString()'s form; "32" alone means 32 bins everywhere.
  static Result<BinSchedule> Parse(std::string_view text);
  // lmcache 0.5.6's schedule for a model of `layers` layers (CacheGenConfig): K 32 bins
  // for layers 0-9 and 16 after, V 32 bins for layers 0-1 and 16 after; 32 everywhere
  // for fewer than 10 layers.
  static BinSchedule Lmcache(uint32_t layers);
  static BinSchedule Uniform(uint32_t bins);
  bool operator==(const BinSchedule&) const = default;
};

struct CachegenOptions {
  BinSchedule bins = BinSchedule::Uniform(32);
  // Delta-to-anchor token groups: 0 or 1 = off; G >= 2: token t % G == 0 is an anchor
  // quantized on its own with anchor_bins, the others store their delta to the
  // reconstructed anchor, quantized with the layer's bins.
  uint32_t anchor_group = 0;
  uint32_t anchor_bins = 0;        // 0: the layer's bins
  int threads = 1;
};

// Upper bound of Encode's output for a layout (planes that would not shrink are stored
// raw, so this is the raw size plus the header, tables and checksum).
uint64_t MaxEncodedBytes(const ObjectLayout& layout);

// Encodes one object of `layout` (object.size() must equal layout.Bytes()).
Result<std::vector<uint8_t>> Encode(const ObjectLayout& layout, std::span<const uint8_t> object,
                                    const CachegenOptions& options);

struct EncodedInfo {
  uint16_t format_version = 0;
  ObjectLayout layout;
  uint64_t encoded_bytes = 0;
  uint32_t anchor_group = 0;
  std::vector<uint8_t> plane_bins;   // per plane, 0 for a plane stored raw
};

// Reads and checks the header (magic, version, header checksum, sizes) without
// decoding; encoded.size() must be the whole object.
Result<EncodedInfo> Inspect(std::span<const uint8_t> encoded);

// Decodes into `out`, which must be exactly the object's size. When `expected` is given
// the encoded layout (id, groups, dtypes) must equal it. Every size, offset and
// checksum is checked first; on error `out` may hold partial data, nothing else changes.
Status Decode(std::span<const uint8_t> encoded, std::span<uint8_t> out,
              const ObjectLayout* expected = nullptr, int threads = 1);

struct DecodedObject {
  ObjectLayout layout;
  std::vector<uint8_t> bytes;
};
Result<DecodedObject> Decode(std::span<const uint8_t> encoded, int threads = 1);

// ---- fp8 (lmcache 0.5.6 `fp8` serde) ----------------------------------------------
enum class Fp8Kind : uint8_t { kE4m3fn, kE5m2 };
// "float8_e4m3fn" (the default in lmcache) or "float8_e5m2".
Result<Fp8Kind> Fp8KindFromName(std::string_view name);
// One byte per element of every group.
uint64_t Fp8EncodedBytes(const ObjectLayout& layout);
// Every group must be bf16, fp16 or fp32. Casts round to nearest even like torch's
// .to(float8_*): e4m3fn has no infinity, so overflow and NaN become NaN (0x7f/0xff);
// e5m2 overflows to infinity.
Status Fp8Encode(const ObjectLayout& layout, std::span<const uint8_t> object, Fp8Kind kind,
                 std::span<uint8_t> out);
Status Fp8Decode(std::span<const uint8_t> encoded, const ObjectLayout& layout, Fp8Kind kind,
                 std::span<uint8_t> out);

}  // namespace kvd::codec
