#include "compose/stream_request.h"

#include <memory>

#include "compose/catalog.h"
#include "tar/tar_sample_source.h"

namespace chute {

StreamPlan compose_stream_plan(const StreamRequest& request) {
  StreamPlan plan = request.plan;
  plan.sources =
      request.sources ? request.sources : std::make_shared<TarSampleSources>(request.source);
  plan.fields.clear();
  for (const FieldRequest& f : request.fields) {
    FieldPlan field = f.field;
    field.decoder = field_decoder_for(f.codec, field.name);
    plan.fields.push_back(std::move(field));
  }
  return plan;
}

}  // namespace chute
