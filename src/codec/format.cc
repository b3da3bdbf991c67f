#include "codec/format.h"

#include <cstring>

#include "codec/crc32c.h"

namespace kvd::codec::format {

uint64_t PlaneCount(const ObjectLayout& layout) {
  uint64_t n = 0;
  for (const auto& g : layout.groups) n += uint64_t{g.kv_size} * g.layers;
  return n;
}

void WriteHeader(const Header& h, uint8_t* out) {
  memset(out, 0, h.TablesEnd());
  memcpy(out, kMagic, 4);
  Put16(out + 4, h.version);
  Put16(out + 6, h.flags);
  Put64(out + 8, h.layout_id);
  Put64(out + 16, h.raw_bytes);
  Put64(out + 24, h.encoded_bytes);
  Put32(out + 32, static_cast<uint32_t>(h.groups.size()));
  Put32(out + 36, static_cast<uint32_t>(h.planes.size()));
  Put16(out + 40, h.anchor_group);
  Put16(out + 42, h.stream_channels);
  uint8_t* p = out + kHeaderBytes;
  for (const auto& g : h.groups) {
    Put32(p, g.kv_size);
    Put32(p + 4, g.layers);
    Put32(p + 8, g.tokens);
    Put32(p + 12, g.hidden);
    p[16] = static_cast<uint8_t>(g.dtype);
    p += kGroupEntryBytes;
  }
  for (const auto& e : h.planes) {
    p[0] = static_cast<uint8_t>(e.mode);
    p[1] = e.bins;
    p[2] = e.anchor_bins;
    p[3] = e.mode == PlaneMode::kRaw ? 0 : static_cast<uint8_t>((e.prob_bits[0] - 8) | ((e.prob_bits[1] - 8) << 4));
    Put32(p + 4, e.payload_bytes);
    p += kPlaneEntryBytes;
  }
  Put32(out + 44, Crc32c(out, h.TablesEnd()));
}

Result<Header> ReadHeader(std::span<const uint8_t> enc) {
  auto bad = [](const std::string& why) { return Status::InvalidArgument("cachegen: " + why); };
  if (enc.size() < kHeaderBytes + kTrailerBytes) return bad("object too short for a header");
  const uint8_t* b = enc.data();
  if (memcmp(b, kMagic, 4) != 0) return bad("not a CacheGen object (bad magic)");
  Header h;
  h.version = Get16(b + 4);
  if (h.version != kVersion) {
    return bad("format version " + std::to_string(h.version) + " not supported (this build reads " +
               std::to_string(kVersion) + ")");
  }
  h.flags = Get16(b + 6);
  h.layout_id = Get64(b + 8);
  h.raw_bytes = Get64(b + 16);
  h.encoded_bytes = Get64(b + 24);
  const uint32_t ngroups = Get32(b + 32);
  const uint32_t nplanes = Get32(b + 36);
  h.anchor_group = Get16(b + 40);
  h.stream_channels = Get16(b + 42);
  if (h.encoded_bytes != enc.size()) {
    return bad("object is " + std::to_string(enc.size()) + " bytes, its header says " +
               std::to_string(h.encoded_bytes) + " (truncated or padded)");
  }
  if (ngroups == 0 || ngroups > 64) return bad("bad group count " + std::to_string(ngroups));
  const uint64_t tables = kHeaderBytes + uint64_t{ngroups} * kGroupEntryBytes + uint64_t{nplanes} * kPlaneEntryBytes;
  if (tables + kTrailerBytes > enc.size()) return bad("tables run past the end of the object");
  // The header CRC, computed with its own field as zero.
  uint32_t crc = Crc32c(b, 44);
  const uint8_t zero[4] = {0, 0, 0, 0};
  crc = Crc32c(zero, 4, crc);
  crc = Crc32c(b + kHeaderBytes, tables - kHeaderBytes, crc);
  if (crc != Get32(b + 44)) return bad("header checksum mismatch (corrupted object)");
  if ((h.flags & ~kFlagAnchors) != 0) return bad("unknown header flags");
  const bool anchors = (h.flags & kFlagAnchors) != 0;
  if (anchors != (h.anchor_group >= 2)) return bad("anchor flag and anchor group disagree");
  if (h.stream_channels == 0 || h.stream_channels % 32 != 0) return bad("bad stream channel count");

  ObjectLayout layout;
  layout.layout_id = h.layout_id;
  const uint8_t* p = b + kHeaderBytes;
  for (uint32_t i = 0; i < ngroups; ++i) {
    GroupShape g;
    g.kv_size = Get32(p);
    g.layers = Get32(p + 4);
    g.tokens = Get32(p + 8);
    g.hidden = Get32(p + 12);
    g.dtype = static_cast<Dtype>(p[16]);
    if (DtypeBytes(g.dtype) == 0) return bad("unknown dtype code " + std::to_string(p[16]));
    layout.groups.push_back(g);
    p += kGroupEntryBytes;
  }
  KVD_RETURN_IF_ERROR(layout.Validate());
  if (PlaneCount(layout) != nplanes) return bad("plane count does not match the groups");
  if (layout.Bytes() != h.raw_bytes) return bad("raw size does not match the groups");
  h.groups = std::move(layout.groups);
  uint64_t payload = 0;
  for (uint32_t i = 0; i < nplanes; ++i) {
    PlaneEntry e;
    if (p[0] > static_cast<uint8_t>(PlaneMode::kCachegen)) return bad("unknown plane mode");
    e.mode = static_cast<PlaneMode>(p[0]);
    e.bins = p[1];
    e.anchor_bins = p[2];
    e.payload_bytes = Get32(p + 4);
    if (e.mode == PlaneMode::kCachegen) {
      if (e.bins < 4 || e.bins > 64) return bad("plane " + std::to_string(i) + ": bins out of range");
      if (anchors != (e.anchor_bins != 0) || (anchors && (e.anchor_bins < 4 || e.anchor_bins > 64))) {
        return bad("plane " + std::to_string(i) + ": bad anchor bins");
      }
      // Precision: 8..12 bits, enough for every symbol of the class to get a slot.
      const uint32_t bins[2] = {e.bins, anchors ? e.anchor_bins : e.bins};
      for (int k = 0; k < 2; ++k) {
        const int pb = 8 + ((p[3] >> (4 * k)) & 0xf);
        if (pb > 12 || (1 << pb) < static_cast<int>(2 * (bins[k] / 2 - 1) + 1)) {
          return bad("plane " + std::to_string(i) + ": bad probability precision");
        }
        e.prob_bits[k] = static_cast<uint8_t>(pb);
      }
    } else if (e.bins != 0 || e.anchor_bins != 0 || p[3] != 0) {
      return bad("plane " + std::to_string(i) + ": raw plane with bins");
    }
    payload += e.payload_bytes;
    h.planes.push_back(e);
    p += kPlaneEntryBytes;
  }
  if (tables + payload + kTrailerBytes != enc.size()) return bad("plane payload sizes do not add up to the object");
  return h;
}

}  // namespace kvd::codec::format
