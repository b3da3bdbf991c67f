// Golden frames of CacheBlend's ops (tests/wire_golden/blend/*.json), captured from the real
// lmcache 0.5.6 RequestClient stubs and `lmcache server --engine-type blend` (see
// tests/wire_golden/README.md): every request decodes into kvd's typed struct with the values
// the capture scenario sent (the file's msgspec-decoded view is the oracle), kvd's reply
// encoders produce the reference's reply bytes, and kvd's client-side encoders reproduce the
// client's request frames byte for byte.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "wire/codec.h"
#include "wire/request_encoder.h"

namespace kvd::wire {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Golden {
  std::string name;
  std::string op;
  std::vector<std::string> request;   // [uid, op, payload...]
  std::vector<std::string> response;  // [uid, op(, reply)], or none: never answered
  json request_decoded;
  json response_decoded;
};

std::string Unhex(const std::string& h) {
  std::string out(h.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

fs::path Dir() { return fs::path(KVD_SOURCE_DIR) / "tests" / "wire_golden" / "blend"; }

std::vector<Golden> LoadAll() {
  std::vector<Golden> all;
  for (const auto& e : fs::directory_iterator(Dir())) {
    if (e.path().extension() != ".json" || e.path().stem() == "summary") continue;
    std::ifstream in(e.path());
    auto j = json::parse(in);
    Golden g;
    g.name = e.path().stem().string();
    g.op = j.at("op").get<std::string>();
    for (const auto& h : j.at("request_frames_hex")) g.request.push_back(Unhex(h.get<std::string>()));
    for (const auto& h : j.at("response_frames_hex")) g.response.push_back(Unhex(h.get<std::string>()));
    g.request_decoded = j.at("request_decoded");
    g.response_decoded = j.at("response_decoded");
    all.push_back(std::move(g));
  }
  std::sort(all.begin(), all.end(), [](const Golden& a, const Golden& b) { return a.name < b.name; });
  return all;
}

const std::vector<Golden>& All() {
  static const std::vector<Golden> all = LoadAll();
  return all;
}

const Golden& Find(const std::string& name) {
  for (const auto& g : All()) {
    if (g.name == name) return g;
  }
  static Golden none;
  ADD_FAILURE() << "no golden file blend/" << name << ".json";
  return none;
}

std::vector<std::string_view> Payloads(const Golden& g) {
  if (g.request.size() < 2) return {};
  return std::vector<std::string_view>(g.request.begin() + 2, g.request.end());
}

// bytes in the decoded view: {"bin": ascii} or {"bin_hex": hex}.
std::string BytesOf(const json& j) {
  if (j.contains("bin")) return j.at("bin").get<std::string>();
  return Unhex(j.at("bin_hex").get<std::string>());
}

std::vector<CbMatchResult> MatchesOf(const json& j) {
  std::vector<CbMatchResult> out;
  for (const auto& m : j) {
    out.push_back({m.at("old_st").get<int64_t>(), m.at("old_ed").get<int64_t>(), m.at("cur_st").get<int64_t>(),
                   m.at("cur_ed").get<int64_t>(), BytesOf(m.at("hash"))});
  }
  return out;
}

void ExpectKeyMatches(const CacheKey& k, const json& j) {
  EXPECT_EQ(k.model_name, j.at("model_name").get<std::string>());
  EXPECT_EQ(k.world_size, j.at("world_size").get<int64_t>());
  if (j.at("worker_id").is_null()) {
    EXPECT_FALSE(k.worker_id.has_value());
  } else {
    EXPECT_EQ(k.worker_id, j.at("worker_id").get<int64_t>());
  }
  const auto tokens = j.at("token_ids").get<std::vector<int64_t>>();
  ASSERT_EQ(k.token_ids.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(k.token_ids[i], tokens[i]) << i;
  EXPECT_EQ(k.start, j.at("start").get<int64_t>());
  EXPECT_EQ(k.end, j.at("end").get<int64_t>());
  EXPECT_EQ(k.request_id, j.at("request_id").get<std::string>());
  EXPECT_EQ(k.num_kv_readers, j.at("num_kv_readers").get<int64_t>());
}

std::string KeyFrame(const CacheKey& k) {
  return EncodeCacheKey(k, EncodeTokenArray(std::vector<int64_t>(k.token_ids.data(), k.token_ids.data() + k.token_ids.size())));
}

TEST(BlendGolden, CoversEveryOpAndForm) {
  std::set<std::string> names;
  for (const auto& g : All()) names.insert(g.name);
  for (const char* want :
       {"cb_protocol_handshake", "cb_protocol_handshake__mismatch", "cb_register_rope",
        "cb_register_rope__kv_quant", "cb_register_rope__v3_alias", "cb_register_rope__7_payloads",
        "cb_unregister_rope", "cb_retrieve_pre_computed", "cb_unified_lookup", "cb_unified_lookup__loading",
        "cb_unified_lookup__miss", "cb_unified_lookup__prefix", "cb_reorder_plan", "cb_reorder_plan__keep"}) {
    EXPECT_TRUE(names.count(want)) << "missing golden exchange " << want;
  }
}

TEST(BlendGolden, OpFramesDecodeToTheRecordedOpAndRepliesEchoThem) {
  for (const auto& g : All()) {
    SCOPED_TRACE(g.name);
    ASSERT_GE(g.request.size(), 2u);
    auto op = DecodeOp(g.request[1]);
    ASSERT_TRUE(op.ok()) << op.status().ToString();
    EXPECT_EQ((*op)->name, g.op);
    EXPECT_GE(g.request.size() - 2, (*op)->min_payloads);
    EXPECT_LE(g.request.size() - 2, (*op)->max_payloads);
    if (g.name == "cb_register_rope__7_payloads") {
      EXPECT_TRUE(g.response.empty()) << "the 0.5.6 server never answers 7 payloads";
      continue;
    }
    ASSERT_GE(g.response.size(), 2u);
    EXPECT_EQ(g.response[0], g.request[0]);
    EXPECT_EQ(g.response[1], g.request[1]);
  }
  // cb_reorder_plan is the one op sent by name (a msgpack str), the others by frozen id.
  EXPECT_EQ(Find("cb_reorder_plan").request[1], std::string("\xaf" "cb_reorder_plan"));
  EXPECT_EQ(Find("cb_register_rope").request[1], std::string("\x19"));
  EXPECT_EQ(Find("cb_retrieve_pre_computed").request[1], std::string("\x1b"));
  EXPECT_EQ(Find("cb_unified_lookup").request[1], std::string("\x1c"));
  EXPECT_EQ(Find("cb_protocol_handshake").request[1], std::string("\x21"));
}

TEST(BlendGolden, RegisterRopeEveryFormDecodesExactly) {
  struct Want {
    const char* name;
    size_t payloads;
    bool neox;
    std::vector<int64_t> group_to_cache;
    std::vector<std::optional<RopeWindow>> group_rot;
    std::vector<int64_t> group_head_size;
    const char* kv_quant;
  };
  const std::vector<Want> wants = {
      {"cb_register_rope", 8, true, {0}, {RopeWindow{0, 64}}, {64}, ""},
      {"cb_register_rope__kv_quant", 8, false, {-1}, {std::nullopt}, {}, "fp8_e4m3"},
      {"cb_register_rope__v3_alias", 8, true, {0}, {}, {}, ""},
      {"cb_register_rope__7_payloads", 7, true, {0}, {RopeWindow{0, 64}}, {64}, ""},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.name);
    const Golden& g = Find(w.name);
    auto p = Payloads(g);
    ASSERT_EQ(p.size(), w.payloads);
    auto r = DecodeCbRegisterRope(p);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->instance_id, g.request_decoded.at(2).get<int64_t>());
    ASSERT_EQ(r->cos_sin_caches.size(), 1u);
    const TensorDescriptor& c = r->cos_sin_caches[0];
    const json& meta = g.request_decoded.at(3).at(0).at("data_msgpack");
    EXPECT_EQ(c.memory, TensorMemory::kCpuShm);
    EXPECT_EQ(c.shm_name, meta.at("shm_name").get<std::string>());
    EXPECT_EQ(c.nbytes, 1024u * 64 * 4);
    EXPECT_EQ(c.dtype, "float32");
    EXPECT_EQ(c.shape, (std::vector<int64_t>{1024, 64}));
    EXPECT_EQ(c.stride, (std::vector<int64_t>{64, 1}));
    EXPECT_EQ(c.device_uuid, "cpu");
    EXPECT_EQ(r->head_size, 64);
    EXPECT_EQ(r->is_neox_style, w.neox);
    EXPECT_EQ(r->group_to_cache, w.group_to_cache);
    ASSERT_EQ(r->group_rot.size(), w.group_rot.size());
    for (size_t i = 0; i < w.group_rot.size(); ++i) {
      ASSERT_EQ(r->group_rot[i].has_value(), w.group_rot[i].has_value()) << i;
      if (w.group_rot[i]) {
        EXPECT_EQ(r->group_rot[i]->offset, w.group_rot[i]->offset);
        EXPECT_EQ(r->group_rot[i]->width, w.group_rot[i]->width);
      }
    }
    EXPECT_EQ(r->group_head_size, w.group_head_size);
    EXPECT_EQ(r->kv_quant, w.kv_quant);

    // The client-side encoders write the same frames.
    const auto& f = g.request;
    EXPECT_EQ(EncodeRequestInt(r->instance_id), f[2]);
    EXPECT_EQ(EncodeArrayOf(std::vector<std::string>{EncodeCpuShmDescriptorExt(c)}), f[3]);
    EXPECT_EQ(EncodeRequestInt(r->head_size), f[4]);
    EXPECT_EQ(EncodeRequestBool(r->is_neox_style), f[5]);
    EXPECT_EQ(EncodeIntList(r->group_to_cache), f[6]);
    EXPECT_EQ(EncodeGroupRot(r->group_rot), f[7]);
    EXPECT_EQ(EncodeIntList(r->group_head_size), f[8]);
    if (w.payloads == 8) {
      EXPECT_EQ(EncodeRequestStr(r->kv_quant), f[9]);
    }
  }
}

TEST(BlendGolden, RetrievePreComputedDecodesExactlyAndItsReplyIsTheReferences) {
  const Golden& g = Find("cb_retrieve_pre_computed");
  auto r = DecodeCbRetrievePreComputed(Payloads(g));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const json& d = g.request_decoded;
  ExpectKeyMatches(r->key, d.at(2));
  EXPECT_EQ(r->key.worker_id, 0);
  // The client sends back the segments the lookup answered.
  const auto want = MatchesOf(d.at(3));
  ASSERT_EQ(r->match_results.size(), want.size());
  ASSERT_FALSE(want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r->match_results[i].old_st, want[i].old_st);
    EXPECT_EQ(r->match_results[i].old_ed, want[i].old_ed);
    EXPECT_EQ(r->match_results[i].cur_st, want[i].cur_st);
    EXPECT_EQ(r->match_results[i].cur_ed, want[i].cur_ed);
    EXPECT_EQ(r->match_results[i].hash, want[i].hash);
    EXPECT_EQ(r->match_results[i].hash.size(), 32u);
  }
  const auto lookup = MatchesOf(Find("cb_unified_lookup").response_decoded.at(2).at("non_prefix_segments"));
  ASSERT_EQ(lookup.size(), want.size());
  EXPECT_EQ(lookup[0].hash, want[0].hash);
  EXPECT_EQ(r->block_ids, d.at(4).get<std::vector<std::vector<int64_t>>>());
  EXPECT_EQ(r->block_ids.at(0).size(), 48u);
  EXPECT_EQ(r->instance_id, d.at(5).get<int64_t>());
  EXPECT_EQ(r->event_handle, "stub_ipc_handle");
  // Client-side encoders: the same frames.
  EXPECT_EQ(KeyFrame(r->key), g.request[2]);
  EXPECT_EQ(EncodeCbMatchResults(r->match_results), g.request[3]);
  EXPECT_EQ(EncodeBlockIds(r->block_ids), g.request[4]);
  EXPECT_EQ(EncodeRequestInt(r->instance_id), g.request[5]);
  EXPECT_EQ(EncodeRequestBin(r->event_handle), g.request[6]);
  // Reply [event handle, scatter_ran]: the reference on CPU answers its stub handle and false.
  ASSERT_EQ(g.response.size(), 3u);
  EXPECT_EQ(EncodeHandleAndOk("stub_ipc_handle", false), g.response[2]);
}

TEST(BlendGolden, UnifiedLookupRequestsAndEveryReplyForm) {
  for (const char* name : {"cb_unified_lookup", "cb_unified_lookup__loading", "cb_unified_lookup__miss",
                           "cb_unified_lookup__prefix"}) {
    SCOPED_TRACE(name);
    const Golden& g = Find(name);
    auto r = DecodeCbUnifiedLookup(Payloads(g));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectKeyMatches(r->key, g.request_decoded.at(2));
    EXPECT_FALSE(r->key.worker_id.has_value());
    EXPECT_EQ(r->tp_size, 1);
    EXPECT_EQ(KeyFrame(r->key), g.request[2]);
    EXPECT_EQ(EncodeRequestInt(r->tp_size), g.request[3]);
    if (std::string(name) == "cb_unified_lookup__loading") {
      // Loading: the handler returns None and the reference sends only [uid, op]. kvd
      // answers nil (c0) for None, which the 0.5.6 client reads the same way.
      EXPECT_EQ(g.response.size(), 2u);
      EXPECT_EQ(EncodeNil(), std::string("\xc0"));
      continue;
    }
    ASSERT_EQ(g.response.size(), 3u);
    const json& res = g.response_decoded.at(2);
    CbUnifiedLookupResult out;
    out.prefix_coverage_tokens = res.at("prefix_coverage_tokens").get<int64_t>();
    out.non_prefix_segments = MatchesOf(res.at("non_prefix_segments"));
    out.segmented_prefix_segments = MatchesOf(res.at("segmented_prefix_segments"));
    EXPECT_EQ(EncodeCbUnifiedLookupResult(out), g.response[2]);
  }
  // What the scenario found: a shifted match of the stored prompt's second chunk, a prefix
  // hit of its two chunks, and nothing.
  const json& hit = Find("cb_unified_lookup").response_decoded.at(2);
  EXPECT_EQ(hit.at("prefix_coverage_tokens"), 0);
  EXPECT_EQ(hit.at("non_prefix_segments").size(), 1u);
  EXPECT_EQ(Find("cb_unified_lookup__prefix").response_decoded.at(2).at("prefix_coverage_tokens"), 512);
  EXPECT_EQ(EncodeCbUnifiedLookupResult({}), Find("cb_unified_lookup__miss").response.at(2));
}

TEST(BlendGolden, HandshakeReorderAndUnregister) {
  for (const char* name : {"cb_protocol_handshake", "cb_protocol_handshake__mismatch"}) {
    SCOPED_TRACE(name);
    const Golden& g = Find(name);
    auto v = DecodeCbProtocolHandshake(Payloads(g));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, g.request_decoded.at(2).get<int64_t>());
    EXPECT_EQ(EncodeRequestInt(*v), g.request[2]);
    EXPECT_EQ(EncodeCbProtocolHandshake(*v), g.response.at(2));
  }
  EXPECT_EQ(Find("cb_protocol_handshake").response.at(2), std::string("\x92\x01\xc3"));

