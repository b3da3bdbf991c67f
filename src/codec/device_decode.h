// device_decode: what the GPU decoder needs from the host, and the host emulator of its
// kernel (the CPU reference for the same stream, run in CI where no GPU is).
//
// PrepareDeviceDecode checks an encoded object completely on the host (header, checksums,
// every plane's tables, lengths and states, exactly what Decode checks) and lists its
// rANS streams as warp::StreamJob; raw planes are listed as byte copies. EmulateDevice-
// Decode runs the kernel's warp algorithm (warp_decode.h) lane by lane on the CPU. Its
// output equals codec::Decode's bit for bit (tested), and the CUDA decoder must equal it
// (checked by scripts/gpu-check.sh on a GPU machine).
// Stateless; reentrant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codec/codec.h"
#include "codec/warp_decode.h"

namespace kvd::codec {

struct RawCopy {
  uint64_t from;   // offset in the encoded object
  uint64_t to;     // offset in the raw object
  uint64_t bytes;
};

struct DevicePlan {
  ObjectLayout layout;
  std::vector<warp::StreamJob> jobs;
  std::vector<RawCopy> copies;
};

Result<DevicePlan> PrepareDeviceDecode(std::span<const uint8_t> encoded);

// Runs one job as a 32-lane warp would; false when the stream is corrupt (runs out of
// words, trailing words, or does not end in its initial states).
bool EmulateWarp(const uint8_t* encoded, const warp::StreamJob& job, uint8_t* out);

// The whole object through the emulator: out must be the object's size.
Status EmulateDeviceDecode(std::span<const uint8_t> encoded, std::span<uint8_t> out);

// The CUDA decoder (src/codec/cuda/, built when nvcc is found): the same plan run on
// the GPU, the object copied to the device and the result back. Unavailable when kvd was
// built without CUDA or no device is present.
Status DecodeOnGpu(std::span<const uint8_t> encoded, std::span<uint8_t> out, double* kernel_seconds = nullptr);
bool GpuDecoderBuilt();

}  // namespace kvd::codec
