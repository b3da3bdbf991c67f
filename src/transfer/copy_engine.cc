// The device-engine factory: OpenDeviceEngine, or the engine a test installed in its place.
// (The CPU engine is in cpu_copy_engine.cc.)
#include "transfer/copy_engine.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include "common/hex.h"
#include "transfer/cuda/ipc_handles.h"

namespace kvd::transfer {
namespace {

DeviceEngineFactory& TestFactory() {
  static DeviceEngineFactory factory;
  return factory;
}

}  // namespace

Result<std::unique_ptr<CopyEngine>> MakeDeviceEngine(
    const std::vector<layout::TensorDescriptor>& tensors, const layout::KvLayout& layout,
    const HostPool& pool, int64_t instance_id) {
  if (TestFactory()) return TestFactory()(tensors, layout, pool, instance_id);
  return OpenDeviceEngine(tensors, layout, pool, instance_id);
}

std::vector<std::string> DeviceMemoryIds(const std::vector<layout::TensorDescriptor>& tensors) {
  std::vector<std::string> ids;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto m = cuda::DescribeTensorMemory(tensors[i], i);
    if (!m.ok()) continue;
    std::string id = "cuda " + cuda::FormatDeviceUuid(m->device) + " ";
    AppendHex(id, m->handle.data(), m->handle.size());
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(std::move(id));
  }
  return ids;
}

void SetDeviceEngineFactoryForTesting(DeviceEngineFactory factory) {
  TestFactory() = std::move(factory);
}

}  // namespace kvd::transfer
