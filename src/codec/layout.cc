// ObjectLayout, Dtype and BinSchedule helpers (codec.h).
#include <charconv>
#include <cstdio>
#include <limits>

#include "codec/codec.h"

namespace kvd::codec {

Result<Dtype> DtypeFromName(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (name == "bfloat16") return Dtype::kBfloat16;
  if (name == "float16" || name == "half") return Dtype::kFloat16;
  if (name == "float32" || name == "float") return Dtype::kFloat32;
  if (name == "float8_e4m3fn") return Dtype::kFloat8E4m3fn;
  if (name == "float8_e5m2") return Dtype::kFloat8E5m2;
  if (name == "uint8") return Dtype::kUint8;
  if (name == "int8") return Dtype::kInt8;
  return Status::InvalidArgument("codec: unknown dtype '" + std::string(name) + "'");
}

const char* DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBfloat16: return "bfloat16";
    case Dtype::kFloat16: return "float16";
    case Dtype::kFloat32: return "float32";
    case Dtype::kFloat8E4m3fn: return "float8_e4m3fn";
    case Dtype::kFloat8E5m2: return "float8_e5m2";
    case Dtype::kUint8: return "uint8";
    case Dtype::kInt8: return "int8";
  }
  return "unknown";
}

uint32_t DtypeBytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBfloat16:
    case Dtype::kFloat16: return 2;
    case Dtype::kFloat32: return 4;
    case Dtype::kFloat8E4m3fn:
    case Dtype::kFloat8E5m2:
    case Dtype::kUint8:
    case Dtype::kInt8: return 1;
  }
  return 0;
}

bool DtypeIsQuantizable(Dtype dtype) {
  return dtype == Dtype::kBfloat16 || dtype == Dtype::kFloat16 || dtype == Dtype::kFloat32;
}

uint64_t ObjectLayout::Bytes() const {
  uint64_t n = 0;
  for (const auto& g : groups) n += g.Bytes();
  return n;
}

Status ObjectLayout::Validate() const {
  if (groups.empty()) return Status::InvalidArgument("codec: layout has no groups");
  if (groups.size() > 64) return Status::InvalidArgument("codec: layout has more than 64 groups");
  unsigned __int128 total = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    const std::string where = "codec: group " + std::to_string(i) + ": ";
    if (g.kv_size != 1 && g.kv_size != 2) return Status::InvalidArgument(where + "kv_size must be 1 or 2");
    if (g.layers == 0 || g.tokens == 0 || g.hidden == 0) {
      return Status::InvalidArgument(where + "layers, tokens and hidden must be non-zero");
    }
    if (g.layers > 4096 || g.tokens > (1u << 20) || g.hidden > (1u << 20)) {
      return Status::InvalidArgument(where + "layers (<= 4096), tokens or hidden (<= 2^20) too large");
    }
    if (DtypeBytes(g.dtype) == 0) return Status::InvalidArgument(where + "unknown dtype");
    total += static_cast<unsigned __int128>(g.kv_size) * g.layers * g.tokens * g.hidden * DtypeBytes(g.dtype);
  }
  if (total > (uint64_t{1} << 40)) return Status::InvalidArgument("codec: object larger than 1 TiB");
  return Status::Ok();
}

std::string ObjectLayout::Describe() const {
  char head[32];
  snprintf(head, sizeof head, "id 0x%llx", static_cast<unsigned long long>(layout_id));
  std::string s = head;
  s += " [";
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    if (i) s += ", ";
    s += std::to_string(g.kv_size) + "x" + std::to_string(g.layers) + "x" + std::to_string(g.tokens) +
         "x" + std::to_string(g.hidden) + " " + DtypeName(g.dtype);
  }
  return s + "]";
}

// ---- BinSchedule ------------------------------------------------------------------

