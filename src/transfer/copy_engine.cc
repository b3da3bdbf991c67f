// The device-engine factory: OpenDeviceEngine, or the engine a test installed in its place.
// (The CPU engine is in cpu_copy_engine.cc.)
#include "transfer/copy_engine.h"

#include <algorithm>
#include <mutex>
#include <sstream>

namespace kvd::transfer {
namespace {

DeviceEngineFactory& TestFactory() {
  static DeviceEngineFactory factory;
  return factory;
}

}  // namespace

Result<std::unique_ptr<CopyEngine>> MakeDeviceEngine(
    const std::vector<wire::TensorDescriptor>& tensors, const layout::KvLayout& layout,
    const HostPool& pool, int64_t instance_id) {
  if (TestFactory()) return TestFactory()(tensors, layout, pool, instance_id);
  return OpenDeviceEngine(tensors, layout, pool, instance_id);
}

void SetDeviceEngineFactoryForTesting(DeviceEngineFactory factory) {
  TestFactory() = std::move(factory);
}

}  // namespace kvd::transfer
