// Builds without nvcc: no GPU decoder (device_decode.h).
#include "codec/device_decode.h"

namespace kvd::codec {

Status DecodeOnGpu(std::span<const uint8_t>, std::span<uint8_t>, double*) {
  return Status::Unavailable("codec: built without CUDA (no GPU decoder)");
}
bool GpuDecoderBuilt() { return false; }

}  // namespace kvd::codec