namespace {

uint32_t SpanBins(const std::vector<BinSpan>& spans, uint32_t layer) {
  uint32_t bins = spans.empty() ? 32 : spans.front().bins;
  for (const auto& s : spans) {
    if (s.start_layer <= layer) bins = s.bins;
    if (layer >= s.start_layer && layer < s.end_layer) return s.bins;
  }
  return bins;
}

Status ValidateSpans(const std::vector<BinSpan>& spans, const char* which) {
  if (spans.empty()) return Status::InvalidArgument(std::string("codec: no bins for ") + which);
  if (spans.front().start_layer != 0) {
    return Status::InvalidArgument(std::string("codec: ") + which + " bins must start at layer 0");
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto& s = spans[i];
    if (s.bins < 4 || s.bins > 64) {
      return Status::InvalidArgument(std::string("codec: ") + which + " bins " + std::to_string(s.bins) +
                                     " outside [4, 64]");
    }
    if (s.end_layer <= s.start_layer) {
      return Status::InvalidArgument(std::string("codec: ") + which + " span ends before it starts");
    }
    if (i > 0 && s.start_layer != spans[i - 1].end_layer) {
      return Status::InvalidArgument(std::string("codec: ") + which + " spans must be contiguous");
    }
  }
  return Status::Ok();
}

std::string SpansToString(const std::vector<BinSpan>& spans) {
  std::string s;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(spans[i].start_layer) + "-";
    if (spans[i].end_layer != std::numeric_limits<uint32_t>::max()) s += std::to_string(spans[i].end_layer);
    s += ":" + std::to_string(spans[i].bins);
  }
  return s;
}

bool ParseUint(std::string_view t, uint32_t* v) {
  if (t.empty()) return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

// "0-10:32,10-:16"
Result<std::vector<BinSpan>> ParseSpans(std::string_view t) {
  std::vector<BinSpan> out;
  while (!t.empty()) {
    const size_t comma = t.find(',');
    std::string_view item = t.substr(0, comma);
    t = comma == std::string_view::npos ? std::string_view() : t.substr(comma + 1);
    const size_t dash = item.find('-');
    const size_t colon = item.find(':');
    BinSpan s;
    if (dash == std::string_view::npos || colon == std::string_view::npos || colon < dash ||
        !ParseUint(item.substr(0, dash), &s.start_layer) ||
        !ParseUint(item.substr(colon + 1), &s.bins)) {
      return Status::InvalidArgument("codec: bad bin span '" + std::string(item) +
                                     "' (want START-END:BINS or START-:BINS)");
    }
    const auto end = item.substr(dash + 1, colon - dash - 1);
    if (end.empty()) {
      s.end_layer = std::numeric_limits<uint32_t>::max();
    } else if (!ParseUint(end, &s.end_layer)) {
      return Status::InvalidArgument("codec: bad bin span end in '" + std::string(item) + "'");
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

uint32_t BinSchedule::BinsFor(uint32_t kv, uint32_t layer) const {
  return SpanBins(kv == 1 && !v.empty() ? v : k, layer);
}

Status BinSchedule::Validate() const {
  KVD_RETURN_IF_ERROR(ValidateSpans(k, "K"));
  return ValidateSpans(v, "V");
}

std::string BinSchedule::ToString() const { return "k=" + SpansToString(k) + " v=" + SpansToString(v); }

Result<BinSchedule> BinSchedule::Parse(std::string_view text) {
  uint32_t all;
  if (ParseUint(text, &all)) {
    BinSchedule s = Uniform(all);
    KVD_RETURN_IF_ERROR(s.Validate());
    return s;
  }
  BinSchedule s;
  bool have_k = false, have_v = false;
  while (!text.empty()) {
    const size_t sp = text.find(' ');
    std::string_view part = text.substr(0, sp);
    text = sp == std::string_view::npos ? std::string_view() : text.substr(sp + 1);
    if (part.empty()) continue;
    if (part.starts_with("k=")) {
      auto r = ParseSpans(part.substr(2));
      if (!r.ok()) return r.status();
      s.k = *r;
      have_k = true;
    } else if (part.starts_with("v=")) {
      auto r = ParseSpans(part.substr(2));
      if (!r.ok()) return r.status();
      s.v = *r;
      have_v = true;
    } else {
      return Status::InvalidArgument("codec: bad bin schedule part '" + std::string(part) +
                                     "' (want k=... v=... or a number)");
    }
  }
  if (!have_k || !have_v) return Status::InvalidArgument("codec: bin schedule needs both k= and v=");
  KVD_RETURN_IF_ERROR(s.Validate());
  return s;
}

BinSchedule BinSchedule::Lmcache(uint32_t layers) {
  constexpr uint32_t kEnd = std::numeric_limits<uint32_t>::max();
  if (layers < 10) return Uniform(32);
  BinSchedule s;
  s.k = {{0, 10, 32}, {10, kEnd, 16}};
  s.v = {{0, 2, 32}, {2, kEnd, 16}};
  return s;
}

BinSchedule BinSchedule::Uniform(uint32_t bins) {
  constexpr uint32_t kEnd = std::numeric_limits<uint32_t>::max();
  BinSchedule s;
  s.k = {{0, kEnd, bins}};
  s.v = {{0, kEnd, bins}};
  return s;
}

}  // namespace kvd::codec
