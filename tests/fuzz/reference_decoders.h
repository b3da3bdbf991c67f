// Oracle for the differential fuzz target stream_fuzzer.cc: the msgpack-cxx (object tree)
// request decoders kvd used before wire/msgpack_reader.h, unchanged except for their
// names and their token type. Test code only; never linked into kvd.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "wire/codec.h"
#include "wire/messages.h"

namespace kvd::fuzz::reference {

struct RefCacheKey {
  std::string model_name;
  int64_t world_size = 0;
  std::optional<int64_t> worker_id;
  std::vector<int64_t> token_ids;
  int64_t start = 0;
  int64_t end = 0;
  std::string request_id;
  std::string cache_salt;
  int64_t num_kv_readers = 0;
};

struct RefTransferRequest {
  RefCacheKey key;
  int64_t instance_id = 0;
  std::vector<std::vector<int64_t>> block_ids;
  std::string event_handle;
  int64_t skip_first_n_tokens = 0;
};

struct RefLookupRequest {
  RefCacheKey key;
  int64_t tp_size = 1;
};

struct RefEngineDrivenRequest {
  RefCacheKey key;
  int64_t instance_id = 0;
  std::string data;
};

Result<const wire::OpInfo*> DecodeOp(std::string_view op_frame);
Result<int64_t> DecodeInstanceId(wire::Frames payloads);
Result<RefTransferRequest> DecodeStore(wire::Frames payloads);
Result<RefTransferRequest> DecodeRetrieve(wire::Frames payloads);
Result<RefLookupRequest> DecodeLookup(wire::Frames payloads);
Result<std::string> DecodeRequestId(wire::Frames payloads);
Result<std::pair<std::string, double>> DecodeWaitPrefetch(wire::Frames payloads);
Result<std::optional<int64_t>> DecodePing(wire::Frames payloads);
Result<bool> DecodeClear(wire::Frames payloads);
Result<RefEngineDrivenRequest> DecodeEngineDriven(wire::Frames payloads);

}  // namespace kvd::fuzz::reference
