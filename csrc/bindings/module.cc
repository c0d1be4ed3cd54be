#include "bindings/engine_face.h"
#include "bindings/registry.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "chute's native engine";
  chute::bindings::register_errors(m);
  // First: the other files' functions take its types (FetchQueue, SourceOptions).
  chute::bindings::register_remote(m);
  chute::bindings::register_batch(m);
  chute::bindings::register_stream(m);
  chute::bindings::register_tar(m);
  chute::bindings::register_decode(m);
  chute::bindings::register_indexed(m);
  chute::bindings::register_tokens(m);  // after indexed: its sources are RowSources
  chute::bindings::register_dropin(m);
  chute::bindings::register_elastic(m);
  chute::bindings::register_exit(m);
}
