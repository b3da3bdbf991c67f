// The request path's decoders: the op frame, cache keys (with their token arrays),
// block ids, CacheBlend match results and the small scalar frames, read in one pass with
// MsgpackReader, no object tree and no heap use except the decoded request's own buffers
// (token ids, block ids, match hashes, strings longer than the small-string buffer).
//
// For the ops older than CacheBlend's, accepts and refuses exactly what the object-tree
// decoders did, with the same messages:
// a document is first checked whole (a malformed or trailing-byte document is reported as
// such, before any field error), then the fields are checked in the same order as before
// (the differential fuzz target tests/fuzz/stream_fuzzer.cc compares both on every input).
// Stateless; safe from any thread.
#include <cmath>
#include <limits>

#include "wire/codec.h"
#include "wire/codec_internal.h"
#include "wire/msgpack_reader.h"

namespace kvd::wire {
namespace {

using internal::CheckArity;
using internal::kLimits;
using internal::Malformed;
using internal::MpItem;
using internal::MpKind;
using internal::MsgpackReader;
using internal::TrailingBytes;
using internal::TypeError;
using internal::Where;

constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// ---- scalar readers over one item (the object-tree readers' rules) ----

Result<int64_t> IntOf(const MpItem& v, std::string_view ctx, std::string_view field) {
  switch (v.kind) {
    case MpKind::kUint:
      if (v.u64 > kInt64Max) return Status::InvalidArgument(Where(ctx, field) + ": integer out of range");
      return static_cast<int64_t>(v.u64);
    case MpKind::kInt:
      return v.i64;
    case MpKind::kBool:  // the client coerces Python values; bool is an int there
      return static_cast<int64_t>(v.boolean);
    default:
      return TypeError(ctx, field, "integer");
  }
}

Result<std::optional<int64_t>> OptIntOf(const MpItem& v, std::string_view ctx, std::string_view field) {
  if (v.kind == MpKind::kNil) return std::optional<int64_t>();
  auto i = IntOf(v, ctx, field);
  if (!i.ok()) return i.status();
  return std::optional<int64_t>(*i);
}

Result<bool> BoolOf(const MpItem& v, std::string_view ctx, std::string_view field) {
  if (v.kind == MpKind::kBool) return v.boolean;
  if (v.kind == MpKind::kUint) return v.u64 != 0;
  return TypeError(ctx, field, "bool");
}

Result<double> FloatOf(const MpItem& v, std::string_view ctx, std::string_view field) {
  if (v.kind == MpKind::kFloat32 || v.kind == MpKind::kFloat64) return v.f64;
  if (v.kind == MpKind::kUint) return static_cast<double>(v.u64);
  if (v.kind == MpKind::kInt) return static_cast<double>(v.i64);
  return TypeError(ctx, field, "number");
}

Result<std::string_view> StrOf(const MpItem& v, std::string_view ctx, std::string_view field,
                               size_t max_bytes = kMaxStringFieldBytes) {
  if (v.kind != MpKind::kStr) return TypeError(ctx, field, "string");
  if (v.bytes.size() > max_bytes) {
    return Status::InvalidArgument(Where(ctx, field) + ": at most " + std::to_string(max_bytes) +
                                   " bytes, got " + std::to_string(v.bytes.size()));
  }
  return v.bytes;
}

Result<std::string_view> BytesOf(const MpItem& v, std::string_view ctx, std::string_view field) {
  if (v.kind == MpKind::kBin || v.kind == MpKind::kStr) return v.bytes;
  if (v.kind == MpKind::kNil) return std::string_view();
  return TypeError(ctx, field, "bytes");
}

// One whole document whose top-level value is read as a scalar (a container is checked
// and skipped; its item then fails the typed reader).
Result<MpItem> ScalarFrame(std::string_view frame, std::string_view what) {
  MsgpackReader r(frame, kLimits);
  MpItem v;
  if (r.Next(&v, 1)) r.SkipContents(v, 1);
  if (r.failed()) return Malformed(what, r.reason());
  if (!r.at_end()) return TrailingBytes(what);
  return v;
}

// ---- cache keys ----

// A field of the key map as found (first occurrence of a str key wins, like a lookup).
struct FoundField {
  bool present = false;
  MpItem value;
};

// What the token_ids field held: whether it was an array, and the first element that was
// not an int64.
struct FoundTokens {
  bool present = false;
  bool is_array = false;
  std::optional<size_t> bad_element;
};

// Reads a token array's elements (the array header is already read, at depth 2) into
// `tokens` in one pass.
void ReadTokenArray(MsgpackReader& r, const MpItem& array, TokenIds* tokens, FoundTokens* found) {
  uint32_t* out = tokens->ResizeUninitialized(array.count);
  for (uint32_t i = 0; i < array.count; ++i) {
    const size_t fast = r.NextSmallUints(out + i, array.count - i);
    i += static_cast<uint32_t>(fast);
    if (i == array.count) break;
    if (r.NextSmallUint(&out[i])) continue;
    MpItem e;
    if (!r.Next(&e, 3)) return;
    if (e.kind == MpKind::kUint && e.u64 <= kInt64Max) {
      out[i] = static_cast<uint32_t>(e.u64);
      if (e.u64 > 0xFFFFFFFFu) tokens->NoteOutOfRange(i, static_cast<int64_t>(e.u64));
    } else if (e.kind == MpKind::kInt) {
      out[i] = static_cast<uint32_t>(e.i64);
      tokens->NoteOutOfRange(i, e.i64);
    } else {
      out[i] = 0;
      if (!found->bad_element) found->bad_element = i;
      if (!r.SkipContents(e, 3)) return;
    }
  }
}

Result<CacheKey> DecodeKeyFrame(std::string_view frame, std::string_view what, std::string_view ctx) {
  CacheKey key;
  FoundField model, world, worker, start, end, request, salt, readers;
  FoundTokens tokens;
  MsgpackReader r(frame, kLimits);
  MpItem top;
  if (r.Next(&top, 1)) {
    if (top.kind != MpKind::kMap) {
      r.SkipContents(top, 1);
    } else {
      for (uint32_t i = 0; i < top.count && !r.failed(); ++i) {
        MpItem k;
        if (!r.Next(&k, 2)) break;
        if (k.kind != MpKind::kStr) {  // not a field name: skip key and value
          if (r.SkipContents(k, 2)) r.Skip(2);
          continue;
        }
        const std::string_view name = k.bytes;
        if (name == "token_ids" && !tokens.present) {
          MpItem v;
          if (!r.Next(&v, 2)) break;
          tokens.present = true;
          tokens.is_array = v.kind == MpKind::kArray;
          if (tokens.is_array) {
            ReadTokenArray(r, v, &key.token_ids, &tokens);
          } else {
            r.SkipContents(v, 2);
          }
          continue;
        }
        FoundField* f = nullptr;
        if (name == "model_name") f = &model;
        else if (name == "world_size") f = &world;
        else if (name == "worker_id") f = &worker;
        else if (name == "start") f = &start;
        else if (name == "end") f = &end;
        else if (name == "request_id") f = &request;
        else if (name == "cache_salt") f = &salt;
        else if (name == "num_kv_readers") f = &readers;
        if (f == nullptr || f->present) {
          r.Skip(2);
          continue;
        }
        if (!r.Next(&f->value, 2)) break;
        f->present = true;
        r.SkipContents(f->value, 2);
      }
    }
  }
  if (r.failed()) return Malformed(what, r.reason());
  if (!r.at_end()) return TrailingBytes(what);
  if (top.kind != MpKind::kMap) return TypeError(ctx, "", "map");

  auto required = [&](const FoundField& f, std::string_view name) -> Status {
    if (!f.present) return Status::InvalidArgument(Where(ctx, name) + ": missing field");
    return Status::Ok();
  };
  std::string_view sv;
  KVD_RETURN_IF_ERROR(required(model, "model_name"));
  KVD_ASSIGN(sv, StrOf(model.value, ctx, "model_name"));
  key.model_name.assign(sv);
  KVD_RETURN_IF_ERROR(required(world, "world_size"));
  KVD_ASSIGN(key.world_size, IntOf(world.value, ctx, "world_size"));
  KVD_RETURN_IF_ERROR(required(worker, "worker_id"));
  KVD_ASSIGN(key.worker_id, OptIntOf(worker.value, ctx, "worker_id"));
  if (!tokens.present) return Status::InvalidArgument(Where(ctx, "token_ids") + ": missing field");
  if (!tokens.is_array) return TypeError(ctx, "token_ids", "array of integers");
  if (tokens.bad_element) {
    return Status::InvalidArgument(Where(ctx, "token_ids") + "[" + std::to_string(*tokens.bad_element) +
                                   "]: expected integer");
  }
  KVD_RETURN_IF_ERROR(required(start, "start"));
  KVD_ASSIGN(key.start, IntOf(start.value, ctx, "start"));
  KVD_RETURN_IF_ERROR(required(end, "end"));
  KVD_ASSIGN(key.end, IntOf(end.value, ctx, "end"));
  KVD_RETURN_IF_ERROR(required(request, "request_id"));
  KVD_ASSIGN(sv, StrOf(request.value, ctx, "request_id", kMaxRequestIdBytes));
  key.request_id.assign(sv);
  if (salt.present && salt.value.kind != MpKind::kNil) {
    KVD_ASSIGN(sv, StrOf(salt.value, ctx, "cache_salt"));
    key.cache_salt.assign(sv);
  }
  if (readers.present && readers.value.kind != MpKind::kNil) {
    KVD_ASSIGN(key.num_kv_readers, IntOf(readers.value, ctx, "num_kv_readers"));
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

// ---- block ids ----

// One list of int64 (a group, or the whole flat list) from an array whose header is read;
// records the first element that is not an int64 in *bad.
void ReadIntElements(MsgpackReader& r, const MpItem& array, size_t depth, std::vector<int64_t>* out,
                     std::optional<size_t>* bad) {
  out->reserve(array.count);
  for (uint32_t i = 0; i < array.count; ++i) {
    MpItem e;
    if (!r.Next(&e, depth + 1)) return;
    if (e.kind == MpKind::kUint && e.u64 <= kInt64Max) {
      out->push_back(static_cast<int64_t>(e.u64));
    } else if (e.kind == MpKind::kInt) {
      out->push_back(e.i64);
    } else {
      if (!*bad) *bad = i;
      if (!r.SkipContents(e, depth + 1)) return;
    }
  }
}

// [[ids of group 0], [ids of group 1], ...], or one flat list (clients before mid-2026),
// which is one group.
Result<std::vector<std::vector<int64_t>>> DecodeBlockIdsFrame(std::string_view frame,
                                                              std::string_view what,
                                                              std::string_view ctx) {
  std::vector<std::vector<int64_t>> groups;
  Status first_error;  // the first type error in stream order
  auto note = [&](Status st) {
    if (first_error.ok()) first_error = std::move(st);
  };
  MsgpackReader r(frame, kLimits);
  MpItem top;
  if (r.Next(&top, 1)) {
    if (top.kind != MpKind::kArray) {
      r.SkipContents(top, 1);
    } else if (top.count == 0) {
      groups.emplace_back();
    } else {
      MpItem first;
      if (r.Next(&first, 2)) {
        if (first.kind != MpKind::kArray) {
          // Flat: `first` is element 0 of the only group.
          auto& g = groups.emplace_back();
          g.reserve(top.count);
          std::optional<size_t> bad;
          if (first.kind == MpKind::kUint && first.u64 <= kInt64Max) {
            g.push_back(static_cast<int64_t>(first.u64));
          } else if (first.kind == MpKind::kInt) {
            g.push_back(first.i64);
          } else {
            bad = 0;
            r.SkipContents(first, 2);
          }
          for (uint32_t i = 1; i < top.count && !r.failed(); ++i) {
            MpItem e;
            if (!r.Next(&e, 2)) break;
            if (e.kind == MpKind::kUint && e.u64 <= kInt64Max) {
              g.push_back(static_cast<int64_t>(e.u64));
            } else if (e.kind == MpKind::kInt) {
              g.push_back(e.i64);
            } else {
              if (!bad) bad = i;
              r.SkipContents(e, 2);
            }
          }
          if (bad) {
            note(Status::InvalidArgument(std::string(ctx) + "[" + std::to_string(*bad) +
                                         "]: expected integer"));
          }
        } else {
          groups.reserve(top.count);
          for (uint32_t gi = 0; gi < top.count && !r.failed(); ++gi) {
            MpItem e = first;
            if (gi > 0 && !r.Next(&e, 2)) break;
            const std::string field = "[" + std::to_string(gi) + "]";
            auto& g = groups.emplace_back();
            if (e.kind != MpKind::kArray) {
              note(TypeError(ctx, field, "array of integers"));
              r.SkipContents(e, 2);
              continue;
            }
            std::optional<size_t> bad;
            ReadIntElements(r, e, 2, &g, &bad);
            if (bad) {
              note(Status::InvalidArgument(Where(ctx, field) + "[" + std::to_string(*bad) +
                                           "]: expected integer"));
            }
          }
        }
      }
    }
  }
  if (r.failed()) return Malformed(what, r.reason());
  if (!r.at_end()) return TrailingBytes(what);
  if (top.kind != MpKind::kArray) return TypeError(ctx, "", "array");
  if (!first_error.ok()) return first_error;
  return groups;
}

Result<TransferRequest> DecodeTransfer(Frames p, Op op) {
  KVD_RETURN_IF_ERROR(CheckArity(p, op));
  const std::string_view name = op == Op::kStore ? "store" : "retrieve";
  const std::string key_ctx = std::string(name) + ".key";
  TransferRequest r;
  KVD_ASSIGN(r.key, DecodeKeyFrame(p[0], name, key_ctx));
  MpItem v;
  KVD_ASSIGN(v, ScalarFrame(p[1], name));
  KVD_ASSIGN(r.instance_id, IntOf(v, name, "instance_id"));
  KVD_ASSIGN(r.block_ids, DecodeBlockIdsFrame(p[2], name, std::string(name) + ".block_ids"));
  KVD_ASSIGN(v, ScalarFrame(p[3], name));
  std::string_view handle;
  KVD_ASSIGN(handle, BytesOf(v, name, "event_ipc_handle"));
  r.event_handle.assign(handle);
  if (op == Op::kRetrieve && p.size() > 4) {
    KVD_ASSIGN(v, ScalarFrame(p[4], name));
    KVD_ASSIGN(r.skip_first_n_tokens, IntOf(v, name, "skip_first_n_tokens"));
    if (r.skip_first_n_tokens < 0) {
      return Status::InvalidArgument("retrieve.skip_first_n_tokens: negative");
    }
  }
  if (!r.key.worker_id) {
    return Status::InvalidArgument(std::string(name) + ".key.worker_id: required (got nil)");
  }
  return r;
}

// ---- CacheBlend match results ----

// One CBMatchResult from the fields found in its map (`ctx` names it, e.g. "...[2]").
Status MatchFromFields(const FoundField& old_st, const FoundField& old_ed, const FoundField& cur_st,
                       const FoundField& cur_ed, const FoundField& hash, std::string_view ctx,
                       CbMatchResult* m) {
  auto required = [&](const FoundField& f, std::string_view name) -> Status {
    if (!f.present) return Status::InvalidArgument(Where(ctx, name) + ": missing field");
    return Status::Ok();
  };
  KVD_RETURN_IF_ERROR(required(old_st, "old_st"));
  KVD_ASSIGN(m->old_st, IntOf(old_st.value, ctx, "old_st"));
  KVD_RETURN_IF_ERROR(required(old_ed, "old_ed"));
  KVD_ASSIGN(m->old_ed, IntOf(old_ed.value, ctx, "old_ed"));
  KVD_RETURN_IF_ERROR(required(cur_st, "cur_st"));
  KVD_ASSIGN(m->cur_st, IntOf(cur_st.value, ctx, "cur_st"));
  KVD_RETURN_IF_ERROR(required(cur_ed, "cur_ed"));
  KVD_ASSIGN(m->cur_ed, IntOf(cur_ed.value, ctx, "cur_ed"));
  KVD_RETURN_IF_ERROR(required(hash, "hash"));
  if (hash.value.kind != MpKind::kBin && hash.value.kind != MpKind::kStr) {
    return TypeError(ctx, "hash", "bytes");
  }
  if (hash.value.bytes.empty() || hash.value.bytes.size() > kMaxCbHashBytes) {
    return Status::InvalidArgument(Where(ctx, "hash") + ": expected 1.." +
                                   std::to_string(kMaxCbHashBytes) + " bytes, got " +
                                   std::to_string(hash.value.bytes.size()));
  }
  m->hash.assign(hash.value.bytes);
  if (m->old_st < 0 || m->old_ed < m->old_st || m->cur_st < 0 || m->cur_ed < m->cur_st) {
    return Status::InvalidArgument(std::string(ctx) + ": ranges [" + std::to_string(m->old_st) +
                                   ", " + std::to_string(m->old_ed) + ") and [" +
                                   std::to_string(m->cur_st) + ", " + std::to_string(m->cur_ed) +
                                   ") must satisfy 0 <= st <= ed");
  }
  return Status::Ok();
}

// [CBMatchResult map, ...]: the whole document is read (a malformed one is reported as such
// first), then the first field error in stream order. Unknown and non-str keys are skipped;
// the first occurrence of a field wins.
Result<std::vector<CbMatchResult>> DecodeMatchResultsFrame(std::string_view frame,
                                                           std::string_view what,
                                                           std::string_view ctx) {
  std::vector<CbMatchResult> out;
  Status first_error;
  MsgpackReader r(frame, kLimits);
  MpItem top;
  if (r.Next(&top, 1)) {
    if (top.kind != MpKind::kArray) {
      r.SkipContents(top, 1);
    } else {
      for (uint32_t i = 0; i < top.count && !r.failed(); ++i) {
        MpItem e;
        if (!r.Next(&e, 2)) break;
        if (e.kind != MpKind::kMap) {
          if (first_error.ok()) {
            first_error = Status::InvalidArgument(std::string(ctx) + "[" + std::to_string(i) +
                                                  "]: expected map (CBMatchResult)");
          }
          r.SkipContents(e, 2);
          continue;
        }
        FoundField old_st, old_ed, cur_st, cur_ed, hash;
        for (uint32_t j = 0; j < e.count && !r.failed(); ++j) {
          MpItem k;
          if (!r.Next(&k, 3)) break;
          if (k.kind != MpKind::kStr) {  // not a field name: skip key and value
            if (r.SkipContents(k, 3)) r.Skip(3);
            continue;
          }
          FoundField* f = nullptr;
          if (k.bytes == "old_st") f = &old_st;
          else if (k.bytes == "old_ed") f = &old_ed;
          else if (k.bytes == "cur_st") f = &cur_st;
          else if (k.bytes == "cur_ed") f = &cur_ed;
          else if (k.bytes == "hash") f = &hash;
          if (f == nullptr || f->present) {
            r.Skip(3);
            continue;
          }
          if (!r.Next(&f->value, 3)) break;
          f->present = true;
          r.SkipContents(f->value, 3);
        }
        if (r.failed() || !first_error.ok()) continue;  // past the first error: only check the bytes
        const std::string at = std::string(ctx) + "[" + std::to_string(i) + "]";
        CbMatchResult m;
        Status st = MatchFromFields(old_st, old_ed, cur_st, cur_ed, hash, at, &m);
        if (!st.ok()) {
          first_error = std::move(st);
          continue;
        }
        out.push_back(std::move(m));
      }
    }
  }
  if (r.failed()) return Malformed(what, r.reason());
  if (!r.at_end()) return TrailingBytes(what);
  if (top.kind != MpKind::kArray) return TypeError(ctx, "", "array");
  if (!first_error.ok()) return first_error;
  return out;
}

// A scalar frame read as a non-negative integer.
Result<int64_t> NonNegativeIntFrame(std::string_view frame, std::string_view what,
                                    std::string_view field) {
  MpItem v;
  KVD_ASSIGN(v, ScalarFrame(frame, what));
  int64_t n = 0;
  KVD_ASSIGN(n, IntOf(v, what, field));
  if (n < 0) return Status::InvalidArgument(Where(what, field) + ": negative");
  return n;
}

}  // namespace

Result<const OpInfo*> DecodeOp(std::string_view op_frame) {
  auto v = ScalarFrame(op_frame, "operation");
  if (!v.ok()) return v.status();
  const OpInfo* info = nullptr;
  if (v->kind == MpKind::kUint) {
    info = FindOpById(static_cast<int64_t>(v->u64));
    if (!info) return Status::NotFound("unknown operation id " + std::to_string(v->u64));
  } else if (v->kind == MpKind::kStr) {
    info = FindOpByName(v->bytes);
    if (!info) return Status::NotFound("unknown operation '" + std::string(v->bytes.substr(0, 64)) + "'");
  } else {
    return Status::InvalidArgument("operation frame must be a msgpack int or str");
  }
  return info;
}

Result<int64_t> DecodeInstanceId(Frames p) {
  if (p.size() != 1) return Status::InvalidArgument("expected 1 payload frame (instance_id)");
  auto v = ScalarFrame(p[0], "instance_id");
  if (!v.ok()) return v.status();
  return IntOf(*v, "instance_id", "");
}

Result<TransferRequest> DecodeStore(Frames p) { return DecodeTransfer(p, Op::kStore); }
Result<TransferRequest> DecodeRetrieve(Frames p) { return DecodeTransfer(p, Op::kRetrieve); }

Result<LookupRequest> DecodeLookup(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kLookup));
  LookupRequest r;
  KVD_ASSIGN(r.key, DecodeKeyFrame(p[0], "lookup", "lookup.key"));
  if (p.size() > 1) {
    MpItem v;
    KVD_ASSIGN(v, ScalarFrame(p[1], "lookup"));
    KVD_ASSIGN(r.tp_size, IntOf(v, "lookup", "tp_size"));
  }
  return r;
}

Result<std::string_view> DecodeRequestId(Frames p) {
  if (p.empty() || p.size() > 2) return Status::InvalidArgument("expected 1 payload frame (request_id)");
  auto v = ScalarFrame(p[0], "request_id");
  if (!v.ok()) return v.status();
  return StrOf(*v, "request_id", "", kMaxRequestIdBytes);
}

Result<std::pair<std::string_view, double>> DecodeWaitPrefetch(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kWaitPrefetchStatus));
  std::pair<std::string_view, double> r{"", 0.0};
  KVD_ASSIGN(r.first, DecodeRequestId(p.subspan(0, 1)));
  if (p.size() > 1) {
    MpItem v;
    KVD_ASSIGN(v, ScalarFrame(p[1], "wait_prefetch_status"));
    KVD_ASSIGN(r.second, FloatOf(v, "wait_prefetch_status", "timeout"));
    if (!std::isfinite(r.second) || r.second < 0) r.second = 0;
  }
  return r;
}

