#include "compose/stream_request.h"

#include <gtest/gtest.h>

#include <memory>

#include "sources/sample_testing.h"
#include "tar/tar_sample_source.h"

namespace chute {
namespace {

TEST(StreamRequest, UrlsThatPythonDoesNotFeedAreReadAsTar) {
  StreamRequest request;
  request.plan.urls = {"/data/a.tar", "relative/b.tar", "pipe:cat /data/c.tar"};
  const StreamPlan plan = compose_stream_plan(request);
  EXPECT_TRUE(dynamic_cast<const TarSampleSources*>(plan.sources.get()) != nullptr);
}

TEST(StreamRequest, TheSourcesARequestBringsAreTheOnesThePlanReads) {
  StreamRequest request;
  request.plan.urls = {"rowgroup-0", "rowgroup-1"};
  const auto fed = std::make_shared<const test::LocatingSources>();
  request.sources = fed;
  EXPECT_EQ(compose_stream_plan(request).sources, fed);
}

}  // namespace
}  // namespace chute
