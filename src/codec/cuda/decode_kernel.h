// decode_kernel: the CUDA side of the GPU decoder, with plain types only (the kernel's
// translation unit is compiled by nvcc as C++17 and sees no C++20 header). Called by
// DecodeOnGpu (gpu_decoder.cc) with a plan the host has verified.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "codec/warp_decode.h"

namespace kvd::codec::cuda {

struct LaunchResult {
  bool ok = false;              // the GPU ran the kernel
  std::string error;            // why not (no device, allocation or launch failure)
  int corrupt_streams = 0;      // streams that ran out of words or ended in a wrong state
  double kernel_seconds = 0;
};

// Copies the encoded object and the jobs to the device, runs one warp per job, copies the
// raw object (out_bytes) back to out.
LaunchResult Launch(const uint8_t* encoded, size_t encoded_bytes, const warp::StreamJob* jobs, size_t njobs,
                    uint8_t* out, size_t out_bytes);

}  // namespace kvd::codec::cuda
