// The request decoders of wire/codec.cc as they were before the streaming reader
// (msgpack-cxx object trees), kept only as the oracle of the differential fuzz target
// (stream_fuzzer.cc): for every input, the streaming decoders must accept exactly what
// these accepted, decode the same values and fail with the same message.
// Types: the same as wire/messages.h except that token ids are an int64 vector.
// GCC 12 reports a -Wrestrict false positive inside std::string concatenation here.
#pragma GCC diagnostic ignored "-Wrestrict"

#include "reference_decoders.h"

#include <msgpack.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvd::fuzz::reference {

using wire::DecodeLimits;
using wire::Frames;
using wire::FindOpById;
using wire::FindOpByName;
using wire::InfoOf;
using wire::Op;
using wire::OpInfo;

namespace {

using msgpack::object;
namespace mt = msgpack::type;

const DecodeLimits kLimits{};

// Parses one complete msgpack document; rejects trailing bytes.
Result<msgpack::object_handle> Parse(std::string_view bytes, const char* what) {
  // Every element takes at least one byte, so no document of n bytes holds an array of more
  // than n elements or a map of more than n/2 pairs. msgpack-cxx allocates an array's
  // elements when it reads the header, before their bytes arrive: without this cap a
  // 6-byte frame made it allocate 512 MiB (found by tests/fuzz, descriptor target).
  msgpack::unpack_limit limit(std::min(kLimits.max_array, bytes.size()),
                              std::min(kLimits.max_map, bytes.size() / 2), kLimits.max_str,
                              kLimits.max_bin, kLimits.max_ext, kLimits.max_depth);
  try {
    size_t off = 0;
    msgpack::object_handle oh =
        msgpack::unpack(bytes.data(), bytes.size(), off, nullptr, nullptr, limit);
    if (off != bytes.size()) {
      return Status::InvalidArgument(std::string(what) + ": trailing bytes after msgpack document");
    }
    return oh;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string(what) + ": malformed msgpack (" + e.what() + ")");
  }
}

std::string Where(std::string_view ctx, std::string_view field) {
  std::string s(ctx);
  if (!field.empty()) {
    s += '.';
    s += field;
  }
  return s;
}

Status TypeError(std::string_view ctx, std::string_view field, const char* expected) {
  return Status::InvalidArgument(Where(ctx, field) + ": expected " + expected);
}

Result<int64_t> ReadInt(const object& o, std::string_view ctx, std::string_view field) {
  if (o.type == mt::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::InvalidArgument(Where(ctx, field) + ": integer out of range");
    }
    return static_cast<int64_t>(o.via.u64);
  }
  if (o.type == mt::NEGATIVE_INTEGER) return o.via.i64;
  // The client coerces top-level int payloads from Python values; bool is an int there.
  if (o.type == mt::BOOLEAN) return static_cast<int64_t>(o.via.boolean);
  return TypeError(ctx, field, "integer");
}

Result<std::optional<int64_t>> ReadOptInt(const object& o, std::string_view ctx,
                                          std::string_view field) {
  if (o.type == mt::NIL) return std::optional<int64_t>();
  auto v = ReadInt(o, ctx, field);
  if (!v.ok()) return v.status();
  return std::optional<int64_t>(*v);
}

Result<bool> ReadBool(const object& o, std::string_view ctx, std::string_view field) {
  if (o.type == mt::BOOLEAN) return o.via.boolean;
  if (o.type == mt::POSITIVE_INTEGER) return o.via.u64 != 0;
  return TypeError(ctx, field, "bool");
}

Result<double> ReadFloat(const object& o, std::string_view ctx, std::string_view field) {
  if (o.type == mt::FLOAT32 || o.type == mt::FLOAT64) return o.via.f64;
  if (o.type == mt::POSITIVE_INTEGER) return static_cast<double>(o.via.u64);
  if (o.type == mt::NEGATIVE_INTEGER) return static_cast<double>(o.via.i64);
  return TypeError(ctx, field, "number");
}

Result<std::string> ReadStr(const object& o, std::string_view ctx, std::string_view field) {
  if (o.type == mt::STR) return std::string(o.via.str.ptr, o.via.str.size);
  return TypeError(ctx, field, "string");
}

