// Decoding follows the client's msgspec encoding: dataclasses and Structs are maps
// keyed by field name; tagged Structs carry their tag under "type"; bytes are bin;
// None is nil. Every reader below checks the msgpack type before touching a value.
//
// This file decodes the structured, rare requests (registrations incl. CacheBlend's
// cb_register_rope, block-allocation reports, ext-1 descriptors) through msgpack-cxx object
// trees, and encodes replies. The request path (op frame, cache keys and their token arrays,
// block ids, CacheBlend match results, scalar frames) is in request_decoders.cc, read in one
// pass without an object tree.
#include "wire/codec.h"

#include "wire/codec_internal.h"
#include "wire/msgpack_writer.h"

#include <msgpack.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvd::wire {
namespace {

using msgpack::object;
namespace mt = msgpack::type;
using internal::CheckArity;
using internal::kLimits;
using internal::Malformed;
using internal::TrailingBytes;
using internal::TypeError;
using internal::Where;

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
    if (off != bytes.size()) return TrailingBytes(what);
    return oh;
  } catch (const std::exception& e) {
    return Malformed(what, e.what());
  }
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

Result<std::string> ReadStr(const object& o, std::string_view ctx, std::string_view field) {
  if (o.type != mt::STR) return TypeError(ctx, field, "string");
  if (o.via.str.size > kMaxStringFieldBytes) {
    return Status::InvalidArgument(Where(ctx, field) + ": at most " +
                                   std::to_string(kMaxStringFieldBytes) + " bytes, got " +
                                   std::to_string(o.via.str.size));
  }
  return std::string(o.via.str.ptr, o.via.str.size);
}

