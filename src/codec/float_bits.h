// float_bits: conversions between float32 and the 16-bit and 8-bit float formats the
// codec reads and writes, bit-exact with torch's casts (round to nearest even). Pure
// functions, header-only (the CUDA decoder includes it).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVD_FB_HD __host__ __device__
#else
#define KVD_FB_HD
#endif

namespace kvd::codec {

KVD_FB_HD inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KVD_FB_HD inline float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

KVD_FB_HD inline float Bf16ToFloat(uint16_t h) { return BitsFloat(uint32_t{h} << 16); }

// Round to nearest even; NaN becomes the canonical quiet NaN 0x7fc0 (as torch does).
KVD_FB_HD inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The smallest bf16 >= f, for finite f >= 0 (a scale that bounds |x| from above).
KVD_FB_HD inline uint16_t FloatToBf16Up(float f) {
  const uint32_t u = FloatBits(f);
  return static_cast<uint16_t>((u >> 16) + ((u & 0xffffu) != 0 ? 1u : 0u));
}

KVD_FB_HD inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return BitsFloat(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return BitsFloat(sign | ((112u - static_cast<uint32_t>(e)) << 23) | (man << 13));
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even, overflow to infinity, NaN stays NaN (quiet, sign and top
// payload bits kept), as the F16C instruction and torch do.
KVD_FB_HD inline uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (a < 0x38800000u) {  // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;  // below 2^-25: rounds to 0
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    const uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

// float32 -> 8-bit float with `man_bits` mantissa bits and exponent bias `bias`, round
// to nearest even. e4m3fn (3, 7): saturates to +-448 (torch's cast), NaN -> sign|0x7f.
// e5m2 (2, 15): overflow to infinity, NaN -> sign|0x7f.
KVD_FB_HD inline uint8_t FloatToFp8(float f, bool e4m3fn) {
  const uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  const int man_bits = e4m3fn ? 3 : 2;
  const int bias = e4m3fn ? 7 : 15;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const uint8_t max_finite = e4m3fn ? 0x7eu : 0x7bu;
  const uint8_t overflow = e4m3fn ? 0x7eu : 0x7cu;
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | overflow);
  const int e = static_cast<int>(a >> 23) - 127;  // unbiased exponent of a normal float
  const uint32_t m = (a & 0x7fffffu) | (a >= 0x00800000u ? 0x800000u : 0u);
  // The fp8 value's exponent field, and how many of the float's 24 significant bits
  // stay (normal results keep 1 + man_bits, subnormals fewer).
  int fe = e + bias;
  int drop;
  if (fe >= 1) {
    drop = 23 - man_bits;
  } else {
    drop = 23 - man_bits + (1 - fe);
    fe = 0;
    if (drop > 24) return sign;  // far below the smallest subnormal
  }
  uint32_t q = m >> drop;
  const uint32_t rem = m & ((1u << drop) - 1u);
  const uint32_t half = 1u << (drop - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  // q holds the implicit bit (for normals) plus mantissa; assemble and let a carry
  // into the exponent happen naturally.
  uint32_t bits;
  if (fe == 0) {
    bits = q;  // subnormal (a carry makes it the smallest normal, which is correct)
  } else {
    bits = (static_cast<uint32_t>(fe) << man_bits) + (q - (1u << man_bits));
  }
  if (bits > max_finite) return static_cast<uint8_t>(sign | overflow);
  return static_cast<uint8_t>(sign | bits);
}

KVD_FB_HD inline float Fp8ToFloat(uint8_t v, bool e4m3fn) {
  const uint32_t sign = uint32_t{v & 0x80u} << 24;
  const int man_bits = e4m3fn ? 3 : 2;
  const int bias = e4m3fn ? 7 : 15;
  const uint32_t exp = (v & 0x7fu) >> man_bits;
  const uint32_t man = v & ((1u << man_bits) - 1u);
  if (e4m3fn) {
    if ((v & 0x7fu) == 0x7fu) return BitsFloat(sign | 0x7fc00000u);
  } else if (exp == 0x1f) {
    return BitsFloat(sign | 0x7f800000u | (man != 0 ? 0x400000u | (man << (23 - man_bits)) : 0u));
  }
  if (exp == 0) {
    // man * 2^(1 - bias - man_bits), exact in float.
    const float scale = BitsFloat(static_cast<uint32_t>(127 + 1 - bias - man_bits) << 23);
    return BitsFloat(sign | FloatBits(static_cast<float>(man) * scale));
  }
  return BitsFloat(sign | ((exp + 127u - static_cast<uint32_t>(bias)) << 23) |
                   (man << (23 - man_bits)));
}

}  // namespace kvd::codec
