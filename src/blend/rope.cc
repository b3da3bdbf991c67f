#include "blend/rope.h"

#include <cmath>
#include <cstring>

namespace kvd::blend {
namespace {

enum class TableDtype { kFloat32, kBFloat16, kFloat16 };

Result<TableDtype> ParseTableDtype(std::string_view d) {
  if (d == "float32" || d == "float") return TableDtype::kFloat32;
  if (d == "bfloat16") return TableDtype::kBFloat16;
  if (d == "float16" || d == "half") return TableDtype::kFloat16;
  return Status::InvalidArgument("rope cos/sin cache: dtype '" + std::string(d) +
                                 "' is not float32, bfloat16 or float16");
}

float LoadTableValue(const uint8_t* p, TableDtype d) {
  switch (d) {
    case TableDtype::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case TableDtype::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return codec::Bf16ToFloat(h);
    }
    case TableDtype::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return codec::Fp16ToFloat(h);
    }
  }
  return 0.0f;
}

// GCC contracts a * b - c * d into a fused multiply-add wherever the target has one
// (AVX-512 does): the builds below forbid it, so they all round as the portable one.
#if defined(__clang__)
#define KVD_NO_FMA
#else
#define KVD_NO_FMA __attribute__((optimize("fp-contract=off")))
#endif

KVD_NO_FMA void RotateRowsPortable(const RowBatch& b, const KRowGeometry& g) { RotateRows(b, g); }

#if defined(__x86_64__)
// flatten: every call inside (the element conversions, the window loops) is inlined and
// so compiled for the target.
KVD_NO_FMA __attribute__((target("avx2"), flatten)) void RotateRowsAvx2(const RowBatch& b,
                                                                        const KRowGeometry& g) {
  RotateRows(b, g);
}
KVD_NO_FMA __attribute__((target("avx512f,avx512bw,avx512vl"), flatten)) void RotateRowsAvx512(
    const RowBatch& b, const KRowGeometry& g) {
  RotateRows(b, g);
}
#endif

std::vector<RotateRowsBuild> DetectBuilds() {
  std::vector<RotateRowsBuild> out;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    out.push_back({"avx512", RotateRowsAvx512});
  }
  if (__builtin_cpu_supports("avx2")) out.push_back({"avx2", RotateRowsAvx2});
#endif
  out.push_back({"portable", RotateRowsPortable});
  return out;
}

}  // namespace

std::span<const RotateRowsBuild> RotateRowsBuilds() {
  static const std::vector<RotateRowsBuild> builds = DetectBuilds();
  return builds;
}

RotateRowsFn HostRotateRows() { return RotateRowsBuilds().front().fn; }

Result<KvQuant> ParseKvQuant(std::string_view name) {
  if (name.empty()) return KvQuant::kNone;
  if (name == "fp8_e4m3") return KvQuant::kFp8E4m3;
  if (name == "fp8_e5m2") return KvQuant::kFp8E5m2;
  return Status::InvalidArgument("kv_quant '" + std::string(name) +
                                 "': expected '', 'fp8_e4m3' or 'fp8_e5m2'");
}

Result<KvElem> RopeElemFor(const std::string& dtype, KvQuant quant) {
  auto conflict = [&](const char* flavour) -> Status {
    return Status::InvalidArgument("a " + dtype + " K plane contradicts kv_quant " + flavour);
  };
  if (dtype == "float32" || dtype == "float") return KvElem::kFloat32;
  if (dtype == "bfloat16") return KvElem::kBFloat16;
  if (dtype == "float16" || dtype == "half") return KvElem::kFloat16;
  if (dtype == "float8_e4m3fn") {
    if (quant == KvQuant::kFp8E5m2) return conflict("fp8_e5m2");
    return KvElem::kFp8E4m3;
  }
  if (dtype == "float8_e5m2") {
    if (quant == KvQuant::kFp8E4m3) return conflict("fp8_e4m3");
    return KvElem::kFp8E5m2;
  }
  if (dtype == "uint8") {
    if (quant == KvQuant::kFp8E4m3) return KvElem::kFp8E4m3;
    if (quant == KvQuant::kFp8E5m2) return KvElem::kFp8E5m2;
    return Status::InvalidArgument(
        "a uint8 K plane can be re-RoPE'd only when kv_quant names its fp8 flavour "
        "(fp8_e4m3 or fp8_e5m2)");
  }
  return Status::InvalidArgument("re-RoPE cannot rotate a " + dtype + " K plane");
}

