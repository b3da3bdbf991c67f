// Launcher of CacheBlend's scatter + re-RoPE kernel (blend_kernels.cu): one launch per
// request, following a BlendDevicePlan whose blob was uploaded to the device (BlendArgsAt
// with the upload's address). The plan's sources are wherever the request's objects were
// put: a device staging copy (cudaMemcpyAsync H2D of the pinned L1 objects first), or the
// pinned host objects themselves (zero-copy reads over the bus). Enqueue only
// (asynchronous on `stream`); the caller's device must be current.
#pragma once

#include <cuda_runtime_api.h>

#include "blend/cuda/blend_device_math.h"

namespace kvd::blend::cuda {

// Threads per CTA, and the most CTAs one launch uses (grid-stride over the pieces).
inline constexpr int kBlendThreads = 256;
inline constexpr unsigned kBlendMaxGrid = 65535;

cudaError_t LaunchBlendScatter(const BlendArgs& args, cudaStream_t stream);

}  // namespace kvd::blend::cuda
