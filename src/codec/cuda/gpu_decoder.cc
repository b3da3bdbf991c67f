// DecodeOnGpu (device_decode.h) in CUDA builds: verify and plan on the host, run the
// kernel (decode_kernel.h), copy raw planes on the host.
#include <cstring>

#include "codec/cuda/decode_kernel.h"
#include "codec/device_decode.h"

namespace kvd::codec {

bool GpuDecoderBuilt() { return true; }

Status DecodeOnGpu(std::span<const uint8_t> encoded, std::span<uint8_t> out, double* kernel_seconds) {
  auto plan = PrepareDeviceDecode(encoded);
  if (!plan.ok()) return plan.status();
  if (out.size() != plan->layout.Bytes()) return Status::InvalidArgument("codec GPU decoder: output buffer size");
  const cuda::LaunchResult r =
      cuda::Launch(encoded.data(), encoded.size(), plan->jobs.data(), plan->jobs.size(), out.data(), out.size());
  if (!r.ok) return Status::Unavailable("codec GPU decoder: " + r.error);
  if (kernel_seconds) *kernel_seconds = r.kernel_seconds;
  for (const auto& c : plan->copies) memcpy(out.data() + c.to, encoded.data() + c.from, c.bytes);
  if (r.corrupt_streams != 0) {
    return Status::InvalidArgument("codec GPU decoder: " + std::to_string(r.corrupt_streams) + " corrupt stream(s)");
  }
  return Status::Ok();
}

}  // namespace kvd::codec
