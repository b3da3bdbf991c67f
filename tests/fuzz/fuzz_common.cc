#include "fuzz_common.h"

#include <msgpack.hpp>

#include <cstdio>
#include <cstdlib>

#include "wire/request_encoder.h"

namespace kvd::fuzz {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "kvd fuzz invariant violated: %s\n", what);
  std::abort();
}

bool IsOneMsgpackDocument(std::string_view bytes) {
  try {
    size_t off = 0;
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), off);
    return off == bytes.size();
  } catch (const std::exception&) {
    return false;
  }
}

namespace {

void CheckBlendKey(const wire::CacheKey& k) {
  Check(k.world_size >= 1 && k.world_size <= 4096, "blend key.world_size in [1, 4096]");
  Check(!k.worker_id || (*k.worker_id >= 0 && *k.worker_id < k.world_size),
        "blend key.worker_id in [0, world_size)");
  Check(k.start >= 0 && k.start <= k.end && k.end <= static_cast<int64_t>(k.token_ids.size()),
        "blend key range within token_ids");
}

void CheckMatches(const std::vector<wire::CbMatchResult>& ms) {
  for (const auto& m : ms) {
    Check(m.old_st >= 0 && m.old_st <= m.old_ed && m.cur_st >= 0 && m.cur_st <= m.cur_ed,
          "match ranges 0 <= st <= ed");
    Check(!m.hash.empty() && m.hash.size() <= wire::kMaxCbHashBytes, "match hash 1..64 bytes");
  }
}

void RegisterRope(wire::Frames p) {
  auto r = wire::DecodeCbRegisterRope(p);
  if (!r.ok()) return;
  Check(p.size() == 7 || p.size() == 8, "cb_register_rope: 7 or 8 payloads");
  const auto caches = static_cast<int64_t>(r->cos_sin_caches.size());
  for (int64_t c : r->group_to_cache) Check(c >= -1 && c < caches, "group_to_cache in [-1, caches)");
  for (const auto& w : r->group_rot) {
    Check(!w || (w->offset >= 0 && w->width > 0), "group_rot window offset >= 0, width > 0");
  }
  Check(r->kv_quant.empty() || r->kv_quant == "fp8_e4m3" || r->kv_quant == "fp8_e5m2",
        "kv_quant flavour");
  for (const auto& d : r->cos_sin_caches) {
    Check(d.shape.size() == d.stride.size() && d.shape.size() <= 8, "cos/sin descriptor rank");
  }
  // The lists re-encode to frames that decode to the same request.
  std::vector<std::string> again(p.begin(), p.end());
  again[4] = wire::EncodeIntList(r->group_to_cache);
  again[5] = wire::EncodeGroupRot(r->group_rot);
  again[6] = wire::EncodeIntList(r->group_head_size);
  std::vector<std::string_view> views(again.begin(), again.end());
  auto r2 = wire::DecodeCbRegisterRope(views);
  Check(r2.ok(), "re-encoded cb_register_rope decodes");
  Check(r2->group_to_cache == r->group_to_cache && r2->group_head_size == r->group_head_size &&
            r2->group_rot.size() == r->group_rot.size(),
        "re-encoded cb_register_rope lists round-trip");
}

void RetrievePreComputed(wire::Frames p) {
  auto r = wire::DecodeCbRetrievePreComputed(p);
  if (!r.ok()) return;
  CheckBlendKey(r->key);
  CheckMatches(r->match_results);
  // The matches re-encode (as the client writes them) to a frame that decodes the same.
  std::vector<std::string> again(p.begin(), p.end());
  again[1] = wire::EncodeCbMatchResults(r->match_results);
  std::vector<std::string_view> views(again.begin(), again.end());
  auto r2 = wire::DecodeCbRetrievePreComputed(views);
  Check(r2.ok() && r2->match_results.size() == r->match_results.size(), "matches round-trip");
  for (size_t i = 0; i < r->match_results.size(); ++i) {
    const auto &a = r->match_results[i], &b = r2->match_results[i];
    Check(a.old_st == b.old_st && a.old_ed == b.old_ed && a.cur_st == b.cur_st &&
              a.cur_ed == b.cur_ed && a.hash == b.hash,
          "match round-trips");
  }
  // Whatever was decoded can be answered: the unified lookup reply carrying these matches.
  wire::CbUnifiedLookupResult res;
  res.prefix_coverage_tokens = r->key.end;
  res.non_prefix_segments = r->match_results;
  res.segmented_prefix_segments = r->match_results;
  Check(IsOneMsgpackDocument(wire::EncodeCbUnifiedLookupResult(res)), "lookup result is one document");
  Check(IsOneMsgpackDocument(wire::EncodeHandleAndOk(r->event_handle, false)), "[handle, ran] is one document");
}

void UnifiedLookup(wire::Frames p) {
  auto r = wire::DecodeCbUnifiedLookup(p);
  if (r.ok()) CheckBlendKey(r->key);
}

void Handshake(wire::Frames p) {
  auto v = wire::DecodeCbProtocolHandshake(p);
  if (!v.ok()) return;
  const std::string reply = wire::EncodeCbProtocolHandshake(*v);
  Check(reply == (*v == wire::kCbProtocolVersion ? std::string("\x92\x01\xc3") : std::string("\x92\x01\xc2")),
        "handshake reply is [1, client_version == 1]");
}

void ReorderPlan(wire::Frames p) {
  auto r = wire::DecodeCbReorderPlan(p);
  if (!r.ok()) return;
  CheckBlendKey(r->key);
  Check(r->keep_prefix >= 0 && r->budget_ms >= 0, "reorder numbers non-negative");
  Check(IsOneMsgpackDocument(wire::EncodeCbReorderPlan(r->key.token_ids.span())), "reorder reply is one document");
}

}  // namespace

void CheckBlendDecoders(wire::Frames p, const wire::OpInfo* op) {
  using wire::Op;
  if (op == nullptr || op->op == Op::kCbRegisterRope) RegisterRope(p);
  if (op == nullptr || op->op == Op::kCbUnregisterRope) (void)wire::DecodeInstanceId(p);
  if (op == nullptr || op->op == Op::kCbRetrievePreComputed) RetrievePreComputed(p);
  if (op == nullptr || op->op == Op::kCbUnifiedLookup) UnifiedLookup(p);
  if (op == nullptr || op->op == Op::kCbProtocolHandshake) Handshake(p);
  if (op == nullptr || op->op == Op::kCbReorderPlan) ReorderPlan(p);
}

}  // namespace kvd::fuzz
