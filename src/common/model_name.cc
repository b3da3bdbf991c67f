#include "common/model_name.h"

#include <string>

namespace kvd {

Status CheckModelName(std::string_view name, bool allow_empty) {
  if ((name.empty() && !allow_empty) || name.find('@') != std::string_view::npos) {
    return Status::InvalidArgument("model_name must be non-empty and must not contain '@'");
  }
  if (name.size() > kMaxModelNameBytes) {
    return Status::InvalidArgument("model_name is " + std::to_string(name.size()) +
                                   " bytes, over the bound of " + std::to_string(kMaxModelNameBytes));
  }
  if (name.find("-SEP-") != std::string_view::npos) {
    return Status::InvalidArgument(
        "model_name must not contain '-SEP-' (tier object keys spell '/' that way, so the name "
        "would share objects with another model)");
  }
  return Status::Ok();
}

}  // namespace kvd
