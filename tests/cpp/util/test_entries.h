// Test helper: a queue entry that carries only a name (what the name-keyed sets look at).
#pragma once

#include <memory>
#include <string>

#include "core/tensor_entry.h"

namespace hvdc {

inline std::shared_ptr<TensorEntry> Entry(const std::string& name) {
  auto e = std::make_shared<TensorEntry>();
  e->request.name = name;
  return e;
}

}  // namespace hvdc