Result<std::optional<int64_t>> DecodePing(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kPing));
  if (p.empty()) return std::optional<int64_t>();
  auto v = ScalarFrame(p[0], "ping");
  if (!v.ok()) return v.status();
  return OptIntOf(*v, "ping", "instance_id");
}

Result<bool> DecodeClear(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kClear));
  if (p.empty()) return false;
  auto v = ScalarFrame(p[0], "clear");
  if (!v.ok()) return v.status();
  if (v->kind == MpKind::kNil) return false;
  return BoolOf(*v, "clear", "force");
}

Result<EngineDrivenRequest> DecodeEngineDriven(Frames p) {
  if (p.size() < 2 || p.size() > 3) {
    return Status::InvalidArgument("expected 2..3 payload frames (key, instance_id[, data])");
  }
  EngineDrivenRequest r;
  KVD_ASSIGN(r.key, DecodeKeyFrame(p[0], "key", "key"));
  MpItem v;
  KVD_ASSIGN(v, ScalarFrame(p[1], "instance_id"));
  KVD_ASSIGN(r.instance_id, IntOf(v, "instance_id", ""));
  if (p.size() == 3) {
    KVD_ASSIGN(v, ScalarFrame(p[2], "data"));
    std::string_view data;
    KVD_ASSIGN(data, BytesOf(v, "data", ""));
    r.data.assign(data);
  }
  if (!r.key.worker_id) return Status::InvalidArgument("key.worker_id: required (got nil)");
  return r;
}

