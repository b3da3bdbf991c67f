// Fuzz target "descriptor": the ext-1 device descriptor reader and what is built on it.
//
// In lmcache 0.5.6 the ext-1 payload of REGISTER_KV_CACHE is a msgpack-encoded, tagged
// struct (cpu_shm / cuda / cuda_raw / ...), not a pickle: kvd has no pickle reader, and this
// target covers the one reader of client-supplied tensor descriptions it does have.
//
// Each input is the raw data of one ext-1 object. When wire::DecodeTensorDescriptor accepts
// it, the descriptor is registered the way KvService does (layout::BuildLayout, alone and
// twice — the aliasing path), and, when the described memory is small, a chunk is gathered
// from and scattered back into a heap buffer of exactly the descriptor's nbytes using the
// highest block id the layout allows. AddressSanitizer then proves the layout's bounds
// checks: a plan BuildLayout accepts never touches a byte outside the registered memory.
#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "layout/layout.h"
#include "transfer/cpu_copy.h"
#include "wire/codec.h"

namespace kvd::fuzz {
namespace {

constexpr uint64_t kMaxCopyBytes = 1u << 20;

void ExerciseLayout(const std::vector<wire::TensorDescriptor>& tensors, int64_t chunk_tokens) {
  wire::LayoutHints hints;
  auto layout = layout::BuildLayout(tensors, hints, {}, chunk_tokens);
  if (!layout.ok()) return;
  Check(layout->chunk_tokens == chunk_tokens, "layout keeps chunk_tokens");
  const uint64_t nbytes = tensors[0].nbytes;
  if (nbytes == 0 || nbytes > kMaxCopyBytes || layout->object_bytes == 0 ||
      layout->object_bytes > kMaxCopyBytes) {
    return;
  }
  std::vector<std::vector<int64_t>> block_ids(layout->num_engine_groups);
  for (const auto& g : layout->groups) {
    Check(g.tokens_per_block > 0 && chunk_tokens % g.tokens_per_block == 0,
          "group tokens_per_block divides the chunk");
    auto& ids = block_ids[g.engine_group];
    const int64_t need = chunk_tokens / g.tokens_per_block;
    ids.clear();
    for (int64_t i = 0; i < need; ++i) ids.push_back(i % 2 == 0 ? g.num_blocks - 1 : 0);
  }
  if (!transfer::ValidateBlockIds(*layout, block_ids, 1).ok()) return;
  // The registered memory, exactly as large as the client claimed; every tensor maps it.
  std::vector<uint8_t> memory(nbytes, 0x5a);
  std::vector<uint8_t*> bases(tensors.size(), memory.data());
  std::vector<uint8_t> object(layout->object_bytes);
  transfer::GatherChunk(*layout, bases, block_ids, 0, object.data());
  transfer::ScatterChunk(*layout, bases, block_ids, 0, object.data(), 0);
  transfer::ScatterChunk(*layout, bases, block_ids, 0, object.data(), chunk_tokens / 2 + 1);
}

}  // namespace
}  // namespace kvd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvd;
  using namespace kvd::fuzz;
  auto d = wire::DecodeTensorDescriptor(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!d.ok()) return 0;
  Check(d->shape.size() == d->stride.size() && d->shape.size() <= 8, "descriptor rank");
  for (size_t i = 0; i < d->shape.size(); ++i) {
    Check(d->shape[i] >= 0 && d->stride[i] >= 0, "descriptor shape/stride non-negative");
  }
  if (d->memory != wire::TensorMemory::kCpuShm) return 0;
  // Chunk sizes to try: each small dimension (one of them is the tokens-per-block dimension)
  // and twice it.
  std::vector<int64_t> chunks;
  for (int64_t v : d->shape) {
    if (v >= 1 && v <= 1024) {
      chunks.push_back(v);
      chunks.push_back(2 * v);
    }
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  if (chunks.size() > 6) chunks.resize(6);
  std::vector<wire::TensorDescriptor> one{*d};
  std::vector<wire::TensorDescriptor> two{*d, *d};
  for (int64_t c : chunks) {
    ExerciseLayout(one, c);
    ExerciseLayout(two, c);
  }
  return 0;
}
