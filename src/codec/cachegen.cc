// CacheGen object coding (codec.h): splits an object into planes, codes them (on
// `threads` threads, each plane independently, so the bytes never depend on the thread
// count), and frames them with the v2 header, tables and checksums (format.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "codec/codec.h"
#include "codec/crc32c.h"
#include "codec/format.h"
#include "codec/model_core.h"
#include "codec/plane.h"

namespace kvd::codec {
namespace {

struct PlaneRef {
  size_t group;
  uint32_t kv;
  uint32_t layer;
  uint64_t offset;   // in the raw object
  uint64_t bytes;    // raw bytes of the plane
};

std::vector<PlaneRef> Planes(const ObjectLayout& layout) {
  std::vector<PlaneRef> planes;
  uint64_t off = 0;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const auto& gs = layout.groups[g];
    const uint64_t pb = uint64_t{gs.tokens} * gs.hidden * DtypeBytes(gs.dtype);
    for (uint32_t kv = 0; kv < gs.kv_size; ++kv) {
      for (uint32_t l = 0; l < gs.layers; ++l) {
        planes.push_back({g, kv, l, off, pb});
        off += pb;
      }
    }
  }
  return planes;
}

// Runs fn(i, scratch) for i in [0, n) on up to `threads` threads (the caller's
// included); each thread has its own scratch buffers for the whole call.
template <typename Fn>
void ParallelFor(size_t n, int threads, Fn fn) {
  const size_t nt = threads < 1 ? 1 : std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), n));
  std::vector<plane::Scratch> scratch(nt);
  if (nt == 1) {
    for (size_t i = 0; i < n; ++i) fn(i, scratch[0]);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&](size_t w) {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, scratch[w]);
  };
  std::vector<std::thread> pool;
  pool.reserve(nt - 1);
  for (size_t t = 1; t < nt; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
}

}  // namespace

uint64_t MaxEncodedBytes(const ObjectLayout& layout) {
  return format::kHeaderBytes + layout.groups.size() * format::kGroupEntryBytes +
         format::PlaneCount(layout) * format::kPlaneEntryBytes + layout.Bytes() + format::kTrailerBytes;
}

Result<std::vector<uint8_t>> Encode(const ObjectLayout& layout, std::span<const uint8_t> object,
                                    const CachegenOptions& options) {
  KVD_RETURN_IF_ERROR(layout.Validate());
  KVD_RETURN_IF_ERROR(options.bins.Validate());
  if (object.size() != layout.Bytes()) {
    return Status::InvalidArgument("cachegen: object is " + std::to_string(object.size()) +
                                   " bytes, its layout says " + std::to_string(layout.Bytes()));
  }
  const bool anchors = options.anchor_group >= 2;
  if (anchors && options.anchor_group > 65535) return Status::InvalidArgument("cachegen: anchor_group > 65535");
  if (anchors && options.anchor_bins != 0 && (options.anchor_bins < 4 || options.anchor_bins > 64)) {
    return Status::InvalidArgument("cachegen: anchor_bins outside [4, 64]");
  }
  const std::vector<PlaneRef> planes = Planes(layout);
  for (const auto& p : planes) {
    if (p.bytes > UINT32_MAX) return Status::InvalidArgument("cachegen: plane larger than 4 GiB");
  }
  format::Header h;
  h.flags = anchors ? format::kFlagAnchors : 0;
  h.layout_id = layout.layout_id;
  h.raw_bytes = layout.Bytes();
  h.anchor_group = anchors ? static_cast<uint16_t>(options.anchor_group) : 0;
  h.groups = layout.groups;
  h.planes.resize(planes.size());
  std::vector<std::vector<uint8_t>> payloads(planes.size());
  ParallelFor(planes.size(), options.threads, [&](size_t i, plane::Scratch& scratch) {
    const PlaneRef& pr = planes[i];
    const GroupShape& g = layout.groups[pr.group];
    format::PlaneEntry& e = h.planes[i];
    const uint8_t* data = object.data() + pr.offset;
    if (DtypeIsQuantizable(g.dtype)) {
      e.mode = format::PlaneMode::kCachegen;
      e.bins = static_cast<uint8_t>(options.bins.BinsFor(pr.kv, pr.layer));
      e.anchor_bins = anchors ? static_cast<uint8_t>(options.anchor_bins ? options.anchor_bins : e.bins) : 0;
      // The encoder's precision policy (ProbBitsFor); decoders read it from the object.
      e.prob_bits[0] = static_cast<uint8_t>(ProbBitsFor(plane::Alphabet(e.bins)));
      e.prob_bits[1] = static_cast<uint8_t>(ProbBitsFor(plane::Alphabet(anchors ? e.anchor_bins : e.bins)));
      const plane::PlaneSpec spec = plane::PlaneSpecOf(g, e, h);
      if (plane::Encode(data, spec, &scratch, &payloads[i])) {
        e.payload_bytes = static_cast<uint32_t>(payloads[i].size());
        return;
      }
    }
    e = format::PlaneEntry{};  // raw
    payloads[i].assign(data, data + pr.bytes);
    e.payload_bytes = static_cast<uint32_t>(pr.bytes);
  });
  uint64_t total = h.TablesEnd() + format::kTrailerBytes;
  for (const auto& p : payloads) total += p.size();
  h.encoded_bytes = total;
  std::vector<uint8_t> out;
  out.reserve(total);
  out.resize(h.TablesEnd());
  format::WriteHeader(h, out.data());
  for (const auto& p : payloads) out.insert(out.end(), p.begin(), p.end());
  const size_t at = out.size();
  out.resize(at + format::kTrailerBytes);
  format::Put32(out.data() + at, Crc32c(out.data(), at));
  return out;
}