const char* KvElemName(KvElem e) {
  switch (e) {
    case KvElem::kFloat32:
      return "float32";
    case KvElem::kBFloat16:
      return "bfloat16";
    case KvElem::kFloat16:
      return "float16";
    case KvElem::kFp8E4m3:
      return "fp8_e4m3";
    case KvElem::kFp8E5m2:
      return "fp8_e5m2";
  }
  return "?";
}

Result<RopeTable> RopeTable::FromCosSinCache(std::span<const uint8_t> bytes, std::string_view dtype,
                                             std::span<const int64_t> shape) {
  auto dt = ParseTableDtype(dtype);
  if (!dt.ok()) return dt.status();
  if (shape.size() != 2) {
    return Status::InvalidArgument(
        "rope cos/sin cache: expected shape [max_positions, rot_dim], "
        "got " +
        std::to_string(shape.size()) + " dimension(s)");
  }
  const int64_t positions = shape[0], rot = shape[1];
  if (positions <= 0) {
    return Status::InvalidArgument("rope cos/sin cache: max_positions " +
                                   std::to_string(positions) + " is not positive");
  }
  if (rot <= 0 || rot % 2 != 0 || rot > kMaxRotDim) {
    return Status::InvalidArgument("rope cos/sin cache: rot_dim " + std::to_string(rot) +
                                   " must be even and in [2, " + std::to_string(kMaxRotDim) + "]");
  }
  if (static_cast<uint64_t>(positions) > kMaxFloats / static_cast<uint64_t>(rot)) {
    return Status::InvalidArgument("rope cos/sin cache: " + std::to_string(positions) + " x " +
                                   std::to_string(rot) + " values exceed the limit of " +
                                   std::to_string(kMaxFloats));
  }
  const uint64_t count = static_cast<uint64_t>(positions) * static_cast<uint64_t>(rot);
  const uint64_t item = *dt == TableDtype::kFloat32 ? 4 : 2;
  if (bytes.size() != count * item) {
    return Status::InvalidArgument("rope cos/sin cache: " + std::to_string(bytes.size()) +
                                   " bytes for shape [" + std::to_string(positions) + ", " +
                                   std::to_string(rot) + "] of " + std::string(dtype) +
                                   " (expected " + std::to_string(count * item) + ")");
  }
  RopeTable t;
  t.max_positions_ = positions;
  t.rot_dim_ = rot;
  t.values_.resize(count);
  const int64_t half = rot / 2;
  double sum_sq = 0.0;
  for (uint64_t i = 0; i < count; ++i) {
    const float v = LoadTableValue(bytes.data() + i * item, *dt);
    if (!std::isfinite(v)) {
      return Status::InvalidArgument("rope cos/sin cache: value at position " +
                                     std::to_string(i / rot) + ", column " +
                                     std::to_string(i % rot) + " is not finite");
    }
    t.values_[i] = v;
    sum_sq += static_cast<double>(v) * v;
  }
  // mean over pairs of cos^2 + sin^2: the sum of squares over every value / pairs.
  const double m = std::sqrt(sum_sq / (static_cast<double>(positions) * half));
  if (!(m > 0.0)) return Status::InvalidArgument("rope cos/sin cache: every value is zero");
  // Every pair must be a rotation of the same length (up to the table's rounding): a table
  // that is not turns K by something that is not a rotation.
  const double m2 = m * m;
  for (int64_t p = 0; p < positions; ++p) {
    const float* row = t.values_.data() + p * rot;
    for (int64_t i = 0; i < half; ++i) {
      const double len2 =
          static_cast<double>(row[i]) * row[i] + static_cast<double>(row[half + i]) * row[half + i];
      if (std::fabs(len2 - m2) > kPairTolerance * m2) {
        return Status::InvalidArgument(
            "rope cos/sin cache: position " + std::to_string(p) + ", pair " + std::to_string(i) +
            " has cos^2 + sin^2 = " + std::to_string(len2) + ", the table's mean is " +
            std::to_string(m2) + "; not a rotary table [cos | sin]");
      }
    }
  }
  t.mscale_ = m;
  if (std::fabs(m - 1.0) >= kStripTolerance) {
    const float inv = static_cast<float>(1.0 / m);
    for (float& v : t.values_) v *= inv;
    t.stripped_ = true;
  }
  return t;
}

