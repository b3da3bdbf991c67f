// CUDA CacheGen decoder (decode_kernel.h): one warp per rANS stream, lane j = state j,
// the warp algorithm of warp_decode.h (the host emulator runs the same code in CI). The
// host verifies the object first (PrepareDeviceDecode); the kernel still bounds every
// word read by its stream and reports streams that do not end where their states say.
#include <cuda_runtime.h>

#include <string>

#include "codec/cuda/decode_kernel.h"

namespace kvd::codec::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__global__ void DecodeStreams(const uint8_t* enc, const warp::StreamJob* jobs, int njobs, uint8_t* out,
                              int* errors) {
  __shared__ uint16_t cum[kWarpsPerBlock][2][32][kMaxAlphabet + 1];
  const int wib = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int ji = blockIdx.x * kWarpsPerBlock + wib;
  if (ji >= njobs) return;  // whole warps leave together
  const warp::StreamJob j = jobs[ji];
  uint32_t x = warp::Load32(enc + j.stream_offset + 4 * lane);
  float recon = 0.0f;
  uint64_t w = j.stream_offset + 128;
  const uint64_t end = j.stream_offset + j.stream_bytes;
  const int classes = j.anchor_group ? 2 : 1;
  bool bad = false;
  // Every lane runs every iteration (the ballots below need the whole warp): loop
  // conditions and breaks depend only on warp-uniform values.
  for (uint32_t cb = j.c0; cb < j.c1; cb += 32) {
    const int lanes = static_cast<int>(j.c1 - cb < 32 ? j.c1 - cb : 32);
    const bool active = lane < lanes;
    for (int k = 0; k < classes; ++k) {
      if (active) {
        const uint8_t* prm = enc + j.params_offset[k] + 2 * uint64_t{cb + lane};
        if (!warp::BuildCum(prm[0], prm[1], j.alphabet[k], j.prob_bits[k], cum[wib][k][lane])) bad = true;
      }
    }
    __syncwarp();
    for (uint32_t t = 0; t < j.tokens; ++t) {
      const bool anchor = j.anchor_group && t % j.anchor_group == 0;
      const int k = anchor ? 1 : 0;
      const float step = warp::TokenStep(enc, j, t, k);
      int sym = 0;
      bool need = false;
      if (active) need = warp::LaneDecode(&x, cum[wib][k][lane], j.alphabet[k], j.prob_bits[k], &sym);
      const unsigned m = __ballot_sync(0xffffffffu, need);
      const unsigned before = __popc(m & ((1u << lane) - 1u));
      if (need) {
        const uint64_t p = w + 2 * uint64_t{before};
        if (p + 2 > end) {
          bad = true;
        } else {
          x = (x << 16) | warp::Load16(enc + p);
        }
      }
      w += 2 * uint64_t{static_cast<unsigned>(__popc(m))};
      if (active) {
        const float v = warp::LaneValue(sym, j.levels[k], step, j.anchor_group != 0, anchor, &recon);
        warp::StoreValue(out + j.out_offset, uint64_t{t} * j.channels + cb + lane, v, j.dtype);
      }
      if (w > end) break;  // w is the same in every lane
    }
    __syncwarp();
    if (__any_sync(0xffffffffu, bad) || w > end) break;
  }
  bad = bad || w != end || x != warp::kLow;
  if (__any_sync(0xffffffffu, bad) && lane == 0) atomicAdd(errors, 1);
}

// Device buffers freed on every path.
struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  cudaError_t Alloc(size_t n) { return cudaMalloc(&p, n ? n : 1); }
};

}  // namespace

LaunchResult Launch(const uint8_t* encoded, size_t encoded_bytes, const warp::StreamJob* jobs, size_t njobs,
                    uint8_t* out, size_t out_bytes) {
  LaunchResult r;
  auto fail = [&](cudaError_t e, const char* what) {
    r.error = std::string(what) + ": " + cudaGetErrorString(e);
    return r;
  };
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    r.error = "no CUDA device";
    return r;
  }
  DeviceBuffer d_enc, d_out, d_jobs, d_err;
  cudaError_t e;
  if ((e = d_enc.Alloc(encoded_bytes)) != cudaSuccess) return fail(e, "cudaMalloc");
  if ((e = d_out.Alloc(out_bytes)) != cudaSuccess) return fail(e, "cudaMalloc");
  if ((e = d_jobs.Alloc(sizeof(warp::StreamJob) * njobs)) != cudaSuccess) return fail(e, "cudaMalloc");
  if ((e = d_err.Alloc(sizeof(int))) != cudaSuccess) return fail(e, "cudaMalloc");
  if ((e = cudaMemcpy(d_enc.p, encoded, encoded_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) return fail(e, "copy in");
  if ((e = cudaMemcpy(d_jobs.p, jobs, sizeof(warp::StreamJob) * njobs, cudaMemcpyHostToDevice)) != cudaSuccess) {
    return fail(e, "copy in");
  }
  cudaMemset(d_err.p, 0, sizeof(int));
  cudaMemset(d_out.p, 0, out_bytes);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  if (njobs > 0) {
    const int blocks = static_cast<int>((njobs + kWarpsPerBlock - 1) / kWarpsPerBlock);
    DecodeStreams<<<blocks, 32 * kWarpsPerBlock>>>(static_cast<const uint8_t*>(d_enc.p),
                                                   static_cast<const warp::StreamJob*>(d_jobs.p),
                                                   static_cast<int>(njobs), static_cast<uint8_t*>(d_out.p),
                                                   static_cast<int*>(d_err.p));
  }
  cudaEventRecord(b);
  e = cudaEventSynchronize(b);
  if (e == cudaSuccess) e = cudaGetLastError();
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (e != cudaSuccess) return fail(e, "kernel");
  r.kernel_seconds = ms / 1e3;
  if ((e = cudaMemcpy(&r.corrupt_streams, d_err.p, sizeof(int), cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return fail(e, "copy out");
  }
  if ((e = cudaMemcpy(out, d_out.p, out_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) return fail(e, "copy out");
  r.ok = true;
  return r;
}

}  // namespace kvd::codec::cuda