Result<std::string> ReadBytes(const object& o, std::string_view ctx, std::string_view field) {
  if (o.type == mt::BIN) return std::string(o.via.bin.ptr, o.via.bin.size);
  if (o.type == mt::STR) return std::string(o.via.str.ptr, o.via.str.size);
  if (o.type == mt::NIL) return std::string();
  return TypeError(ctx, field, "bytes");
}

Result<std::vector<int64_t>> ReadIntArray(const object& o, std::string_view ctx,
                                          std::string_view field) {
  if (o.type != mt::ARRAY) return TypeError(ctx, field, "array of integers");
  std::vector<int64_t> out;
  out.resize(o.via.array.size);
  const object* p = o.via.array.ptr;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    // Token lists are long: keep the common non-negative case branch-light.
    if (p[i].type == mt::POSITIVE_INTEGER &&
        p[i].via.u64 <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      out[i] = static_cast<int64_t>(p[i].via.u64);
    } else if (p[i].type == mt::NEGATIVE_INTEGER) {
      out[i] = p[i].via.i64;
    } else {
      return Status::InvalidArgument(Where(ctx, field) + "[" + std::to_string(i) +
                                     "]: expected integer");
    }
  }
  return out;
}

// Field lookup in a msgpack map with string keys; nullptr if absent.
const object* Field(const object& map, std::string_view name) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const object& k = map.via.map.ptr[i].key;
    if (k.type == mt::STR && std::string_view(k.via.str.ptr, k.via.str.size) == name) {
      return &map.via.map.ptr[i].val;
    }
  }
  return nullptr;
}

Status RequireMap(const object& o, std::string_view ctx) {
  if (o.type != mt::MAP) return TypeError(ctx, "", "map");
  return Status::Ok();
}

// Reads a required field with `reader`; a missing field is an error naming it.
template <typename Reader>
auto Required(const object& map, std::string_view ctx, std::string_view name, Reader reader)
    -> decltype(reader(map, ctx, name)) {
  const object* f = Field(map, name);
  if (f == nullptr) return Status::InvalidArgument(Where(ctx, name) + ": missing field");
  return reader(*f, ctx, name);
}

#define KVD_ASSIGN(lhs, expr)              \
  do {                                     \
    auto _r = (expr);                      \
    if (!_r.ok()) return _r.status();      \
    lhs = std::move(_r).value();           \
  } while (0)

Result<RefCacheKey> ReadKey(const object& o, std::string_view ctx) {
  KVD_RETURN_IF_ERROR(RequireMap(o, ctx));
  RefCacheKey key;
  KVD_ASSIGN(key.model_name, Required(o, ctx, "model_name", ReadStr));
  KVD_ASSIGN(key.world_size, Required(o, ctx, "world_size", ReadInt));
  KVD_ASSIGN(key.worker_id, Required(o, ctx, "worker_id", ReadOptInt));
  KVD_ASSIGN(key.token_ids, Required(o, ctx, "token_ids", ReadIntArray));
  KVD_ASSIGN(key.start, Required(o, ctx, "start", ReadInt));
  KVD_ASSIGN(key.end, Required(o, ctx, "end", ReadInt));
  KVD_ASSIGN(key.request_id, Required(o, ctx, "request_id", ReadStr));
  if (const object* f = Field(o, "cache_salt"); f && f->type != mt::NIL) {
    KVD_ASSIGN(key.cache_salt, ReadStr(*f, ctx, "cache_salt"));
  }
  if (const object* f = Field(o, "num_kv_readers"); f && f->type != mt::NIL) {
    KVD_ASSIGN(key.num_kv_readers, ReadInt(*f, ctx, "num_kv_readers"));
  }
  // Identity checks that do not depend on server state.
  if (key.world_size < 1 || key.world_size > 4096) {
    return Status::InvalidArgument(std::string(ctx) + ".world_size: must be in [1, 4096], got " +
                                   std::to_string(key.world_size));
  }
  if (key.worker_id && (*key.worker_id < 0 || *key.worker_id >= key.world_size)) {
    return Status::InvalidArgument(std::string(ctx) + ".worker_id: " +
                                   std::to_string(*key.worker_id) + " not in [0, world_size " +
                                   std::to_string(key.world_size) + ")");
  }
  if (key.start < 0 || key.end < key.start ||
      key.end > static_cast<int64_t>(key.token_ids.size())) {
    return Status::InvalidArgument(std::string(ctx) + ": range [" + std::to_string(key.start) +
                                   ", " + std::to_string(key.end) + ") not within " +
                                   std::to_string(key.token_ids.size()) + " token ids");
  }
  if (key.cache_salt.size() > 128 ||
      key.cache_salt.find_first_of(std::string_view("@/\\\0", 4)) != std::string::npos) {
    return Status::InvalidArgument(std::string(ctx) +
                                   ".cache_salt: at most 128 chars, no '@', '/', '\\' or NUL");
  }
  if (key.model_name.find('@') != std::string::npos) {
    return Status::InvalidArgument(std::string(ctx) + ".model_name: must not contain '@'");
  }
  return key;
}