// A request id: a string of at most kMaxRequestIdBytes.
Result<std::string> ReadRequestId(const object& o, std::string_view ctx, std::string_view field) {
  std::string id;
  KVD_ASSIGN(id, ReadStr(o, ctx, field));
  if (id.size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument(Where(ctx, field) + ": at most " +
                                   std::to_string(kMaxRequestIdBytes) + " bytes, got " +
                                   std::to_string(id.size()));
  }
  return id;
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

Result<LayoutHints> ReadLayoutHints(const object& o) {
  LayoutHints h;
  if (o.type == mt::NIL) return h;
  KVD_RETURN_IF_ERROR(RequireMap(o, "layout_hints"));
  if (const object* f = Field(o, "kv_layout"); f && f->type != mt::NIL) {
    KVD_ASSIGN(h.kv_layout, ReadStr(*f, "layout_hints", "kv_layout"));
  }
  if (const object* f = Field(o, "kv_list_layout"); f && f->type != mt::NIL) {
    KVD_ASSIGN(h.kv_list_layout, ReadStr(*f, "layout_hints", "kv_list_layout"));
  }
  if (const object* f = Field(o, "num_kv_heads"); f) KVD_ASSIGN(h.num_kv_heads, ReadOptInt(*f, "layout_hints", "num_kv_heads"));
  if (const object* f = Field(o, "tokens_per_block"); f) KVD_ASSIGN(h.tokens_per_block, ReadOptInt(*f, "layout_hints", "tokens_per_block"));
  if (const object* f = Field(o, "head_dim"); f) KVD_ASSIGN(h.head_dim, ReadOptInt(*f, "layout_hints", "head_dim"));
  return h;
}

Result<EngineGroupInfo> ReadGroupInfo(const object& o, std::string_view ctx) {
  KVD_RETURN_IF_ERROR(RequireMap(o, ctx));
  EngineGroupInfo g;
  KVD_ASSIGN(g.engine_group_id, Required(o, ctx, "engine_group_id", ReadInt));
  if (const object* f = Field(o, "layer_indices")) KVD_ASSIGN(g.layer_indices, ReadIntArray(*f, ctx, "layer_indices"));
  if (const object* f = Field(o, "tokens_per_block")) KVD_ASSIGN(g.tokens_per_block, ReadInt(*f, ctx, "tokens_per_block"));
  if (const object* f = Field(o, "sw_size_tokens")) KVD_ASSIGN(g.sw_size_tokens, ReadInt(*f, ctx, "sw_size_tokens"));
  if (const object* f = Field(o, "extra_object_group_tag")) KVD_ASSIGN(g.extra_object_group_tag, ReadInt(*f, ctx, "extra_object_group_tag"));
  if (const object* f = Field(o, "recurrent_state")) KVD_ASSIGN(g.recurrent_state, ReadBool(*f, ctx, "recurrent_state"));
  return g;
}

Result<TensorDescriptor> ReadTensorMetadata(const object& o, TensorDescriptor d) {
  constexpr std::string_view ctx = "ipc_descriptor.metadata";
  KVD_RETURN_IF_ERROR(RequireMap(o, ctx));
  KVD_ASSIGN(d.dtype, Required(o, ctx, "dtype", ReadStr));
  KVD_ASSIGN(d.shape, Required(o, ctx, "shape", ReadIntArray));
  KVD_ASSIGN(d.stride, Required(o, ctx, "stride", ReadIntArray));
  KVD_ASSIGN(d.storage_offset, Required(o, ctx, "storage_offset", ReadInt));
  KVD_ASSIGN(d.device_uuid, Required(o, ctx, "device_uuid", ReadStr));
  if (d.shape.size() != d.stride.size() || d.shape.size() > 8) {
    return Status::InvalidArgument(std::string(ctx) + ": shape and stride must have the same rank (<= 8)");
  }
  for (size_t i = 0; i < d.shape.size(); ++i) {
    if (d.shape[i] < 0 || d.stride[i] < 0) {
      return Status::InvalidArgument(std::string(ctx) + ": negative shape or stride");
    }
  }
  if (d.storage_offset < 0) return Status::InvalidArgument(std::string(ctx) + ": negative storage_offset");
  return d;
}

// A list of ext-1 device IPC descriptors (register_kv_cache's kv_cache, cb_register_rope's
// cos/sin caches).
Result<std::vector<TensorDescriptor>> ReadDescriptorList(const object& o, std::string_view ctx,
                                                         std::string_view field) {
  if (o.type != mt::ARRAY) return TypeError(ctx, field, "array");
  std::vector<TensorDescriptor> out;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    const object& e = o.via.array.ptr[i];
    const std::string at = Where(ctx, field) + "[" + std::to_string(i) + "]";
    if (e.type != mt::EXT || e.via.ext.type() != 1) {
      return Status::InvalidArgument(at + ": expected msgpack ext type 1 (device IPC descriptor)");
    }
    auto d = DecodeTensorDescriptor(std::string_view(e.via.ext.data(), e.via.ext.size));
    if (!d.ok()) return Status::InvalidArgument(at + ": " + d.status().message());
    out.push_back(std::move(d).value());
  }
  return out;
}

}  // namespace

