// Re-RoPE for CacheBlend: an engine's rotary table, validated and kept in fp32, and the
// rotation of a stored K row from the position it was computed at to the position it is
// reused at. The arithmetic itself is in rope_math.h (shared with a CUDA kernel).
//
// RopeTable is built once per registered cos/sin cache (cb_register_rope) from bytes the
// engine sent: vLLM's layout [max_positions, rot_dim], row `pos` = rot_dim/2 cosines then
// rot_dim/2 sines, in float32, bfloat16 or float16. Nothing about the input is trusted:
// shape, size, dtype, finiteness and the length of every (cos, sin) pair are checked. A
// YaRN / longrope magnitude m = sqrt(mean(cos^2 + sin^2)) is divided out when
// |m - 1| >= 1e-3, so that the table is a pure rotation (rope_math.h's delta would cancel
// it anyway; stripping keeps the table's values meaningful on their own).
//
// Threads: a RopeTable is immutable after FromCosSinCache; share it (by const reference
// or shared_ptr) across threads freely. The free functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blend/rope_math.h"
#include "common/status.h"

namespace kvd::blend {

// fp8 flavour of a K plane that the engine registers as uint8 (vLLM's fp8 KV cache).
enum class KvQuant : uint8_t { kNone, kFp8E4m3, kFp8E5m2 };

// "" → kNone, "fp8_e4m3", "fp8_e5m2"; anything else is refused.
Result<KvQuant> ParseKvQuant(std::string_view name);

// The element type re-RoPE works in for a kernel group of torch dtype `dtype`: float32,
// bfloat16, float16, float8_e4m3fn, float8_e5m2 as themselves; uint8 only with a
// kv_quant flavour. Refused: other dtypes, and a float8 dtype that contradicts kv_quant.
Result<KvElem> RopeElemFor(const std::string& dtype, KvQuant quant);

const char* KvElemName(KvElem e);

class RopeTable {
 public:
  // Limits on what an engine may register (a 1M-position, 128-wide table is 512 MiB).
  static constexpr int64_t kMaxRotDim = 4096;
  static constexpr uint64_t kMaxFloats = uint64_t{1} << 28;  // 1 GiB of fp32
  static constexpr double kStripTolerance = 1e-3;            // |m - 1| at or above: m divided out
  static constexpr double kPairTolerance = 0.02;             // allowed |cos^2+sin^2 - m^2| / m^2

  // `bytes` is the whole table, contiguous, row-major: exactly
  // shape[0] * shape[1] * sizeof(dtype) bytes. `shape` must be [max_positions, rot_dim]
  // with rot_dim even and positive. `dtype` is a torch dtype name.
  static Result<RopeTable> FromCosSinCache(std::span<const uint8_t> bytes, std::string_view dtype,
                                           std::span<const int64_t> shape);

  int64_t max_positions() const { return max_positions_; }
  int64_t rot_dim() const { return rot_dim_; }
  // The magnitude measured in the engine's table, and whether it was divided out.
  double mscale() const { return mscale_; }
  bool mscale_stripped() const { return stripped_; }

  // rot_dim/2 cosines, then rot_dim/2 sines, of position `pos` in [0, max_positions).
  const float* Row(int64_t pos) const { return values_.data() + pos * rot_dim_; }

  // The delta of every pair for p → q (rope_math.h): rot_dim/2 values each into dcos
  // and dsin. p and q must be in [0, max_positions).
  void Delta(int64_t p, int64_t q, float* dcos, float* dsin) const;

 private:
  RopeTable() = default;
  int64_t max_positions_ = 0;
  int64_t rot_dim_ = 0;
  double mscale_ = 1.0;
  bool stripped_ = false;
  std::vector<float> values_;  // [max_positions][rot_dim], fp32
};

// Checks a row geometry: heads > 0, rot_dim > 0 and even, the window inside each head
// (rot_offset >= 0, rot_offset + rot_dim <= head_stride), and a row of at most
// `row_elems` elements when row_elems >= 0.
Status ValidateGeometry(const KRowGeometry& g, int64_t row_elems = -1);

// rope_math.h's RotateRows, built for several instruction sets: AVX-512 (F, BW, VL) and
// AVX2 where the CPU has them, and the portable build. Every build does the same IEEE
// operations (products and sums rounded apart, never fused), so all write identical bytes.
// HostRotateRows is the best one this CPU runs, chosen once per process.
using RotateRowsFn = void (*)(const RowBatch& batch, const KRowGeometry& g);
struct RotateRowsBuild {
  const char* name;
  RotateRowsFn fn;
};
// The builds this CPU can run, best first; the last is the portable one.
std::span<const RotateRowsBuild> RotateRowsBuilds();
RotateRowsFn HostRotateRows();

// Turns one token's K row (row_bytes() bytes, in place) from position p to position q.
// p == q leaves every byte as it is. Errors: a geometry that does not fit the row, a
// rot_dim that differs from the table's, a position outside the table.
Status RotateK(const RopeTable& table, int64_t p, int64_t q, const KRowGeometry& g,
               std::span<uint8_t> row);

}  // namespace kvd::blend