// ---- CacheBlend ops ----
// No object-tree twin exists for these (stream_fuzzer.cc compares only the older ops); the
// payload and request fuzz targets cover them.

Result<CbRetrievePreComputedRequest> DecodeCbRetrievePreComputed(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kCbRetrievePreComputed));
  constexpr std::string_view name = "cb_retrieve_pre_computed";
  CbRetrievePreComputedRequest r;
  KVD_ASSIGN(r.key, DecodeKeyFrame(p[0], name, "cb_retrieve_pre_computed.key"));
  KVD_ASSIGN(r.match_results,
             DecodeMatchResultsFrame(p[1], name, "cb_retrieve_pre_computed.match_results"));
  KVD_ASSIGN(r.block_ids, DecodeBlockIdsFrame(p[2], name, "cb_retrieve_pre_computed.block_ids"));
  MpItem v;
  KVD_ASSIGN(v, ScalarFrame(p[3], name));
  KVD_ASSIGN(r.instance_id, IntOf(v, name, "instance_id"));
  KVD_ASSIGN(v, ScalarFrame(p[4], name));
  std::string_view handle;
  KVD_ASSIGN(handle, BytesOf(v, name, "event_ipc_handle"));
  r.event_handle.assign(handle);
  return r;
}

Result<LookupRequest> DecodeCbUnifiedLookup(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kCbUnifiedLookup));
  constexpr std::string_view name = "cb_unified_lookup";
  LookupRequest r;
  KVD_ASSIGN(r.key, DecodeKeyFrame(p[0], name, "cb_unified_lookup.key"));
  MpItem v;
  KVD_ASSIGN(v, ScalarFrame(p[1], name));
  KVD_ASSIGN(r.tp_size, IntOf(v, name, "tp_size"));
  return r;
}

Result<int64_t> DecodeCbProtocolHandshake(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kCbProtocolHandshake));
  MpItem v;
  KVD_ASSIGN(v, ScalarFrame(p[0], "cb_protocol_handshake"));
  return IntOf(v, "cb_protocol_handshake", "client_version");
}

Result<CbReorderPlanRequest> DecodeCbReorderPlan(Frames p) {
  KVD_RETURN_IF_ERROR(CheckArity(p, Op::kCbReorderPlan));
  constexpr std::string_view name = "cb_reorder_plan";
  CbReorderPlanRequest r;
  KVD_ASSIGN(r.key, DecodeKeyFrame(p[0], name, "cb_reorder_plan.key"));
  KVD_ASSIGN(r.keep_prefix, NonNegativeIntFrame(p[1], name, "keep_prefix"));
  KVD_ASSIGN(r.budget_ms, NonNegativeIntFrame(p[2], name, "budget_ms"));
  return r;
}

}  // namespace kvd::wire