Result<TensorDescriptor> DecodeTensorDescriptor(std::string_view ext_data) {
  auto oh = Parse(ext_data, "ipc_descriptor");
  if (!oh.ok()) return oh.status();
  const object& o = oh->get();
  constexpr std::string_view ctx = "ipc_descriptor";
  KVD_RETURN_IF_ERROR(RequireMap(o, ctx));
  std::string tag;
  KVD_ASSIGN(tag, Required(o, ctx, "type", ReadStr));
  int64_t version = 0;
  KVD_ASSIGN(version, Required(o, ctx, "version", ReadInt));
  if (version != 1) {
    return Status::InvalidArgument("ipc_descriptor: unsupported version " + std::to_string(version));
  }
  const object* meta = Field(o, "metadata");
  if (!meta) return Status::InvalidArgument("ipc_descriptor.metadata: missing field");
  TensorDescriptor d;
  if (tag == "cpu_shm") {
    d.memory = TensorMemory::kCpuShm;
    KVD_ASSIGN(d.shm_name, Required(o, ctx, "shm_name", ReadStr));
    int64_t nbytes = 0;
    KVD_ASSIGN(nbytes, Required(o, ctx, "nbytes", ReadInt));
    if (nbytes < 0) return Status::InvalidArgument("ipc_descriptor.nbytes: negative");
    d.nbytes = static_cast<uint64_t>(nbytes);
  } else if (tag == "cuda") {
    d.memory = TensorMemory::kCuda;
    const object* h = Field(o, "handle");
    if (!h || h->type != mt::ARRAY || h->via.array.size != 8) {
      return Status::InvalidArgument("ipc_descriptor.handle: expected an 8-tuple");
    }
    const object* t = h->via.array.ptr;
    int64_t v = 0;
    KVD_ASSIGN(d.cuda_device_index, ReadInt(t[0], ctx, "handle[0]"));
    KVD_ASSIGN(d.cuda_mem_handle, ReadBytes(t[1], ctx, "handle[1]"));
    KVD_ASSIGN(v, ReadInt(t[2], ctx, "handle[2]"));
    d.cuda_storage_size = static_cast<uint64_t>(v);
    KVD_ASSIGN(v, ReadInt(t[3], ctx, "handle[3]"));
    d.cuda_storage_offset_bytes = static_cast<uint64_t>(v);
    KVD_ASSIGN(d.cuda_event_handle, ReadBytes(t[6], ctx, "handle[6]"));
    KVD_ASSIGN(d.cuda_event_sync_required, ReadBool(t[7], ctx, "handle[7]"));
    d.nbytes = d.cuda_storage_size;
  } else if (tag == "cuda_raw") {
    d.memory = TensorMemory::kCudaRaw;
    KVD_ASSIGN(d.raw_ipc_handle, Required(o, ctx, "ipc_handle", ReadBytes));
    if (d.raw_ipc_handle.size() != 64) {
      return Status::InvalidArgument("ipc_descriptor.ipc_handle: expected 64 bytes");
    }
    int64_t v = 0;
    KVD_ASSIGN(v, Required(o, ctx, "alloc_offset", ReadInt));
    d.raw_alloc_offset = static_cast<uint64_t>(v);
    KVD_ASSIGN(v, Required(o, ctx, "nbytes", ReadInt));
    d.nbytes = static_cast<uint64_t>(v);
  } else {
    return Status::InvalidArgument("ipc_descriptor: unsupported wrapper type '" +
                                   tag.substr(0, 32) +
                                   "' (kvd accepts cpu_shm, cuda and cuda_raw)");
  }
  return ReadTensorMetadata(*meta, std::move(d));
}

Result<RegisterKvCacheRequest> DecodeRegisterKvCache(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kRegisterKvCache));
  RegisterKvCacheRequest r;
  std::vector<msgpack::object_handle> docs;
  for (size_t i = 0; i < p.size(); ++i) {
    auto oh = Parse(p[i], "register_kv_cache payload");
    if (!oh.ok()) return oh.status();
    docs.push_back(std::move(oh).value());
  }
  KVD_ASSIGN(r.instance_id, ReadInt(docs[0].get(), "register_kv_cache", "instance_id"));
  KVD_ASSIGN(r.tensors, ReadDescriptorList(docs[1].get(), "register_kv_cache", "kv_cache"));
  KVD_ASSIGN(r.model_name, ReadStr(docs[2].get(), "register_kv_cache", "model_name"));
  KVD_ASSIGN(r.world_size, ReadInt(docs[3].get(), "register_kv_cache", "world_size"));
  const object& et = docs[4].get();
  if (et.type == mt::STR) {
    r.engine_type.assign(et.via.str.ptr, et.via.str.size);
  } else if (et.type == mt::POSITIVE_INTEGER) {
    r.engine_type = std::to_string(et.via.u64);
  }
  KVD_ASSIGN(r.layout_hints, ReadLayoutHints(docs[5].get()));
  const object& gi = docs[6].get();
  if (gi.type != mt::ARRAY) return TypeError("register_kv_cache", "engine_group_infos", "array");
  for (uint32_t i = 0; i < gi.via.array.size; ++i) {
    KVD_ASSIGN(r.group_infos.emplace_back(),
               ReadGroupInfo(gi.via.array.ptr[i],
                             "register_kv_cache.engine_group_infos[" + std::to_string(i) + "]"));
  }
  return r;
}