  for (const char* name : {"cb_reorder_plan", "cb_reorder_plan__keep"}) {
    SCOPED_TRACE(name);
    const Golden& g = Find(name);
    auto r = DecodeCbReorderPlan(Payloads(g));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectKeyMatches(r->key, g.request_decoded.at(2));
    EXPECT_EQ(r->keep_prefix, g.request_decoded.at(3).get<int64_t>());
    EXPECT_EQ(r->budget_ms, g.request_decoded.at(4).get<int64_t>());
    EXPECT_EQ(KeyFrame(r->key), g.request[2]);
    EXPECT_EQ(EncodeRequestInt(r->keep_prefix), g.request[3]);
    EXPECT_EQ(EncodeRequestInt(r->budget_ms), g.request[4]);
    const auto tokens = g.response_decoded.at(2).get<std::vector<uint32_t>>();
    EXPECT_EQ(EncodeCbReorderPlan(tokens), g.response.at(2));
  }
  // The planner put the cached prompt first: the reply is a permutation of the prompt.
  auto plan = Find("cb_reorder_plan").response_decoded.at(2).get<std::vector<int64_t>>();
  auto prompt = Find("cb_reorder_plan").request_decoded.at(2).at("token_ids").get<std::vector<int64_t>>();
  ASSERT_EQ(plan.size(), prompt.size());
  std::sort(plan.begin(), plan.end());
  std::sort(prompt.begin(), prompt.end());
  EXPECT_EQ(plan, prompt);
  EXPECT_EQ(Find("cb_reorder_plan__keep").response.at(2), std::string("\x90"));

  const Golden& u = Find("cb_unregister_rope");
  auto id = DecodeInstanceId(Payloads(u));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, u.request_decoded.at(2).get<int64_t>());
  EXPECT_EQ(*id, Find("cb_register_rope").request_decoded.at(2).get<int64_t>());
  EXPECT_EQ(u.response.size(), 2u);  // None: [uid, op] only
}

}  // namespace
}  // namespace kvd::wire
