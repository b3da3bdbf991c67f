// Client-side encoders (see request_encoder.h), on the msgpack writer of
// wire/msgpack_writer.h (msgspec's choices of encoding).
#include "wire/request_encoder.h"

#include "wire/codec_internal.h"
#include "wire/msgpack_writer.h"

namespace kvd::wire {
using internal::MsgpackWriter;

std::string EncodeRequestInt(int64_t v) {
  MsgpackWriter w;
  w.Int(v);
  return w.Take();
}

std::string EncodeRequestStr(std::string_view v) {
  MsgpackWriter w(v.size() + 5);
  w.Str(v);
  return w.Take();
}

std::string EncodeRequestBin(std::string_view v) {
  MsgpackWriter w(v.size() + 5);
  w.Bin(v);
  return w.Take();
}

std::string EncodeTokenArray(std::span<const int64_t> tokens) {
  MsgpackWriter w(tokens.size() * 5 + 5);
  w.Array(tokens.size());
  for (int64_t t : tokens) w.Int(t);
  return w.Take();
}

std::string EncodeCacheKey(const CacheKey& key, std::string_view token_array) {
  MsgpackWriter w(token_array.size() + 192 + key.model_name.size() + key.request_id.size());
  w.Map(10);
  w.Str("model_name");
  w.Str(key.model_name);
  w.Str("world_size");
  w.Int(key.world_size);
  w.Str("worker_id");
  if (key.worker_id) {
    w.Int(*key.worker_id);
  } else {
    w.Nil();
  }
  w.Str("token_ids");
  w.Raw(token_array);
  w.Str("start");
  w.Int(key.start);
  w.Str("end");
  w.Int(key.end);
  w.Str("request_id");
  w.Str(key.request_id);
  w.Str("cache_salt");
  w.Str(key.cache_salt);
  w.Str("request_configs");
  w.Nil();
  w.Str("num_kv_readers");
  w.Int(key.num_kv_readers);
  return w.Take();
}

std::string EncodeBlockIds(std::span<const std::vector<int64_t>> groups) {
  size_t n = 8;
  for (const auto& g : groups) n += 5 + 3 * g.size();
  MsgpackWriter w(n);
  w.Array(groups.size());
  for (const auto& g : groups) {
    w.Array(g.size());
    for (int64_t id : g) w.Int(id);
  }
  return w.Take();
}

std::string EncodeCpuShmDescriptorExt(const TensorDescriptor& d) {
  MsgpackWriter body(256);
  body.Map(5);
  body.Str("type");
  body.Str("cpu_shm");
  body.Str("shm_name");
  body.Str(d.shm_name);
  body.Str("nbytes");
  body.Int(static_cast<int64_t>(d.nbytes));
  body.Str("version");
  body.Int(1);
  body.Str("metadata");
  body.Map(5);
  body.Str("dtype");
  body.Str(d.dtype);
  body.Str("shape");
  body.Array(d.shape.size());
  for (int64_t s : d.shape) body.Int(s);
  body.Str("stride");
  body.Array(d.stride.size());
  for (int64_t s : d.stride) body.Int(s);
  body.Str("storage_offset");
  body.Int(d.storage_offset);
  body.Str("device_uuid");
  body.Str(d.device_uuid);
  MsgpackWriter w(300);
  w.Ext(1, body.Take());
  return w.Take();
}

std::string EncodeArrayOf(std::span<const std::string> encoded_elements) {
  size_t n = 5;
  for (const auto& e : encoded_elements) n += e.size();
  MsgpackWriter w(n);
  w.Array(encoded_elements.size());
  for (const auto& e : encoded_elements) w.Raw(e);
  return w.Take();
}

std::string EncodeRequestBool(bool v) {
  MsgpackWriter w(1);
  w.Bool(v);
  return w.Take();
}

std::string EncodeIntList(std::span<const int64_t> v) {
  MsgpackWriter w(5 + 9 * v.size());
  w.Array(v.size());
  for (int64_t x : v) w.Int(x);
  return w.Take();
}

std::string EncodeGroupRot(std::span<const std::optional<RopeWindow>> windows) {
  MsgpackWriter w(5 + 19 * windows.size());
  w.Array(windows.size());
  for (const auto& win : windows) {
    if (!win) {
      w.Array(0);
      continue;
    }
    w.Array(2);
    w.Int(win->offset);
    w.Int(win->width);
  }
  return w.Take();
}

std::string EncodeCbMatchResults(std::span<const CbMatchResult> matches) {
  MsgpackWriter w(5 + 96 * matches.size());
  internal::WriteCbMatchResults(w, matches);
  return w.Take();
}

}  // namespace kvd::wire