Result<RegisterEngineDrivenRequest> DecodeRegisterEngineDriven(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kRegisterEngineDrivenContext));
  auto oh = Parse(p[0], "register_kv_cache_engine_driven_context");
  if (!oh.ok()) return oh.status();
  const object& o = oh->get();
  constexpr std::string_view ctx = "register_kv_cache_engine_driven_context";
  KVD_RETURN_IF_ERROR(RequireMap(o, ctx));
  RegisterEngineDrivenRequest r;
  KVD_ASSIGN(r.instance_id, Required(o, ctx, "instance_id", ReadInt));
  KVD_ASSIGN(r.model_name, Required(o, ctx, "model_name", ReadStr));
  KVD_ASSIGN(r.world_size, Required(o, ctx, "world_size", ReadInt));
  KVD_ASSIGN(r.block_size, Required(o, ctx, "block_size", ReadInt));
  KVD_ASSIGN(r.num_layers, Required(o, ctx, "num_layers", ReadInt));
  KVD_ASSIGN(r.hidden_dim_size, Required(o, ctx, "hidden_dim_size", ReadInt));
  KVD_ASSIGN(r.dtype_str, Required(o, ctx, "dtype_str", ReadStr));
  KVD_ASSIGN(r.use_mla, Required(o, ctx, "use_mla", ReadBool));
  if (const object* f = Field(o, "num_physical_slots")) {
    KVD_ASSIGN(r.num_physical_slots, ReadOptInt(*f, ctx, "num_physical_slots"));
  }
  return r;
}

Result<ReportBlockAllocationRequest> DecodeReportBlockAllocation(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kReportBlockAllocation));
  ReportBlockAllocationRequest r;
  std::vector<msgpack::object_handle> docs;
  for (auto f : p) {
    auto oh = Parse(f, "report_block_allocation");
    if (!oh.ok()) return oh.status();
    docs.push_back(std::move(oh).value());
  }
  KVD_ASSIGN(r.instance_id, ReadInt(docs[0].get(), "report_block_allocation", "instance_id"));
  KVD_ASSIGN(r.model_name, ReadStr(docs[1].get(), "report_block_allocation", "model_name"));
  const object& recs = docs[2].get();
  if (recs.type != mt::ARRAY) return TypeError("report_block_allocation", "records", "array");
  for (uint32_t i = 0; i < recs.via.array.size; ++i) {
    const object& o = recs.via.array.ptr[i];
    constexpr std::string_view ctx = "report_block_allocation.records[]";
    KVD_RETURN_IF_ERROR(RequireMap(o, ctx));
    BlockAllocationRecord rec;
    KVD_ASSIGN(rec.req_id, Required(o, ctx, "req_id", ReadRequestId));
    KVD_ASSIGN(rec.new_block_ids, Required(o, ctx, "new_block_ids", ReadIntArray));
    KVD_ASSIGN(rec.new_token_ids, Required(o, ctx, "new_token_ids", ReadIntArray));
    r.records.push_back(std::move(rec));
  }
  return r;
}

