// kvd-bench's wire client: request frames (encoded by src/wire/request_encoder.h), one
// DEALER connection with one outstanding request at a time, reply decoding, and the
// lookup-then-poll sequence of vLLM's scheduler. Header-only; a Conn is used by one thread.
#pragma once

#include "bench_util.h"
#include "wire/request_encoder.h"

namespace kvd::bench {

// ---------------------------------------------------------------------------------------
// Request frames, encoded by src/wire (what the lmcache 0.5.6 client sends, byte for byte)
// ---------------------------------------------------------------------------------------

using Packer = msgpack::packer<msgpack::sbuffer>;

// msgpack-cxx for the few documents src/wire has no client-side encoder for (hints, group
// infos) and for reading replies.
template <typename Fn>
std::string Pack(Fn&& fn, size_t reserve = 64) {
  msgpack::sbuffer buf(reserve);
  Packer pk(buf);
  fn(pk, buf);
  return std::string(buf.data(), buf.size());
}

inline void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

inline std::string PackInt(int64_t v) { return wire::EncodeRequestInt(v); }
inline std::string PackString(std::string_view s) { return wire::EncodeRequestStr(s); }
inline std::string PackBin(std::string_view s) { return wire::EncodeRequestBin(s); }
inline const std::string kNil(1, '\xc0');
inline const std::string kTrue(1, '\xc3');

// A token list as a msgpack array (smallest int encodings, as msgspec writes them).
inline std::string PackTokens(const std::vector<int64_t>& tokens) {
  return wire::EncodeTokenArray(tokens);
}

// IPCCacheServerKey fields the suites set; the rest as the client sends them.
struct KeyArgs {
  std::string_view model;
  int64_t world_size = 1;
  std::optional<int64_t> worker_id;
  std::string_view tokens_blob;  // PackTokens() of the token ids
  int64_t start = 0;
  int64_t end = 0;
  std::string_view request_id;
  int64_t num_kv_readers = 1;
};

inline std::string PackKey(const KeyArgs& k) {
  wire::CacheKey key;
  key.model_name = std::string(k.model);
  key.world_size = k.world_size;
  key.worker_id = k.worker_id;
  key.start = k.start;
  key.end = k.end;
  key.request_id = std::string(k.request_id);
  key.num_kv_readers = k.num_kv_readers;
  return wire::EncodeCacheKey(key, k.tokens_blob);
}

// block_ids: `lists` copies of [first, first + count) (one list per LMCache KV group).
inline std::string PackBlockIds(int lists, int64_t first, int64_t count) {
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ids[static_cast<size_t>(i)] = first + i;
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(lists), ids);
  return wire::EncodeBlockIds(groups);
}

// The wire client: one DEALER socket, one outstanding request at a time
// ---------------------------------------------------------------------------------------

inline int OpId(std::string_view name) {
  const auto* info = kvd::wire::FindOpByName(name);
  if (!info || info->legacy_id < 0) throw BenchError("no wire id for op " + std::string(name));
  return info->legacy_id;
}

struct Ops {
  int register_kv_cache = OpId("register_kv_cache");
  int unregister_kv_cache = OpId("unregister_kv_cache");
  int store = OpId("store");
  int retrieve = OpId("retrieve");
  int lookup = OpId("lookup");
  int free_lookup_locks = OpId("free_lookup_locks");
  int query_prefetch_status = OpId("query_prefetch_status");
  int end_session = OpId("end_session");
  int clear = OpId("clear");
  int get_chunk_size = OpId("get_chunk_size");
  int ping = OpId("ping");
};
inline const Ops& op() {
  static const Ops ops;
  return ops;
}

class Conn {
 public:
  Conn(zmq::context_t& ctx, const std::string& url) : sock_(ctx, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::reconnect_ivl, 20);
    sock_.set(zmq::sockopt::sndhwm, 0);
    sock_.set(zmq::sockopt::rcvhwm, 0);
    sock_.connect(url);
  }

  // Sends [uid, op, payloads...]; returns the uid.
  uint64_t Send(int op_id, const std::vector<std::string_view>& payloads) {
    const uint64_t uid = next_uid_++;
    const std::string uid_frame = PackInt(static_cast<int64_t>(uid));
    const std::string op_frame = PackInt(op_id);
    sock_.send(zmq::buffer(uid_frame), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(op_frame),
               payloads.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < payloads.size(); ++i) {
      sock_.send(zmq::buffer(payloads[i].data(), payloads[i].size()),
                 i + 1 < payloads.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    return uid;
  }

  // The reply frame for `uid`; replies to other (fire-and-forget) requests are dropped.
  // nullopt on timeout.
  std::optional<std::string> Wait(uint64_t uid, double timeout_s) {
    const std::string want = PackInt(static_cast<int64_t>(uid));
    const double deadline = Now() + timeout_s;
    std::vector<zmq::message_t> frames;
    for (;;) {
      double left = deadline - Now();
      if (left <= 0) return std::nullopt;
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(static_cast<long>(left * 1000) + 1));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      frames.clear();
      if (!zmq::recv_multipart(sock_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        continue;
      }
      // [uid, op, reply]; a server may leave the reply frame out for None (lmcache 0.5.6
      // does), which the client reads as nil.
      if (frames.size() >= 2 && frames[0].to_string_view() == want) {
        return frames.size() >= 3 ? frames.back().to_string() : kNil;
      }
    }
  }

  std::optional<std::string> Call(int op_id, const std::vector<std::string_view>& payloads,
                                  double timeout_s) {
    return Wait(Send(op_id, payloads), timeout_s);
  }

 private:
  zmq::socket_t sock_;
  uint64_t next_uid_ = 0;
};

// ---- reply decoding ----

inline bool IsNil(const std::string& r) { return r.size() == 1 && static_cast<uint8_t>(r[0]) == 0xc0; }

inline std::optional<int64_t> AsInt(const std::string& r) {
  try {
    auto oh = msgpack::unpack(r.data(), r.size());
    const auto& o = oh.get();
    if (o.type == msgpack::type::POSITIVE_INTEGER) return static_cast<int64_t>(o.via.u64);
    if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

inline bool AsTrue(const std::string& r) { return r == kTrue; }

// STORE / RETRIEVE reply: [event_handle: bin, ok: bool].
inline bool HandleOk(const std::string& r) {
  try {
    auto oh = msgpack::unpack(r.data(), r.size());
    const auto& o = oh.get();
    return o.type == msgpack::type::ARRAY && o.via.array.size == 2 &&
           o.via.array.ptr[1].type == msgpack::type::BOOLEAN && o.via.array.ptr[1].via.boolean;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace kvd::bench
