// Fuzz target "payload": every msgpack payload decoder of wire/codec.h (CacheBlend's too).
//
// Each input is one or more messages [uid, op, payload...] (format: fuzz_common.h). The op
// frame goes through DecodeOp; the payload frames go through EVERY Decode* function, not
// only the op's own, so each decoder also sees the other ops' shapes. A decoder must either
// refuse the input or return a request that satisfies the contract the handlers rely on
// (checked below), and must never throw, crash or read out of bounds.
#include <cmath>
#include <string>

#include "fuzz_common.h"
#include "wire/codec.h"

namespace kvd::fuzz {
namespace {

void CheckKey(const wire::CacheKey& k) {
  Check(k.world_size >= 1 && k.world_size <= 4096, "key.world_size in [1, 4096]");
  Check(!k.worker_id || (*k.worker_id >= 0 && *k.worker_id < k.world_size),
        "key.worker_id in [0, world_size)");
  Check(k.start >= 0 && k.start <= k.end &&
            k.end <= static_cast<int64_t>(k.token_ids.size()),
        "key range within token_ids");
  Check(k.cache_salt.size() <= 128, "cache_salt at most 128 chars");
  Check(k.cache_salt.find_first_of(std::string_view("@/\\\0", 4)) == std::string::npos,
        "cache_salt has no '@', '/', '\\' or NUL");
  Check(k.model_name.find('@') == std::string::npos, "model_name has no '@'");
  Check(k.request_id.size() <= wire::kMaxRequestIdBytes, "request_id at most 1 KiB");
  Check(k.model_name.size() <= wire::kMaxStringFieldBytes, "model_name at most 4 KiB");
}

void CheckDescriptor(const wire::TensorDescriptor& d) {
  Check(d.shape.size() == d.stride.size() && d.shape.size() <= 8, "descriptor rank");
  for (size_t i = 0; i < d.shape.size(); ++i) {
    Check(d.shape[i] >= 0 && d.stride[i] >= 0, "descriptor shape/stride non-negative");
  }
  Check(d.storage_offset >= 0, "descriptor storage_offset non-negative");
}

void DecodeAll(wire::Frames p) {
  if (auto r = wire::DecodeRegisterKvCache(p); r.ok()) {
    for (const auto& t : r->tensors) CheckDescriptor(t);
  }
  (void)wire::DecodeInstanceId(p);
  if (auto r = wire::DecodeStore(p); r.ok()) {
    CheckKey(r->key);
    Check(r->key.worker_id.has_value(), "store key has a worker_id");
  }
  if (auto r = wire::DecodeRetrieve(p); r.ok()) {
    CheckKey(r->key);
    Check(r->key.worker_id.has_value(), "retrieve key has a worker_id");
    Check(r->skip_first_n_tokens >= 0, "retrieve skip_first_n_tokens non-negative");
  }
  if (auto r = wire::DecodeLookup(p); r.ok()) CheckKey(r->key);
  if (auto r = wire::DecodeRequestId(p); r.ok()) {
    Check(r->size() <= wire::kMaxRequestIdBytes, "request id at most 1 KiB");
  }
  if (auto r = wire::DecodeWaitPrefetch(p); r.ok()) {
    Check(r->first.size() <= wire::kMaxRequestIdBytes, "wait request id at most 1 KiB");
    Check(std::isfinite(r->second) && r->second >= 0, "wait timeout finite, non-negative");
  }
  (void)wire::DecodePing(p);
  (void)wire::DecodeClear(p);
  (void)wire::DecodeRegisterEngineDriven(p);
  if (auto r = wire::DecodeEngineDriven(p); r.ok()) {
    CheckKey(r->key);
    Check(r->key.worker_id.has_value(), "engine-driven key has a worker_id");
  }
  if (auto r = wire::DecodeReportBlockAllocation(p); r.ok()) {
    Check(r->model_name.size() <= wire::kMaxStringFieldBytes, "model_name at most 4 KiB");
    for (const auto& rec : r->records) {
      Check(rec.req_id.size() <= wire::kMaxRequestIdBytes, "req_id at most 1 KiB");
    }
  }
  CheckBlendDecoders(p, nullptr);  // every CacheBlend decoder (fuzz_common.cc)
  if (auto r = wire::DecodeSubscribeKvEvents(p); r.ok()) {
    // Whatever decodes must encode back into one well-formed batch message.
    wire::KvEventBatch b;
    b.next_cursor = r->cursor;
    (void)wire::EncodeKvEventBatch(b);
  }
}

}  // namespace
}  // namespace kvd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvd;
  using namespace kvd::fuzz;
  for (const Message& m : ParseInput(data, size)) {
    if (m.size() >= 2) (void)wire::DecodeOp(m[1]);
    size_t first = m.size() >= 2 ? 2 : 0;
    fuzz::DecodeAll(wire::Frames(m.data() + first, m.size() - first));
    // Reply encoders: what goes out is one document that reads back as what went in.
    std::string s = wire::EncodeStr(m[0]);
    Check(IsOneMsgpackDocument(s), "EncodeStr yields one document");
    Check(IsOneMsgpackDocument(wire::EncodeHandleAndOk(m[0], true)),
          "EncodeHandleAndOk yields one document");
  }
  return 0;
}
