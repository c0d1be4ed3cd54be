#include "engine/sample_chunk.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "sources/sample_testing.h"

namespace chute {
namespace {

PlannedSample planned(const std::string& key, size_t payload = 10) {
  PlannedSample p;
  p.encoded = test::encoded_sample(key, {{"txt", std::string(payload, 'x')}});
  return p;
}

std::vector<std::string> keys(const SampleChunk& chunk) {
  std::vector<std::string> out;
  for (const PlannedSample& s : chunk.samples) out.push_back(s.encoded.key);
  return out;
}

TEST(ChunkFiller, IsFullAtItsSampleCount) {
  ChunkFiller filler(3);
  EXPECT_TRUE(filler.empty());
  EXPECT_FALSE(filler.add(planned("a")));
  EXPECT_FALSE(filler.add(planned("b")));
  EXPECT_TRUE(filler.add(planned("c")));
  const SampleChunk chunk = filler.take();
  EXPECT_EQ(keys(chunk), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(chunk.end);
  EXPECT_FALSE(chunk.error);
  // The next chunk starts empty, its count and bytes from zero.
  EXPECT_TRUE(filler.empty());
  EXPECT_FALSE(filler.add(planned("d")));
}

TEST(ChunkFiller, IsFullAtItsBytes) {
  const size_t one = planned("a", 1000).encoded.held_bytes();
  ChunkFiller filler(100, 2 * one);
  EXPECT_FALSE(filler.add(planned("a", 1000)));
  EXPECT_TRUE(filler.add(planned("b", 1000)));
  EXPECT_EQ(keys(filler.take()), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(filler.add(planned("c", 1000)));
}

TEST(ChunkFiller, ASampleLargerThanTheBytesIsAChunkAlone) {
  ChunkFiller filler(100, 64);
  EXPECT_TRUE(filler.add(planned("big", 1000)));
  EXPECT_EQ(keys(filler.take()), (std::vector<std::string>{"big"}));
}

TEST(ChunkFiller, FlushSendsOnlyAChunkWithSamples) {
  BoundedQueue<SampleChunk> queue(4);
  ChunkFiller filler(10);
  EXPECT_TRUE(filler.flush_to(queue));
  EXPECT_EQ(queue.size(), 0u);
  filler.add(planned("a"));
  EXPECT_TRUE(filler.flush_to(queue));
  EXPECT_TRUE(filler.empty());
  std::optional<SampleChunk> sent = queue.pop();
  ASSERT_TRUE(sent);
  EXPECT_EQ(keys(*sent), (std::vector<std::string>{"a"}));
}

TEST(ChunkFiller, FlushToAClosedQueueFails) {
  BoundedQueue<SampleChunk> queue(4);
  queue.close();
  ChunkFiller filler(10);
  EXPECT_TRUE(filler.flush_to(queue));  // nothing to send
  filler.add(planned("a"));
  EXPECT_FALSE(filler.flush_to(queue));
}

TEST(SampleChunk, EndingAndFailureCarryNoSamples) {
  const SampleChunk end = SampleChunk::ending();
  EXPECT_TRUE(end.end);
  EXPECT_FALSE(end.error);
  EXPECT_TRUE(end.samples.empty());
  const SampleChunk failure =
      SampleChunk::failure(std::make_exception_ptr(std::runtime_error("boom")));
  EXPECT_FALSE(failure.end);
  ASSERT_TRUE(failure.error);
  EXPECT_TRUE(failure.samples.empty());
  EXPECT_THROW(std::rethrow_exception(failure.error), std::runtime_error);
}

}  // namespace
}  // namespace chute
