// Fuzz target "stream": the streaming request decoders (wire/request_decoders.cc, on
// wire/msgpack_reader.h) against the object-tree decoders they replaced
// (reference_decoders.cc), on the same frames.
//
// Each input is one or more messages [uid, op, payload...] (format: fuzz_common.h). The op
// frame goes through both DecodeOp; the payload frames through both versions of every
// request-path decoder (LOOKUP/FREE_LOOKUP_LOCKS, STORE, RETRIEVE, engine-driven ops,
// request ids, WAIT, PING, CLEAR, instance ids). Invariant: both accept exactly the same
// inputs, decode the same values (token ids: the same values where they fit in uint32 and
// the same first out-of-range index and value) and fail with the same code and message.
#include <limits>
#include <string>

#include "fuzz_common.h"
#include "reference_decoders.h"
#include "wire/codec.h"

namespace kvd::fuzz {
namespace {

void SameStatus(const Status& got, const Status& want, const char* what) {
  if (got.code() != want.code() || got.message() != want.message()) {
    std::fprintf(stderr, "%s: streaming '%s' vs reference '%s'\n", what, got.ToString().c_str(),
                 want.ToString().c_str());
    Check(false, "streaming and reference decoders disagree on the status");
  }
}

void SameKey(const wire::CacheKey& k, const reference::RefCacheKey& r) {
  Check(k.model_name == r.model_name, "key.model_name");
  Check(k.world_size == r.world_size, "key.world_size");
  Check(k.worker_id == r.worker_id, "key.worker_id");
  Check(k.start == r.start && k.end == r.end, "key range");
  Check(k.request_id == r.request_id, "key.request_id");
  Check(k.cache_salt == r.cache_salt, "key.cache_salt");
  Check(k.num_kv_readers == r.num_kv_readers, "key.num_kv_readers");
  Check(k.token_ids.size() == r.token_ids.size(), "token count");
  std::optional<size_t> first_bad;
  for (size_t i = 0; i < r.token_ids.size(); ++i) {
    const int64_t v = r.token_ids[i];
    if (v >= 0 && v <= int64_t{0xFFFFFFFF}) {
      Check(k.token_ids[i] == static_cast<uint32_t>(v), "token value");
    } else if (!first_bad) {
      first_bad = i;
    }
  }
  const auto& bad = k.token_ids.first_out_of_range();
  Check(bad.has_value() == first_bad.has_value(), "out-of-range token noted");
  if (bad) {
    Check(bad->index == *first_bad, "first out-of-range index");
    Check(bad->value == r.token_ids[*first_bad], "first out-of-range value");
  }
}

template <typename Got, typename Want, typename Same>
void Compare(const Result<Got>& got, const Result<Want>& want, const char* what, Same same) {
  SameStatus(got.status(), want.status(), what);
  if (got.ok()) same(*got, *want);
}

void CompareAll(wire::Frames p) {
  Compare(wire::DecodeLookup(p), reference::DecodeLookup(p), "lookup",
          [](const auto& g, const auto& w) {
            SameKey(g.key, w.key);
            Check(g.tp_size == w.tp_size, "lookup tp_size");
          });
  auto transfer = [](const auto& g, const auto& w) {
    SameKey(g.key, w.key);
    Check(g.instance_id == w.instance_id, "transfer instance_id");
    Check(g.block_ids == w.block_ids, "transfer block_ids");
    Check(g.event_handle == w.event_handle, "transfer event_handle");
    Check(g.skip_first_n_tokens == w.skip_first_n_tokens, "transfer skip");
  };
  Compare(wire::DecodeStore(p), reference::DecodeStore(p), "store", transfer);
  Compare(wire::DecodeRetrieve(p), reference::DecodeRetrieve(p), "retrieve", transfer);
  Compare(wire::DecodeEngineDriven(p), reference::DecodeEngineDriven(p), "engine_driven",
          [](const auto& g, const auto& w) {
            SameKey(g.key, w.key);
            Check(g.instance_id == w.instance_id, "engine-driven instance_id");
            Check(g.data == w.data, "engine-driven data");
          });
  Compare(wire::DecodeRequestId(p), reference::DecodeRequestId(p), "request_id",
          [](const auto& g, const auto& w) { Check(g == w, "request id"); });
  Compare(wire::DecodeWaitPrefetch(p), reference::DecodeWaitPrefetch(p), "wait",
          [](const auto& g, const auto& w) {
            Check(g.first == w.first, "wait request id");
            Check(g.second == w.second, "wait timeout");
          });
  Compare(wire::DecodePing(p), reference::DecodePing(p), "ping",
          [](const auto& g, const auto& w) { Check(g == w, "ping instance id"); });
  Compare(wire::DecodeClear(p), reference::DecodeClear(p), "clear",
          [](const auto& g, const auto& w) { Check(g == w, "clear force"); });
  Compare(wire::DecodeInstanceId(p), reference::DecodeInstanceId(p), "instance_id",
          [](const auto& g, const auto& w) { Check(g == w, "instance id"); });
}

}  // namespace
}  // namespace kvd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvd;
  using namespace kvd::fuzz;
  for (const Message& m : ParseInput(data, size)) {
    for (std::string_view f : m) {
      Compare(wire::DecodeOp(f), reference::DecodeOp(f), "op",
              [](const auto& g, const auto& w) { Check(g == w, "op info"); });
    }
    const size_t first = m.size() >= 2 ? 2 : 0;
    CompareAll(wire::Frames(m.data() + first, m.size() - first));
    if (first) CompareAll(wire::Frames(m.data(), m.size()));  // frames as payloads, shifted
  }
  return 0;
}