Result<SubscribeKvEventsRequest> DecodeSubscribeKvEvents(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kSubscribeKvEvents));
  constexpr const char* ctx = "subscribe_kv_events";
  SubscribeKvEventsRequest r;
  auto field = [&](size_t i) { return Parse(p[i], ctx); };
  {
    auto oh = field(0);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.instance_id, ReadInt(oh->get(), ctx, "instance_id"));
  }
  {
    auto oh = field(1);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.model_name, ReadStr(oh->get(), ctx, "model_name"));
  }
  {
    auto oh = field(2);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.cursor, ReadInt(oh->get(), ctx, "cursor"));
  }
  {
    auto oh = field(3);
    if (!oh.ok()) return oh.status();
    KVD_ASSIGN(r.max_events, ReadInt(oh->get(), ctx, "max_events"));
  }
  return r;
}

Result<CbRegisterRopeRequest> DecodeCbRegisterRope(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kCbRegisterRope));
  constexpr std::string_view ctx = "cb_register_rope";
  std::vector<msgpack::object_handle> docs;
  for (auto f : p) {
    auto oh = Parse(f, "cb_register_rope payload");
    if (!oh.ok()) return oh.status();
    docs.push_back(std::move(oh).value());
  }
  // A list parameter the client passed as None arrives as nil: read as empty.
  auto int_list = [&](const object& o, std::string_view field) -> Result<std::vector<int64_t>> {
    if (o.type == mt::NIL) return std::vector<int64_t>();
    return ReadIntArray(o, ctx, field);
  };
  CbRegisterRopeRequest r;
  KVD_ASSIGN(r.instance_id, ReadInt(docs[0].get(), ctx, "instance_id"));
  if (docs[1].get().type != mt::NIL) {
    KVD_ASSIGN(r.cos_sin_caches, ReadDescriptorList(docs[1].get(), ctx, "cos_sin_caches_ipc"));
  }
  KVD_ASSIGN(r.head_size, ReadInt(docs[2].get(), ctx, "head_size"));
  KVD_ASSIGN(r.is_neox_style, ReadBool(docs[3].get(), ctx, "is_neox_style"));
  KVD_ASSIGN(r.group_to_cache, int_list(docs[4].get(), "group_to_cache"));
  // group_rot: per engine group [offset, width], or [] / nil for "skip this group". The
  // entries are checked below, after group_to_cache and kv_quant, in lmcache's order.
  std::vector<std::vector<int64_t>> rot;
  const object& gr = docs[5].get();
  if (gr.type != mt::NIL) {
    if (gr.type != mt::ARRAY) return TypeError(ctx, "group_rot", "array");
    for (uint32_t i = 0; i < gr.via.array.size; ++i) {
      const object& e = gr.via.array.ptr[i];
      if (e.type == mt::NIL) {
        rot.emplace_back();
        continue;
      }
      KVD_ASSIGN(rot.emplace_back(), ReadIntArray(e, ctx, "group_rot[" + std::to_string(i) + "]"));
    }
  }
  KVD_ASSIGN(r.group_head_size, int_list(docs[6].get(), "group_head_size"));
  if (p.size() > 7 && docs[7].get().type != mt::NIL) {
    KVD_ASSIGN(r.kv_quant, ReadStr(docs[7].get(), ctx, "kv_quant"));
  }

  const int64_t caches = static_cast<int64_t>(r.cos_sin_caches.size());
  for (size_t i = 0; i < r.group_to_cache.size(); ++i) {
    const int64_t c = r.group_to_cache[i];
    if (c < -1 || c >= caches) {
      return Status::InvalidArgument("cb_register_rope.group_to_cache[" + std::to_string(i) +
                                     "]: " + std::to_string(c) + " is outside [-1, " +
                                     std::to_string(caches) + ") for the " +
                                     std::to_string(caches) + " cos/sin cache(s) sent");
    }
  }
  if (!r.kv_quant.empty() && r.kv_quant != "fp8_e4m3" && r.kv_quant != "fp8_e5m2") {
    return Status::InvalidArgument("cb_register_rope.kv_quant: '" + r.kv_quant.substr(0, 32) +
                                   "' is not one of 'fp8_e4m3', 'fp8_e5m2' or ''");
  }
  r.group_rot.reserve(rot.size());
  for (size_t i = 0; i < rot.size(); ++i) {
    if (rot[i].empty()) {
      r.group_rot.emplace_back(std::nullopt);
      continue;
    }
    if (rot[i].size() != 2 || rot[i][0] < 0 || rot[i][1] <= 0) {
      return Status::InvalidArgument("cb_register_rope.group_rot[" + std::to_string(i) +
                                     "]: expected [offset >= 0, width > 0], or [] to skip the group");
    }
    r.group_rot.emplace_back(RopeWindow{rot[i][0], rot[i][1]});
  }
  return r;
}

