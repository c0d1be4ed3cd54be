#include "core/read_cancel.h"

namespace chute {

namespace {
thread_local const std::atomic<bool>* t_read_cancel = nullptr;
}  // namespace

const std::atomic<bool>* current_read_cancel() { return t_read_cancel; }

ReadCancelScope::ReadCancelScope(const std::atomic<bool>* flag) : previous_(t_read_cancel) {
  t_read_cancel = flag;
}

ReadCancelScope::~ReadCancelScope() { t_read_cancel = previous_; }

}  // namespace chute
