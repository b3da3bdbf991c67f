// Fuzz target "cachegen": the CacheGen decoder (codec.h Inspect / Decode).
//
// The first input byte picks a mode:
//   0  the rest is an encoded object, decoded as it is (the checksums stop most inputs
//      early: this covers the header parser and the checksum paths);
//   1  the same, but both checksums are recomputed first, so the table, payload and
//      rANS stream checks see the damage;
//   2  the next bytes describe a small object (shape, dtype, bins, anchors) and its
//      values; it is encoded, must round-trip within its quantization error, and is
//      then damaged at positions the remaining bytes choose, checksums recomputed, and
//      decoded again.
// Invariants (abort = a finding): Decode never crashes, reads or writes out of bounds
// (ASan), or allocates more than the limit below; every quantized plane of a successful
// decode holds only finite values (raw planes are copied as they are); an undamaged
// round trip succeeds; the GPU decoder's CPU reference (device_decode.h: the host checks
// and the emulated warp kernel) gives the same verdict as Decode on every input and, on
// success, the same bytes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "codec/crc32c.h"
#include "codec/device_decode.h"
#include "codec/float_bits.h"
#include "codec/format.h"

namespace {

using namespace kvd::codec;  // NOLINT

void Require(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "cachegen fuzzer: invariant violated: %s\n", what);
    abort();
  }
}

void FixChecksums(std::vector<uint8_t>* b) {
  if (b->size() < format::kHeaderBytes + format::kTrailerBytes) return;
  const uint32_t ngroups = format::Get32(b->data() + 32);
  const uint32_t nplanes = format::Get32(b->data() + 36);
  const uint64_t tables = format::kHeaderBytes + uint64_t{ngroups} * format::kGroupEntryBytes +
                          uint64_t{nplanes} * format::kPlaneEntryBytes;
  if (tables <= b->size()) {
    format::Put32(b->data() + 44, 0);
    format::Put32(b->data() + 44, Crc32c(b->data(), tables));
  }
  format::Put32(b->data() + b->size() - 4, Crc32c(b->data(), b->size() - 4));
}

// True when every value of the object (or, with plane_bins, of every plane that was
// quantized: raw planes are copied verbatim, whatever they hold) is finite.
bool AllFinite(const ObjectLayout& l, const std::vector<uint8_t>& out,
               const std::vector<uint8_t>* plane_bins = nullptr) {
  const uint8_t* p = out.data();
  size_t plane = 0;
  for (const auto& g : l.groups) {
    const uint64_t n = g.Elements();
    const uint64_t per_plane = uint64_t{g.tokens} * g.hidden;
    for (uint64_t i = 0; i < n; ++i) {
      if (plane_bins && (*plane_bins)[plane + i / per_plane] == 0) continue;
      float v = 0;
      uint16_t h;
      switch (g.dtype) {
        case Dtype::kBfloat16: memcpy(&h, p + 2 * i, 2); v = Bf16ToFloat(h); break;
        case Dtype::kFloat16: memcpy(&h, p + 2 * i, 2); v = Fp16ToFloat(h); break;
        case Dtype::kFloat32: memcpy(&v, p + 4 * i, 4); break;
        default: break;
      }
      if (!std::isfinite(v)) return false;
    }
    p += g.Bytes();
    plane += uint64_t{g.kv_size} * g.layers;
  }
  return true;
}

// Decodes with the caller-knows-the-size API (as a tier does) when the header is
// plausible, so no input can make the fuzzer allocate more than kMaxRaw.
constexpr uint64_t kMaxRaw = 64u << 20;

void DecodeChecked(const std::vector<uint8_t>& enc, bool planes_were_finite) {
  auto info = Inspect(enc);
  if (!info.ok()) {
    std::vector<uint8_t> none;
    Require(!Decode(enc, none).ok(), "Decode accepted what Inspect refused");
    Require(!PrepareDeviceDecode(enc).ok(), "the device decoder accepted what Inspect refused");
    return;
  }
  Require(info->layout.Validate().ok(), "Inspect returned an invalid layout");
  if (info->layout.Bytes() > kMaxRaw) return;
  std::vector<uint8_t> out(info->layout.Bytes());
  const kvd::Status st = Decode(enc, out, &info->layout);
  std::vector<uint8_t> emu(out.size());
  const kvd::Status est = EmulateDeviceDecode(enc, emu);
  Require(est.ok() == st.ok(), "the device decoder and Decode disagree on whether an object is valid");
  if (st.ok()) Require(emu == out, "the device decoder decoded other bytes than Decode");
  if (st.ok() && planes_were_finite) {
    Require(AllFinite(info->layout, out, &info->plane_bins), "a quantized plane decoded to a non-finite value");
  }
}

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t Byte() { return i_ < n_ ? d_[i_++] : 0; }
  size_t left() const { return n_ - i_; }
 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  if (mode < 2) {
    std::vector<uint8_t> enc(data + 1, data + size);
    if (mode == 1) FixChecksums(&enc);
    DecodeChecked(enc, /*planes_were_finite=*/true);
    return 0;
  }
  Reader r(data + 1, size - 1);
  ObjectLayout l;
  l.layout_id = r.Byte();
  GroupShape g;
  g.kv_size = 1 + r.Byte() % 2;
  g.layers = 1 + r.Byte() % 3;
  g.tokens = 1 + r.Byte() % 80;
  g.hidden = 1 + r.Byte() % 100;
  const Dtype dts[3] = {Dtype::kBfloat16, Dtype::kFloat16, Dtype::kFloat32};
  g.dtype = dts[r.Byte() % 3];
  l.groups.push_back(g);
  CachegenOptions o;
  o.bins = BinSchedule::Uniform(4 + r.Byte() % 61);
  const uint8_t a = r.Byte();
  if (a % 2) {
    o.anchor_group = 2 + a % 17;
    o.anchor_bins = 4 + r.Byte() % 61;
  }
  o.threads = 1;
  // Values: input bytes scaled by a per-object magnitude (finite by construction).
  const float mag = std::ldexp(1.0f, static_cast<int>(r.Byte() % 40) - 20);
  std::vector<uint8_t> obj(l.Bytes());
  const uint32_t isz = DtypeBytes(g.dtype);
  for (uint64_t i = 0; i < g.Elements(); ++i) {
    const float v = (static_cast<int>(r.Byte()) - 128) * mag;
    if (g.dtype == Dtype::kBfloat16) {
      const uint16_t h = FloatToBf16(v);
      memcpy(&obj[i * isz], &h, 2);
    } else if (g.dtype == Dtype::kFloat16) {
      const uint16_t h = FloatToFp16(v);
      memcpy(&obj[i * isz], &h, 2);
    } else {
      memcpy(&obj[i * isz], &v, 4);
    }
  }
  auto enc = Encode(l, obj, o);
  Require(enc.ok(), "Encode refused a valid object");
  std::vector<uint8_t> out(obj.size());
  Require(Decode(*enc, out, &l).ok(), "an undamaged object did not decode");
  // fp16 overflow of +-128 * 2^19 makes infinities: only check finiteness when the
  // input was finite.
  const bool finite = AllFinite(l, obj);
  if (finite) Require(AllFinite(l, out), "round trip produced a non-finite value");
  // Damage: (position, xor) pairs from the rest of the input.
  std::vector<uint8_t> bad = *enc;
  while (r.left() >= 3) {
    const size_t pos = (size_t{r.Byte()} << 8 | r.Byte()) % bad.size();
    bad[pos] ^= r.Byte() | 1;
  }
  FixChecksums(&bad);
  DecodeChecked(bad, finite);
  return 0;
}
