// The chunk gather/scatter kernels: one CTA per tile (grid-strided), 256 threads moving
// naturally aligned words of the layer's width, four loads in flight per thread. All index
// math is in copy_math.h, shared with the host emulator the unit tests check against
// cpu_copy.cc. Memory-bound; the D2H/H2D copy to pinned L1 that follows is the bottleneck.
#include "transfer/cuda/copy_kernels.h"

namespace kvd::transfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMaxGrid = 65535;

template <bool kToObject>
__global__ void __launch_bounds__(kThreads) ChunkCopyKernel(const __grid_constant__ ChunkKernelArgs args) {
  for (uint32_t tile = blockIdx.x; tile < args.tiles; tile += gridDim.x) {
    const TileRef t = DecodeTile(args.groups, args.num_groups, tile);
    const DevGroup g = args.groups[t.group];
    const DevLayer l = args.layers[t.layer];
    const uint32_t first = kToObject ? 0 : FirstRowAfterSkip(g, t.block, args.skip_tokens);
    if (first >= g.tokens_per_block) continue;
    auto* plane = reinterpret_cast<uint8_t*>(TileBlockAddress(l, t, args.ids[g.ids_offset + t.block]));
    uint8_t* obj = args.object + TileObjectOffset(g, t, args.chunk_tokens);
    CopyTileWords<kToObject>(l, args.runs, g.row_bytes, plane, obj, TileFirstByte(g, first),
                             TileEndByte(g), threadIdx.x, blockDim.x);
  }
}

}  // namespace

cudaError_t LaunchChunkCopy(const ChunkKernelArgs& args, bool to_object, cudaStream_t stream) {
  if (args.tiles == 0) return cudaSuccess;
  const uint32_t grid = args.tiles < kMaxGrid ? args.tiles : kMaxGrid;
  if (to_object) {
    ChunkCopyKernel<true><<<grid, kThreads, 0, stream>>>(args);
  } else {
    ChunkCopyKernel<false><<<grid, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace kvd::transfer::cuda
