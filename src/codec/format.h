// format: the CacheGen byte format, version 2 (all integers little-endian; the full
// description with every field is in docs/compression.md "Byte format").
//
//   header        48 bytes (kHeaderBytes)
//   group table   20 bytes per group
//   plane table    8 bytes per plane (planes in object order: group, K/V, layer)
//   payloads      one per plane, in plane order, payload_bytes each
//   trailer        u32 CRC-32C of every byte before it
//
// The header's own CRC-32C covers the header and both tables (with the CRC field read
// as zero), so Inspect can trust the sizes before reading any payload.
// Pure functions; no state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codec/codec.h"

namespace kvd::codec::format {

inline constexpr uint8_t kMagic[4] = {'K', 'V', 'C', 'G'};
inline constexpr uint16_t kVersion = 2;   // 1: precision implied (+6), no longer read
inline constexpr size_t kHeaderBytes = 48;
inline constexpr size_t kGroupEntryBytes = 20;
inline constexpr size_t kPlaneEntryBytes = 8;
inline constexpr size_t kTrailerBytes = 4;
inline constexpr uint16_t kFlagAnchors = 1;
inline constexpr uint32_t kStreamChannels = 256;   // channels per rANS stream (v2)

enum class PlaneMode : uint8_t { kRaw = 0, kCachegen = 1 };

struct PlaneEntry {
  PlaneMode mode = PlaneMode::kRaw;
  uint8_t bins = 0;          // 0 when raw
  uint8_t anchor_bins = 0;   // 0 when raw or without anchors
  uint8_t prob_bits[2] = {0, 0};  // probability precision of normal / anchor tokens (8..12)
  uint32_t payload_bytes = 0;
};

struct Header {
  uint16_t version = kVersion;
  uint16_t flags = 0;
  uint64_t layout_id = 0;
  uint64_t raw_bytes = 0;
  uint64_t encoded_bytes = 0;
  uint16_t anchor_group = 0;
  uint16_t stream_channels = kStreamChannels;
  std::vector<GroupShape> groups;
  std::vector<PlaneEntry> planes;
  size_t TablesEnd() const {
    return kHeaderBytes + groups.size() * kGroupEntryBytes + planes.size() * kPlaneEntryBytes;
  }
};

// Number of planes of a layout (sum of kv_size * layers).
uint64_t PlaneCount(const ObjectLayout& layout);

// Serialises header and tables (with their CRC) into out[0, TablesEnd()).
void WriteHeader(const Header& h, uint8_t* out);

// Parses and checks header and tables of an encoded object of `size` bytes: magic,
// version, table sizes within the object, header CRC, known dtypes and plane modes,
// plane count, raw size, and payload sizes adding up to the object. Does not read the
// payloads or the trailer.
Result<Header> ReadHeader(std::span<const uint8_t> encoded);

// Little-endian helpers.
inline void Put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline void Put32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline void Put64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline uint16_t Get16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t Get32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline uint64_t Get64(const uint8_t* p) { return uint64_t(Get32(p)) | (uint64_t(Get32(p + 4)) << 32); }

}  // namespace kvd::codec::format
