// fp8: lmcache 0.5.6's `fp8` serde (codec.h). Elementwise casts, no header: the encoded
// object is one byte per element of every group, in object order.
#include <cstring>

#include "codec/codec.h"
#include "codec/float_bits.h"

namespace kvd::codec {
namespace {

Status CheckFp8Layout(const ObjectLayout& layout) {
  KVD_RETURN_IF_ERROR(layout.Validate());
  for (size_t i = 0; i < layout.groups.size(); ++i) {
    if (!DtypeIsQuantizable(layout.groups[i].dtype)) {
      return Status::InvalidArgument("fp8: group " + std::to_string(i) + " is " +
                                     DtypeName(layout.groups[i].dtype) +
                                     "; only bfloat16, float16 and float32 objects can be cast to fp8");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Fp8Kind> Fp8KindFromName(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (name == "float8_e4m3fn") return Fp8Kind::kE4m3fn;
  if (name == "float8_e5m2") return Fp8Kind::kE5m2;
  return Status::InvalidArgument("fp8: unknown fp8_dtype '" + std::string(name) +
                                 "' (float8_e4m3fn or float8_e5m2)");
}

uint64_t Fp8EncodedBytes(const ObjectLayout& layout) {
  uint64_t n = 0;
  for (const auto& g : layout.groups) n += g.Elements();
  return n;
}

Status Fp8Encode(const ObjectLayout& layout, std::span<const uint8_t> object, Fp8Kind kind,
                 std::span<uint8_t> out) {
  KVD_RETURN_IF_ERROR(CheckFp8Layout(layout));
  if (object.size() != layout.Bytes()) {
    return Status::InvalidArgument("fp8: object is " + std::to_string(object.size()) + " bytes, layout says " +
                                   std::to_string(layout.Bytes()));
  }
  if (out.size() < Fp8EncodedBytes(layout)) {
    return Status::InvalidArgument("fp8: output buffer too small");
  }
  const bool e4m3 = kind == Fp8Kind::kE4m3fn;
  const uint8_t* src = object.data();
  uint8_t* dst = out.data();
  for (const auto& g : layout.groups) {
    const uint64_t n = g.Elements();
    switch (g.dtype) {
      case Dtype::kBfloat16:
        for (uint64_t i = 0; i < n; ++i) {
          uint16_t h;
          memcpy(&h, src + 2 * i, 2);
          dst[i] = FloatToFp8(Bf16ToFloat(h), e4m3);
        }
        break;
      case Dtype::kFloat16:
        for (uint64_t i = 0; i < n; ++i) {
          uint16_t h;
          memcpy(&h, src + 2 * i, 2);
          dst[i] = FloatToFp8(Fp16ToFloat(h), e4m3);
        }
        break;
      default:  // kFloat32 (checked above)
        for (uint64_t i = 0; i < n; ++i) {
          float f;
          memcpy(&f, src + 4 * i, 4);
          dst[i] = FloatToFp8(f, e4m3);
        }
        break;
    }
    src += g.Bytes();
    dst += n;
  }
  return Status::Ok();
}

Status Fp8Decode(std::span<const uint8_t> encoded, const ObjectLayout& layout, Fp8Kind kind,
                 std::span<uint8_t> out) {
  KVD_RETURN_IF_ERROR(CheckFp8Layout(layout));
  if (encoded.size() != Fp8EncodedBytes(layout)) {
    return Status::InvalidArgument("fp8: encoded object is " + std::to_string(encoded.size()) +
                                   " bytes, the layout needs " + std::to_string(Fp8EncodedBytes(layout)));
  }
  if (out.size() != layout.Bytes()) return Status::InvalidArgument("fp8: output buffer is not the object's size");
  const bool e4m3 = kind == Fp8Kind::kE4m3fn;
  // All 256 values once; each element is then a table lookup.
  float table[256];
  for (int v = 0; v < 256; ++v) table[v] = Fp8ToFloat(static_cast<uint8_t>(v), e4m3);
  const uint8_t* src = encoded.data();
  uint8_t* dst = out.data();
  for (const auto& g : layout.groups) {
    const uint64_t n = g.Elements();
    switch (g.dtype) {
      case Dtype::kBfloat16:
        for (uint64_t i = 0; i < n; ++i) {
          const uint16_t h = FloatToBf16(table[src[i]]);
          memcpy(dst + 2 * i, &h, 2);
        }
        break;
      case Dtype::kFloat16:
        for (uint64_t i = 0; i < n; ++i) {
          const uint16_t h = FloatToFp16(table[src[i]]);
          memcpy(dst + 2 * i, &h, 2);
        }
        break;
      default:
        for (uint64_t i = 0; i < n; ++i) memcpy(dst + 4 * i, &table[src[i]], 4);
        break;
    }
    src += n;
    dst += g.Bytes();
  }
  return Status::Ok();
}

}  // namespace kvd::codec
