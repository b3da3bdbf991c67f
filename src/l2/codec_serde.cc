#include "l2/codec_serde.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "codec/codec.h"

namespace kvd::l2 {
namespace {

// l2's layout (torch dtype names, int64 sizes) as the codec's, checked.
Result<codec::ObjectLayout> ToCodec(const ObjectLayout& l) {
  codec::ObjectLayout out;
  for (const auto& g : l.groups) {
    auto d = codec::DtypeFromName(g.dtype);
    if (!d.ok()) return d.status();
    if (static_cast<int64_t>(codec::DtypeBytes(*d)) != g.itemsize) {
      return Status::InvalidArgument("serde: dtype " + g.dtype + " with itemsize " + std::to_string(g.itemsize));
    }
    auto fits = [](int64_t v) { return v > 0 && v <= (int64_t{1} << 30); };
    if (!fits(g.kv_size) || !fits(g.layers) || !fits(g.tokens) || !fits(g.hidden)) {
      return Status::InvalidArgument("serde: group sizes out of range");
    }
    out.groups.push_back({static_cast<uint32_t>(g.kv_size), static_cast<uint32_t>(g.layers),
                          static_cast<uint32_t>(g.tokens), static_cast<uint32_t>(g.hidden), *d});
  }
  KVD_RETURN_IF_ERROR(out.Validate());
  if (out.Bytes() != l.bytes) return Status::InvalidArgument("serde: layout size does not match its groups");
  return out;
}

Status CheckKeys(const nlohmann::json& spec, std::initializer_list<const char*> allowed, const char* type) {
  for (const auto& [k, v] : spec.items()) {
    bool ok = k == "type";
    for (const char* a : allowed) ok = ok || k == a;
    if (!ok) return Status::InvalidArgument(std::string("serde '") + type + "' takes no key '" + k + "'");
  }
  return Status::Ok();
}

Result<uint32_t> UintKey(const nlohmann::json& spec, const char* key, uint32_t dflt, uint32_t max) {
  auto it = spec.find(key);
  if (it == spec.end()) return dflt;
  if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
    return Status::InvalidArgument(std::string("serde: '") + key + "' must be an integer in [0, " +
                                   std::to_string(max) + "]");
  }
  return static_cast<uint32_t>(it->get<uint64_t>());
}

class Fp8Serde final : public Serde {
 public:
  explicit Fp8Serde(codec::Fp8Kind kind) : kind_(kind) {}
  std::string_view name() const override { return "fp8"; }
  uint64_t MaxStoredBytes(const ObjectLayout& layout) const override {
    auto l = ToCodec(layout);
    return l.ok() ? codec::Fp8EncodedBytes(*l) : layout.bytes;
  }
  Result<uint64_t> Encode(std::span<const uint8_t> raw, const ObjectLayout& layout,
                          std::span<uint8_t> out) const override {
    auto l = ToCodec(layout);
    if (!l.ok()) return l.status();
    KVD_RETURN_IF_ERROR(codec::Fp8Encode(*l, raw, kind_, out));
    return codec::Fp8EncodedBytes(*l);
  }
  Status Decode(std::span<const uint8_t> stored, const ObjectLayout& layout,
                std::span<uint8_t> raw) const override {
    auto l = ToCodec(layout);
    if (!l.ok()) return l.status();
    return codec::Fp8Decode(stored, *l, kind_, raw);
  }

 private:
  codec::Fp8Kind kind_;
};

class CachegenSerde final : public Serde {
 public:
  CachegenSerde(bool lmcache_bins, codec::CachegenOptions options)
      : lmcache_bins_(lmcache_bins), options_(std::move(options)) {}
  std::string_view name() const override { return "cachegen"; }
  uint64_t MaxStoredBytes(const ObjectLayout& layout) const override {
    auto l = ToCodec(layout);
    return l.ok() ? codec::MaxEncodedBytes(*l) : layout.bytes;
  }
  Result<uint64_t> Encode(std::span<const uint8_t> raw, const ObjectLayout& layout,
                          std::span<uint8_t> out) const override {
    auto l = ToCodec(layout);
    if (!l.ok()) return l.status();
    codec::CachegenOptions o = options_;
    if (lmcache_bins_) o.bins = codec::BinSchedule::Lmcache(l->groups[0].layers);
    auto enc = codec::Encode(*l, raw, o);
    if (!enc.ok()) return enc.status();
    if (enc->size() > out.size()) return Status::Internal("serde cachegen: output buffer too small");
    memcpy(out.data(), enc->data(), enc->size());
    return static_cast<uint64_t>(enc->size());
  }
  Status Decode(std::span<const uint8_t> stored, const ObjectLayout& layout,
                std::span<uint8_t> raw) const override {
    auto l = ToCodec(layout);
    if (!l.ok()) return l.status();
    return codec::Decode(stored, raw, &*l, options_.threads);
  }

 private:
  bool lmcache_bins_;
  codec::CachegenOptions options_;
};

}  // namespace

Result<std::shared_ptr<const Serde>> MakeFp8Serde(const nlohmann::json& spec) {
  KVD_RETURN_IF_ERROR(CheckKeys(spec, {"fp8_dtype", "max_workers"}, "fp8"));
  std::string dtype = "float8_e4m3fn";
  if (auto it = spec.find("fp8_dtype"); it != spec.end()) {
    if (!it->is_string()) return Status::InvalidArgument("serde 'fp8': 'fp8_dtype' must be a string");
    dtype = it->get<std::string>();
  }
  auto kind = codec::Fp8KindFromName(dtype);
  if (!kind.ok()) return kind.status();
  auto workers = UintKey(spec, "max_workers", 1, 1024);
  if (!workers.ok()) return workers.status();
  return std::shared_ptr<const Serde>(std::make_shared<Fp8Serde>(*kind));
}

Result<std::shared_ptr<const Serde>> MakeCachegenSerde(const nlohmann::json& spec) {
  KVD_RETURN_IF_ERROR(CheckKeys(spec, {"bins", "anchor_group", "anchor_bins", "threads"}, "cachegen"));
  codec::CachegenOptions o;
  bool lmcache_bins = true;
  if (auto it = spec.find("bins"); it != spec.end()) {
    std::string text;
    if (it->is_number_unsigned()) {
      text = std::to_string(it->get<uint64_t>());
    } else if (it->is_string()) {
      text = it->get<std::string>();
    } else {
      return Status::InvalidArgument("serde 'cachegen': 'bins' must be \"lmcache\", a number or a schedule");
    }
    if (text != "lmcache") {
      auto b = codec::BinSchedule::Parse(text);
      if (!b.ok()) return b.status();
      o.bins = *b;
      lmcache_bins = false;
    }
  }
  auto g = UintKey(spec, "anchor_group", 0, 65535);
  if (!g.ok()) return g.status();
  auto ab = UintKey(spec, "anchor_bins", 0, 64);
  if (!ab.ok()) return ab.status();
  auto th = UintKey(spec, "threads", 1, 256);
  if (!th.ok()) return th.status();
  o.anchor_group = *g;
  o.anchor_bins = *ab;
  o.threads = static_cast<int>(*th == 0 ? 1 : *th);
  if (o.anchor_bins != 0 && o.anchor_bins < 4) {
    return Status::InvalidArgument("serde 'cachegen': 'anchor_bins' must be 0 or in [4, 64]");
  }
  return std::shared_ptr<const Serde>(std::make_shared<CachegenSerde>(lmcache_bins, std::move(o)));
}

}  // namespace kvd::l2