Result<EncodedInfo> Inspect(std::span<const uint8_t> encoded) {
  auto h = format::ReadHeader(encoded);
  if (!h.ok()) return h.status();
  EncodedInfo info;
  info.format_version = h->version;
  info.layout.layout_id = h->layout_id;
  info.layout.groups = h->groups;
  info.encoded_bytes = h->encoded_bytes;
  info.anchor_group = h->anchor_group;
  for (const auto& e : h->planes) info.plane_bins.push_back(e.bins);
  return info;
}

Status Decode(std::span<const uint8_t> encoded, std::span<uint8_t> out, const ObjectLayout* expected,
              int threads) {
  auto hr = format::ReadHeader(encoded);
  if (!hr.ok()) return hr.status();
  const format::Header& h = *hr;
  ObjectLayout layout;
  layout.layout_id = h.layout_id;
  layout.groups = h.groups;
  if (expected != nullptr && !(*expected == layout)) {
    return Status::InvalidArgument("cachegen: object was encoded for layout " + layout.Describe() +
                                   ", expected " + expected->Describe());
  }
  if (out.size() != h.raw_bytes) {
    return Status::InvalidArgument("cachegen: output buffer is " + std::to_string(out.size()) +
                                   " bytes, the object is " + std::to_string(h.raw_bytes));
  }
  const size_t body = encoded.size() - format::kTrailerBytes;
  if (Crc32c(encoded.data(), body) != format::Get32(encoded.data() + body)) {
    return Status::InvalidArgument("cachegen: checksum mismatch (corrupted object)");
  }
  const std::vector<PlaneRef> planes = Planes(layout);
  std::vector<uint64_t> payload_at(planes.size());
  uint64_t at = h.TablesEnd();
  for (size_t i = 0; i < planes.size(); ++i) {
    const auto& e = h.planes[i];
    const GroupShape& g = layout.groups[planes[i].group];
    if (e.mode == format::PlaneMode::kRaw && e.payload_bytes != planes[i].bytes) {
      return Status::InvalidArgument("cachegen: raw plane " + std::to_string(i) + " has the wrong size");
    }
    if (e.mode == format::PlaneMode::kCachegen && !DtypeIsQuantizable(g.dtype)) {
      return Status::InvalidArgument("cachegen: plane " + std::to_string(i) + " of a " + DtypeName(g.dtype) +
                                     " group is marked quantized");
    }
    payload_at[i] = at;
    at += e.payload_bytes;
  }
  std::vector<Status> errors(planes.size());
  ParallelFor(planes.size(), threads, [&](size_t i, plane::Scratch& scratch) {
    const auto& e = h.planes[i];
    const std::span<const uint8_t> payload = encoded.subspan(payload_at[i], e.payload_bytes);
    uint8_t* dst = out.data() + planes[i].offset;
    if (e.mode == format::PlaneMode::kRaw) {
      memcpy(dst, payload.data(), payload.size());
      return;
    }
    const plane::PlaneSpec spec = plane::PlaneSpecOf(layout.groups[planes[i].group], e, h);
    errors[i] = plane::Decode(payload, spec, &scratch, dst);
  });
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].ok()) {
      return Status::InvalidArgument("plane " + std::to_string(i) + ": " + errors[i].message());
    }
  }
  return Status::Ok();
}

Result<DecodedObject> Decode(std::span<const uint8_t> encoded, int threads) {
  auto info = Inspect(encoded);
  if (!info.ok()) return info.status();
  DecodedObject d;
  d.layout = info->layout;
  d.bytes.resize(d.layout.Bytes());
  KVD_RETURN_IF_ERROR(Decode(encoded, d.bytes, nullptr, threads));
  return d;
}

}  // namespace kvd::codec
