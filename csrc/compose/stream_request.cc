#include "compose/stream_request.h"

#include "compose/catalog.h"

namespace chute {

StreamPlan compose_stream_plan(const StreamRequest& request) {
  StreamPlan plan = request.plan;
  plan.sources =
      request.sources ? request.sources : sample_sources_for(plan.urls, request.source);
  plan.fields.clear();
  for (const FieldRequest& f : request.fields) {
    FieldPlan field = f.field;
    field.decoder = field_decoder_for(f.codec, field.name);
    plan.fields.push_back(std::move(field));
  }
  return plan;
}

}  // namespace chute