// ---- encoders -------------------------------------------------------------------

namespace {
template <typename Fn>
std::string Pack(Fn&& fn) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  fn(pk);
  return std::string(buf.data(), buf.size());
}

void PackStr(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackSlots(msgpack::packer<msgpack::sbuffer>& pk, std::span<const ShmSlot> slots) {
  pk.pack_array(static_cast<uint32_t>(slots.size()));
  for (const auto& s : slots) {
    pk.pack_map(4);
    PackStr(pk, "offset");
    pk.pack_uint64(s.offset);
    PackStr(pk, "length");
    pk.pack_uint64(s.length);
    PackStr(pk, "shape");
    pk.pack_array(static_cast<uint32_t>(s.shape.size()));
    for (int64_t d : s.shape) pk.pack_int64(d);
    PackStr(pk, "dtype");
    PackStr(pk, s.dtype);
  }
}
}  // namespace

std::string EncodeNil() { return std::string(1, '\xc0'); }
std::string EncodeBool(bool v) { return std::string(1, v ? '\xc3' : '\xc2'); }
std::string EncodeInt(int64_t v) {
  internal::MsgpackWriter w(9);  // at most 9 bytes: stays in the string's inline buffer
  w.Int(v);
  return w.Take();
}
std::string EncodeOptionalInt(std::optional<int64_t> v) { return v ? EncodeInt(*v) : EncodeNil(); }
std::string EncodeStr(std::string_view v) {
  internal::MsgpackWriter w(v.size() + 5);
  w.Str(v);
  return w.Take();
}
std::string EncodeStrList(std::span<const std::string> v) {
  return Pack([&](auto& pk) {
    pk.pack_array(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) PackStr(pk, s);
  });
}
std::string EncodeHandleAndOk(std::string_view event_handle, bool ok) {
  internal::MsgpackWriter w(event_handle.size() + 8);
  w.Array(2);
  w.Bin(event_handle);
  w.Bool(ok);
  return w.Take();
}
std::string EncodeRegisterEngineDrivenResponse(std::string_view shm_name, uint64_t pool_size) {
  return Pack([&](auto& pk) {
    pk.pack_map(2);
    PackStr(pk, "shm_name");
    PackStr(pk, shm_name);
    PackStr(pk, "pool_size");
    pk.pack_uint64(pool_size);
  });
}
std::string EncodePrepareStoreResponse(const std::optional<std::vector<ShmSlot>>& slots,
                                       std::span<const int64_t> chunk_indices) {
  return Pack([&](auto& pk) {
    pk.pack_map(1);
    PackStr(pk, "context");
    if (!slots) {
      pk.pack_map(0);
      return;
    }
    pk.pack_map(2);
    PackStr(pk, "slots");
    PackSlots(pk, *slots);
    PackStr(pk, "chunk_indices");
    pk.pack_array(static_cast<uint32_t>(chunk_indices.size()));
    for (int64_t c : chunk_indices) pk.pack_int64(c);
  });
}
std::string EncodePrepareRetrieveResponse(bool success, std::span<const ShmSlot> slots) {
  return Pack([&](auto& pk) {
    pk.pack_map(3);
    PackStr(pk, "success");
    if (success) pk.pack_true(); else pk.pack_false();
    PackStr(pk, "data");
    pk.pack_bin(0);
    PackStr(pk, "context");
    if (!success) {
      pk.pack_map(0);
      return;
    }
    pk.pack_map(1);
    PackStr(pk, "slots");
    PackSlots(pk, slots);
  });
}

