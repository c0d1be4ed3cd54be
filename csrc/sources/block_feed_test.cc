#include "sources/block_feed.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace chute {
namespace {

std::string payload(const EncodedSample& s, size_t member) {
  const SampleMember& m = s.members[member];
  return std::string(reinterpret_cast<const char*>(s.bytes()) + m.data_begin, m.data_size);
}

BlockColumn column(const std::string& data, const std::vector<int64_t>& offsets,
                   const uint8_t* present = nullptr) {
  return BlockColumn{reinterpret_cast<const uint8_t*>(data.data()), data.size(), offsets.data(),
                     present};
}

// Two blocks: "g0" of 3 rows (keys from 10), "g1" of 2 rows.
BlockFeed make_feed() {
  return BlockFeed({"img", "txt"}, {"image", "text"}, {"f#0", "f#1"}, {3, 2},
                   {"file 'f', row group 0", "file 'f', row group 1"}, {10, 0}, {"f", "f"});
}

TEST(BlockFeed, OpeningRequestsTheBlockAndRowsBecomeSamples) {
  BlockFeed feed = make_feed();
  SourceOpenOptions options;
  std::unique_ptr<SampleSource> second = feed.open("f#1", 7, options);
  std::unique_ptr<SampleSource> first = feed.open("f#0", 3, options);
  // Requests come in the order the engine opened the urls.
  auto r1 = feed.next_request(0);
  auto r0 = feed.next_request(0);
  ASSERT_TRUE(r1 && r0);
  EXPECT_EQ(r1->block, 1u);
  EXPECT_EQ(r0->block, 0u);
  EXPECT_FALSE(feed.next_request(0));

  const std::string img = "abbccc", txt = "xz";
  const std::vector<int64_t> img_off{0, 1, 3, 6}, txt_off{0, 1, 1, 2};
  const std::vector<uint8_t> txt_present{1, 0, 1};
  auto owner = std::make_shared<int>(1);
  std::weak_ptr<int> watch = owner;
  feed.put(r0->ticket, {column(img, img_off), column(txt, txt_off, txt_present.data())},
           std::move(owner));
  EncodedSample s;
  ASSERT_TRUE(first->next(s));
  EXPECT_EQ(s.key, "10");
  EXPECT_EQ(s.source_index, 3u);
  ASSERT_EQ(s.members.size(), 2u);
  EXPECT_EQ(payload(s, 0), "a");
  EXPECT_EQ(payload(s, 1), "x");
  ASSERT_TRUE(first->next(s));
  ASSERT_EQ(s.members.size(), 1u);  // a null is no member
  EXPECT_EQ(payload(s, 0), "bb");
  const SampleLocation at = feed.location("f#0", s, &s.members[0]);
  EXPECT_EQ(at.text, "file 'f', row group 0, row 1, column 'image'");
  EXPECT_EQ(at.place.url, "f");  // the file, not the row group's url
  EXPECT_EQ(at.place.member, "image");
  EXPECT_EQ(at.place.key, "11");
  ASSERT_TRUE(first->next(s));
  EXPECT_EQ(s.key, "12");
  EXPECT_FALSE(first->next(s));
  EXPECT_TRUE(watch.expired());  // the block's memory went with its last row
  EXPECT_EQ(feed.bytes_read(), 8u);

  feed.fail(r1->ticket, Error(ErrorKind::kData, "file 'f', row group 1: corrupt page", __FILE__,
                              __LINE__));
  try {
    second->next(s);
    FAIL() << "expected the block's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
    EXPECT_EQ(e.message(), "file 'f', row group 1: corrupt page");
  }
  EXPECT_FALSE(second->next(s));
}

TEST(BlockFeed, ColumnsThatDoNotFitTheBlockFailItsSource) {
  BlockFeed feed = make_feed();
  std::unique_ptr<SampleSource> source = feed.open("f#1", 0, SourceOpenOptions{});
  auto request = feed.next_request(0);
  ASSERT_TRUE(request);
  const std::string data = "ab";
  const std::vector<int64_t> past_the_end{0, 1, 5};
  EXPECT_THROW(feed.put(request->ticket, {column(data, past_the_end), column(data, past_the_end)},
                        nullptr),
               Error);
  EncodedSample s;
  EXPECT_THROW(source->next(s), Error);
}

TEST(BlockFeed, AWaitingSourceGivesUpWhenTheEngineCloses) {
  BlockFeed feed = make_feed();
  std::atomic<bool> cancel{false};
  SourceOpenOptions options;
  options.cancel = &cancel;
  std::unique_ptr<SampleSource> source = feed.open("f#0", 0, options);
  std::thread closer([&] { cancel = true; });
  EncodedSample s;
  EXPECT_THROW(source->next(s), Error);
  closer.join();
}

TEST(BlockFeed, RequestsOfGoneSourcesAreDroppedAndCloseWakesTheReaders) {
  BlockFeed feed = make_feed();
  { auto gone = feed.open("f#0", 0, SourceOpenOptions{}); }
  EXPECT_FALSE(feed.next_request(0));
  EXPECT_THROW(feed.open("elsewhere", 0, SourceOpenOptions{}), Error);
  std::thread reader([&] { EXPECT_FALSE(feed.next_request(60)); });
  feed.close();
  reader.join();
}

TEST(BlockFeed, AReaderWithoutATimeoutWaitsForARequestOrTheClose) {
  BlockFeed feed = make_feed();
  std::optional<BlockFeed::Request> taken;
  std::thread reader([&] { taken = feed.next_request(); });
  auto source = feed.open("f#1", 0, SourceOpenOptions{});
  reader.join();
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->block, 1u);
  std::thread idle([&] { EXPECT_FALSE(feed.next_request()); });
  feed.close();
  idle.join();
  EXPECT_FALSE(feed.next_request());  // closed: no wait at all
}

}  // namespace
}  // namespace chute
