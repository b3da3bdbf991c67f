// Launchers of the chunk gather/scatter kernels (copy_kernels.cu). One launch copies one
// chunk between the registered tensors and a device staging object, following a DevicePlan
// already uploaded to the device. Called by the CUDA engine with the instance's device
// current; enqueue only (asynchronous on `stream`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "transfer/cuda/copy_math.h"

namespace kvd::transfer::cuda {

// Kernel arguments, passed by value (under 4 KiB, read in place via __grid_constant__).
struct ChunkKernelArgs {
  const DevGroup* groups = nullptr;  // device arrays of the uploaded plan
  const DevLayer* layers = nullptr;
  const DevRun* runs = nullptr;
  uint8_t* object = nullptr;         // device staging object of plan.object_bytes
  uint32_t num_groups = 0;
  uint32_t tiles = 0;
  uint32_t chunk_tokens = 0;
  uint32_t pad_ = 0;
  int64_t skip_tokens = 0;           // scatter: chunk-relative tokens left untouched
  int32_t ids[kMaxIdsPerChunk] = {}; // PackChunkIds
};
static_assert(sizeof(ChunkKernelArgs) <= 4000, "kernel parameters must stay under 4 KiB");

// to_object: gather the chunk into `object`; else scatter `object` into the tensors.
cudaError_t LaunchChunkCopy(const ChunkKernelArgs& args, bool to_object, cudaStream_t stream);

}  // namespace kvd::transfer::cuda