Result<std::vector<std::vector<int64_t>>> ReadBlockIds(const object& o, std::string_view ctx) {
  if (o.type != mt::ARRAY) return TypeError(ctx, "", "array");
  std::vector<std::vector<int64_t>> groups;
  // Clients before mid-2026 sent a flat list: treat it as one group.
  bool flat = o.via.array.size > 0 && o.via.array.ptr[0].type != mt::ARRAY;
  if (flat || o.via.array.size == 0) {
    KVD_ASSIGN(groups.emplace_back(), ReadIntArray(o, ctx, ""));
    return groups;
  }
  groups.reserve(o.via.array.size);
  for (uint32_t g = 0; g < o.via.array.size; ++g) {
    KVD_ASSIGN(groups.emplace_back(),
               ReadIntArray(o.via.array.ptr[g], ctx, "[" + std::to_string(g) + "]"));
  }
  return groups;
}

Status CheckArity(Frames payloads, Op op) {
  const OpInfo& info = InfoOf(op);
  if (payloads.size() < info.min_payloads || payloads.size() > info.max_payloads) {
    return Status::InvalidArgument(std::string(info.name) + ": expected " +
                                   std::to_string(info.min_payloads) +
                                   (info.min_payloads == info.max_payloads
                                        ? ""
                                        : ".." + std::to_string(info.max_payloads)) +
                                   " payload frames, got " + std::to_string(payloads.size()));
  }
  return Status::Ok();
}

}  // namespace

Result<const OpInfo*> DecodeOp(std::string_view op_frame) {
  auto oh = Parse(op_frame, "operation");
  if (!oh.ok()) return oh.status();
  const object& o = oh->get();
  const OpInfo* info = nullptr;
  if (o.type == mt::POSITIVE_INTEGER) {
    info = FindOpById(static_cast<int64_t>(o.via.u64));
    if (!info) return Status::NotFound("unknown operation id " + std::to_string(o.via.u64));
  } else if (o.type == mt::STR) {
    std::string_view name(o.via.str.ptr, o.via.str.size);
    info = FindOpByName(name);
    if (!info) return Status::NotFound("unknown operation '" + std::string(name.substr(0, 64)) + "'");
  } else {
    return Status::InvalidArgument("operation frame must be a msgpack int or str");
  }
  return info;
}

Result<int64_t> DecodeInstanceId(Frames p) {
  if (p.size() != 1) return Status::InvalidArgument("expected 1 payload frame (instance_id)");
  auto oh = Parse(p[0], "instance_id");
  if (!oh.ok()) return oh.status();
  return ReadInt(oh->get(), "instance_id", "");
}

