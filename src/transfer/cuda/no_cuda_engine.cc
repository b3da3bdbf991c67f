// OpenDeviceEngine for kvd builds without CUDA (nvcc not found at configure time, or
// -DKVD_CUDA=OFF): every GPU registration is refused with a message that says so. CMake
// compiles this file instead of the CUDA engine; see the CUDA block in CMakeLists.txt.
#include "transfer/copy_engine.h"

namespace kvd::transfer {

Result<std::unique_ptr<CopyEngine>> OpenDeviceEngine(
    const std::vector<layout::TensorDescriptor>& tensors, const layout::KvLayout&,
    const HostPool&, int64_t) {
  size_t i = 0;
  while (i < tensors.size() && tensors[i].memory == layout::TensorMemory::kCpuShm) ++i;
  return Status::FailedPrecondition(
      "kv_cache[" + std::to_string(i) +
      "] is GPU memory (CUDA IPC); this kvd build has no CUDA support (it was built without "
      "nvcc, or with -DKVD_CUDA=OFF), so only CPU shared-memory KV caches can be registered");
}

}  // namespace kvd::transfer
