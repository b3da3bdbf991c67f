// CacheBlend's scatter + re-RoPE kernel: one CTA per piece (grid-strided), 256 threads.
// All index math and the row arithmetic are blend_device_math.h's, shared with the host
// emulator that the unit tests check against the CPU scatter byte for byte; built with
// --fmad=false so that the rotation's products and sums round apart, as on the CPU.
#include "blend/cuda/blend_kernels.h"

namespace kvd::blend::cuda {
namespace {

__global__ void __launch_bounds__(kBlendThreads)
    BlendScatterKernel(const __grid_constant__ BlendArgs args) {
  for (uint32_t piece = blockIdx.x; piece < args.num_pieces; piece += gridDim.x) {
    RunPiece(args, piece, threadIdx.x, blockDim.x);
  }
}

}  // namespace

cudaError_t LaunchBlendScatter(const BlendArgs& args, cudaStream_t stream) {
  if (args.num_pieces == 0) return cudaSuccess;
  const unsigned grid = args.num_pieces < kBlendMaxGrid ? args.num_pieces : kBlendMaxGrid;
  BlendScatterKernel<<<grid, kBlendThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace kvd::blend::cuda