void RopeTable::Delta(int64_t p, int64_t q, float* dcos, float* dsin) const {
  const int64_t half = rot_dim_ / 2;
  const float* o = Row(p);
  const float* n = Row(q);
  for (int64_t i = 0; i < half; ++i)
    DeltaPair(o[i], o[half + i], n[i], n[half + i], dcos + i, dsin + i);
}

Status ValidateGeometry(const KRowGeometry& g, int64_t row_elems) {
  if (g.num_heads <= 0 || g.head_stride <= 0) {
    return Status::InvalidArgument("re-RoPE geometry: " + std::to_string(g.num_heads) +
                                   " head(s) of stride " + std::to_string(g.head_stride));
  }
  if (g.rot_dim <= 0 || g.rot_dim % 2 != 0) {
    return Status::InvalidArgument("re-RoPE geometry: rot_dim " + std::to_string(g.rot_dim) +
                                   " must be even and positive");
  }
  if (g.rot_offset < 0 || g.rot_offset > g.head_stride ||
      g.rot_dim > g.head_stride - g.rot_offset) {
    return Status::InvalidArgument("re-RoPE geometry: window (" + std::to_string(g.rot_offset) +
                                   ", " + std::to_string(g.rot_dim) + ") does not fit a head of " +
                                   std::to_string(g.head_stride) + " elements");
  }
  if (row_elems >= 0 && g.num_heads > row_elems / g.head_stride) {
    return Status::InvalidArgument("re-RoPE geometry: " + std::to_string(g.num_heads) + " x " +
                                   std::to_string(g.head_stride) + " elements exceed a row of " +
                                   std::to_string(row_elems));
  }
  return Status::Ok();
}

Status RotateK(const RopeTable& table, int64_t p, int64_t q, const KRowGeometry& g,
               std::span<uint8_t> row) {
  const int64_t elem = KvElemSize(g.elem);
  KVD_RETURN_IF_ERROR(ValidateGeometry(g, static_cast<int64_t>(row.size()) / elem));
  if (g.rot_dim != table.rot_dim()) {
    return Status::InvalidArgument("re-RoPE: window of " + std::to_string(g.rot_dim) +
                                   " elements, the table's rot_dim is " +
                                   std::to_string(table.rot_dim()));
  }
  for (int64_t pos : {p, q}) {
    if (pos < 0 || pos >= table.max_positions()) {
      return Status::InvalidArgument("re-RoPE: position " + std::to_string(pos) +
                                     " outside the table's [0, " +
                                     std::to_string(table.max_positions()) + ")");
    }
  }
  if (p == q) return Status::Ok();
  std::vector<float> delta(static_cast<size_t>(table.rot_dim()));
  const int64_t half = table.rot_dim() / 2;
  table.Delta(p, q, delta.data(), delta.data() + half);
  RowBatch b;
  b.src = row.data();
  b.dst = row.data();
  b.rows = 1;
  b.delta = delta.data();
  HostRotateRows()(b, g);
  return Status::Ok();
}

}  // namespace kvd::blend
