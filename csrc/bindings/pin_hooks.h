// Pin hooks arrive from Python (chute.gpu.pinning) as the integer addresses of
// cudaHostRegister/cudaHostUnregister.
#pragma once

#include <cstdint>

#include "memory/batch_allocator.h"

namespace chute::bindings {

inline PinHooks pin_hooks_from_addresses(uintptr_t register_fn, uintptr_t unregister_fn) {
  PinHooks hooks;
  hooks.register_fn = reinterpret_cast<decltype(hooks.register_fn)>(register_fn);
  hooks.unregister_fn = reinterpret_cast<decltype(hooks.unregister_fn)>(unregister_fn);
  return hooks;
}

}  // namespace chute::bindings