std::string EncodeKvEventBatch(const KvEventBatch& batch) {
  auto bin = [](auto& pk, const std::array<uint8_t, 32>& h) {
    pk.pack_bin(32);
    pk.pack_bin_body(reinterpret_cast<const char*>(h.data()), 32);
  };
  return Pack([&](auto& pk) {
    pk.pack_map(5);
    PackStr(pk, "enabled");
    if (batch.enabled) pk.pack_true(); else pk.pack_false();
    PackStr(pk, "incarnation");
    pk.pack_int64(batch.incarnation);
    PackStr(pk, "next_cursor");
    pk.pack_int64(batch.next_cursor);
    PackStr(pk, "lost");
    if (batch.lost) pk.pack_true(); else pk.pack_false();
    PackStr(pk, "events");
    pk.pack_array(static_cast<uint32_t>(batch.events.size()));
    for (const auto& e : batch.events) {
      pk.pack_map(7);
      PackStr(pk, "seq");
      pk.pack_int64(e.seq);
      PackStr(pk, "kind");
      PackStr(pk, e.kind);
      PackStr(pk, "medium");
      PackStr(pk, e.medium);
      PackStr(pk, "model_name");
      PackStr(pk, e.model_name);
      PackStr(pk, "block_hashes");
      pk.pack_array(static_cast<uint32_t>(e.block_hashes.size()));
      for (const auto& h : e.block_hashes) bin(pk, h);
      PackStr(pk, "parent_block_hash");
      if (e.parent_block_hash) bin(pk, *e.parent_block_hash); else pk.pack_nil();
      PackStr(pk, "token_ids");
      pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
      for (uint32_t t : e.token_ids) pk.pack_uint32(t);
    }
  });
}

std::string EncodeCbProtocolHandshake(int64_t client_version) {
  internal::MsgpackWriter w(16);
  w.Array(2);
  w.Int(kCbProtocolVersion);
  w.Bool(client_version == kCbProtocolVersion);
  return w.Take();
}

namespace internal {
void WriteCbMatchResults(MsgpackWriter& w, std::span<const CbMatchResult> matches) {
  w.Array(matches.size());
  for (const CbMatchResult& m : matches) {
    w.Map(5);
    w.Str("old_st");
    w.Int(m.old_st);
    w.Str("old_ed");
    w.Int(m.old_ed);
    w.Str("cur_st");
    w.Int(m.cur_st);
    w.Str("cur_ed");
    w.Int(m.cur_ed);
    w.Str("hash");
    w.Bin(m.hash);
  }
}
}  // namespace internal

std::string EncodeCbUnifiedLookupResult(const CbUnifiedLookupResult& result) {
  // ~90 bytes per match with a 32-byte hash.
  internal::MsgpackWriter w(96 + 96 * (result.non_prefix_segments.size() +
                                       result.segmented_prefix_segments.size()));
  w.Map(3);
  w.Str("prefix_coverage_tokens");
  w.Int(result.prefix_coverage_tokens);
  w.Str("non_prefix_segments");
  internal::WriteCbMatchResults(w, result.non_prefix_segments);
  w.Str("segmented_prefix_segments");
  internal::WriteCbMatchResults(w, result.segmented_prefix_segments);
  return w.Take();
}

std::string EncodeCbReorderPlan(std::span<const uint32_t> token_ids) {
  internal::MsgpackWriter w(5 + 5 * token_ids.size());
  w.Array(token_ids.size());
  for (uint32_t t : token_ids) w.Int(t);
  return w.Take();
}

}  // namespace kvd::wire