namespace {
Result<RefTransferRequest> DecodeTransfer(Frames p, Op op) {
  KVD_RETURN_IF_ERROR(CheckArity(p, op));
  const char* name = op == Op::kStore ? "store" : "retrieve";
  RefTransferRequest r;
  {
    auto oh = Parse(p[0], name);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.key, ReadKey(oh->get(), std::string(name) + ".key"));
  }
  {
    auto oh = Parse(p[1], name);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.instance_id, ReadInt(oh->get(), name, "instance_id"));
  }
  {
    auto oh = Parse(p[2], name);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.block_ids, ReadBlockIds(oh->get(), std::string(name) + ".block_ids"));
  }
  {
    auto oh = Parse(p[3], name);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.event_handle, ReadBytes(oh->get(), name, "event_ipc_handle"));
  }
  if (op == Op::kRetrieve && p.size() > 4) {
    auto oh = Parse(p[4], name);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.skip_first_n_tokens, ReadInt(oh->get(), name, "skip_first_n_tokens"));
    if (r.skip_first_n_tokens < 0) {
      return Status::InvalidArgument("retrieve.skip_first_n_tokens: negative");
    }
  }
  if (!r.key.worker_id) {
    return Status::InvalidArgument(std::string(name) + ".key.worker_id: required (got nil)");
  }
  return r;
}
}  // namespace

Result<RefTransferRequest> DecodeStore(Frames p) { return DecodeTransfer(p, Op::kStore); }
Result<RefTransferRequest> DecodeRetrieve(Frames p) { return DecodeTransfer(p, Op::kRetrieve); }

Result<RefLookupRequest> DecodeLookup(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kLookup));
  RefLookupRequest r;
  auto oh = Parse(p[0], "lookup");
  if (!oh.ok()) return oh.status();
  KVD_ASSIGN(r.key, ReadKey(oh->get(), "lookup.key"));
  if (p.size() > 1) {
    auto tp = Parse(p[1], "lookup");
    if (!tp.ok()) return tp.status();
    KVD_ASSIGN(r.tp_size, ReadInt(tp->get(), "lookup", "tp_size"));
  }
  return r;
}

Result<std::string> DecodeRequestId(Frames p) {
  if (p.empty() || p.size() > 2) return Status::InvalidArgument("expected 1 payload frame (request_id)");
  auto oh = Parse(p[0], "request_id");
  if (!oh.ok()) return oh.status();
  return ReadStr(oh->get(), "request_id", "");
}

Result<std::pair<std::string, double>> DecodeWaitPrefetch(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kWaitPrefetchStatus));
  std::pair<std::string, double> r{"", 0.0};
  KVD_ASSIGN(r.first, DecodeRequestId(p.subspan(0, 1)));
  if (p.size() > 1) {
    auto oh = Parse(p[1], "wait_prefetch_status");
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.second, ReadFloat(oh->get(), "wait_prefetch_status", "timeout"));
    if (!std::isfinite(r.second) || r.second < 0) r.second = 0;
  }
  return r;
}

Result<std::optional<int64_t>> DecodePing(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kPing));
  if (p.empty()) return std::optional<int64_t>();
  auto oh = Parse(p[0], "ping");
  if (!oh.ok()) return oh.status();
  return ReadOptInt(oh->get(), "ping", "instance_id");
}

Result<bool> DecodeClear(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kClear));
  if (p.empty()) return false;
  auto oh = Parse(p[0], "clear");
  if (!oh.ok()) return oh.status();
  if (oh->get().type == mt::NIL) return false;
  return ReadBool(oh->get(), "clear", "force");
}

Result<RefEngineDrivenRequest> DecodeEngineDriven(Frames p) {
  if (p.size() < 2 || p.size() > 3) {
    return Status::InvalidArgument("expected 2..3 payload frames (key, instance_id[, data])");
  }
  RefEngineDrivenRequest r;
  {
    auto oh = Parse(p[0], "key");
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.key, ReadKey(oh->get(), "key"));
  }
  {
    auto oh = Parse(p[1], "instance_id");
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.instance_id, ReadInt(oh->get(), "instance_id", ""));
  }
  if (p.size() == 3) {
    auto oh = Parse(p[2], "data");
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.data, ReadBytes(oh->get(), "data", ""));
  }
  if (!r.key.worker_id) return Status::InvalidArgument("key.worker_id: required (got nil)");
  return r;
}


}  // namespace kvd::fuzz::reference
