// Host side of the GPU decoder (device_decode.h): the plan, and the emulator of the
// kernel's warp algorithm.
#include "codec/device_decode.h"

#include <cstring>

#include "codec/crc32c.h"
#include "codec/format.h"
#include "codec/plane.h"

namespace kvd::codec {

Result<DevicePlan> PrepareDeviceDecode(std::span<const uint8_t> encoded) {
  auto hr = format::ReadHeader(encoded);
  if (!hr.ok()) return hr.status();
  const format::Header& h = *hr;
  DevicePlan plan;
  plan.layout.layout_id = h.layout_id;
  plan.layout.groups = h.groups;
  // Everything Decode checks is checked here by decoding on the CPU into scratch: the
  // GPU then only ever sees an object the host has verified (no device-side parsing of
  // untrusted lengths).
  std::vector<uint8_t> scratch(h.raw_bytes);
  KVD_RETURN_IF_ERROR(Decode(encoded, scratch, nullptr, 1));
  uint64_t at = h.TablesEnd(), raw_at = 0;
  size_t pi = 0;
  for (const auto& g : h.groups) {
    const uint64_t plane_bytes = uint64_t{g.tokens} * g.hidden * DtypeBytes(g.dtype);
    for (uint32_t p = 0; p < g.kv_size * g.layers; ++p, ++pi) {
      const auto& e = h.planes[pi];
      if (e.mode == format::PlaneMode::kRaw) {
        plan.copies.push_back({at, raw_at, plane_bytes});
      } else {
        const plane::PlaneSpec sp = plane::PlaneSpecOf(g, e, h);
        const uint64_t fixed = plane::FixedBytes(sp);
        const uint32_t S = sp.Streams();
        uint64_t s_at = at + fixed;
        for (uint32_t s = 0; s < S; ++s) {
          warp::StreamJob j{};
          j.stream_bytes = format::Get32(encoded.data() + at + fixed - 4 * uint64_t{S} + 4 * s);
          j.stream_offset = s_at;
          s_at += j.stream_bytes;
          j.scales_offset = at;
          j.params_offset[0] = at + 2 * uint64_t{g.tokens};
          j.params_offset[1] = j.params_offset[0] + 2 * uint64_t{g.hidden};
          j.out_offset = raw_at;
          j.tokens = g.tokens;
          j.channels = g.hidden;
          j.c0 = s * sp.stream_channels;
          j.c1 = std::min<uint32_t>(g.hidden, j.c0 + sp.stream_channels);
          j.anchor_group = sp.anchors() ? sp.anchor_group : 0;
          j.dtype = static_cast<uint8_t>(g.dtype);
          const uint32_t bins[2] = {sp.bins, sp.anchors() ? sp.anchor_bins : sp.bins};
          for (int k = 0; k < 2; ++k) {
            j.levels[k] = static_cast<uint8_t>(plane::Levels(bins[k]));
            j.alphabet[k] = static_cast<uint8_t>(plane::Alphabet(bins[k]));
            j.prob_bits[k] = static_cast<uint8_t>(plane::ProbBits(sp, k));
          }
          plan.jobs.push_back(j);
        }
      }
      at += e.payload_bytes;
      raw_at += plane_bytes;
    }
  }
  return plan;
}

bool EmulateWarp(const uint8_t* enc, const warp::StreamJob& j, uint8_t* out) {
  uint32_t x[32];
  float recon[32] = {};
  uint16_t cum[2][32][kMaxAlphabet + 1];
  for (int l = 0; l < 32; ++l) x[l] = warp::Load32(enc + j.stream_offset + 4 * l);
  const uint8_t* w = enc + j.stream_offset + 128;
  const uint8_t* end = enc + j.stream_offset + j.stream_bytes;
  const int classes = j.anchor_group ? 2 : 1;
  for (uint32_t cb = j.c0; cb < j.c1; cb += 32) {
    const int lanes = static_cast<int>(j.c1 - cb < 32 ? j.c1 - cb : 32);
    for (int k = 0; k < classes; ++k) {
      for (int l = 0; l < lanes; ++l) {
        const uint8_t* prm = enc + j.params_offset[k] + 2 * uint64_t{cb + l};
        if (!warp::BuildCum(prm[0], prm[1], j.alphabet[k], j.prob_bits[k], cum[k][l])) return false;
      }
    }
    for (uint32_t t = 0; t < j.tokens; ++t) {
      const bool anchor = j.anchor_group && t % j.anchor_group == 0;
      const int k = anchor ? 1 : 0;
      const float step = warp::TokenStep(enc, j, t, k);
      // Every lane decodes; then the needing lanes take words in lane order (ballot).
      bool need[32];
      int sym[32];
      for (int l = 0; l < lanes; ++l) {
        need[l] = warp::LaneDecode(&x[l], cum[k][l], j.alphabet[k], j.prob_bits[k], &sym[l]);
      }
      int taken = 0;
      for (int l = 0; l < lanes; ++l) {
        if (!need[l]) continue;
        if (end - w < 2 * (taken + 1)) return false;
        x[l] = (x[l] << 16) | warp::Load16(w + 2 * taken);
        ++taken;
      }
      w += 2 * taken;
      for (int l = 0; l < lanes; ++l) {
        const float v = warp::LaneValue(sym[l], j.levels[k], step, j.anchor_group != 0, anchor, &recon[l]);
        warp::StoreValue(out + j.out_offset, uint64_t{t} * j.channels + cb + l, v, j.dtype);
      }
    }
  }
  if (w != end) return false;
  for (int l = 0; l < 32; ++l) {
    if (x[l] != warp::kLow) return false;
  }
  return true;
}

Status EmulateDeviceDecode(std::span<const uint8_t> encoded, std::span<uint8_t> out) {
  auto plan = PrepareDeviceDecode(encoded);
  if (!plan.ok()) return plan.status();
  if (out.size() != plan->layout.Bytes()) return Status::InvalidArgument("emulator: output buffer size");
  for (const auto& c : plan->copies) memcpy(out.data() + c.to, encoded.data() + c.from, c.bytes);
  for (const auto& j : plan->jobs) {
    if (!EmulateWarp(encoded.data(), j, out.data())) return Status::InvalidArgument("emulator: corrupt stream");
  }
  return Status::Ok();
}

}  // namespace kvd::codec
