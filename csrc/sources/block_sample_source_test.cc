#include "sources/block_sample_source.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "core/error.h"

namespace chute {
namespace {

std::string payload(const EncodedSample& s, size_t member) {
  const SampleMember& m = s.members[member];
  return std::string(reinterpret_cast<const char*>(s.bytes()) + m.data_begin, m.data_size);
}

// Two blocks of rows [0, 3) and [3, 5); column "img" holds "a", "bb", "", "ccc", "d",
// column "txt" holds "x", null, "y", "z", "w".
struct Fixture {
  std::string img0 = "abb", txt0 = "xy", img1 = "cccd", txt1 = "zw";
  std::vector<int64_t> img0_off{0, 1, 3, 3}, txt0_off{0, 1, 1, 2};
  std::vector<int64_t> img1_off{0, 3, 4}, txt1_off{0, 1, 2};
  std::vector<uint8_t> txt0_present{1, 0, 1};
  BlockSampleSource source{{"c0", "c1"}, {"img", "txt"}, {0, 3, 5}, {"block A", "block B"}, {"a", "b"}};

  static BlockColumn column(const std::string& data, const std::vector<int64_t>& offsets,
                            const uint8_t* present = nullptr) {
    return BlockColumn{reinterpret_cast<const uint8_t*>(data.data()), data.size(), offsets.data(),
                       present};
  }
  void put_all(std::shared_ptr<void> owner = nullptr) {
    source.put(0, {column(img0, img0_off), column(txt0, txt0_off, txt0_present.data())}, owner);
    source.put(1, {column(img1, img1_off), column(txt1, txt1_off)}, owner);
  }
};

TEST(BlockSampleSource, ReadsMembersAcrossBlocks) {
  Fixture f;
  f.put_all();
  EXPECT_EQ(f.source.num_samples(), 5);
  EXPECT_EQ(f.source.payload_bytes(1), 2u);  // "bb" and a null
  const std::vector<int64_t> ids{4, 1, 0, 3};
  std::vector<EncodedSample> out(ids.size());
  std::vector<std::optional<Error>> errors(ids.size());
  f.source.read(ids.data(), ids.size(), out.data(), errors.data());
  for (const auto& e : errors) EXPECT_FALSE(e.has_value());
  ASSERT_EQ(out[0].members.size(), 2u);
  EXPECT_EQ(payload(out[0], 0), "d");
  EXPECT_EQ(payload(out[0], 1), "w");
  // One member: left in place in the column's buffer.
  ASSERT_EQ(out[1].members.size(), 1u);
  EXPECT_NE(out[1].in_place, nullptr);
  EXPECT_EQ(out[1].members[0].extension, "c0");
  EXPECT_EQ(payload(out[1], 0), "bb");
  EXPECT_EQ(payload(out[2], 1), "x");
  EXPECT_EQ(payload(out[3], 0), "ccc");
  const SampleLocation at = f.source.location(out[3], &out[3].members[0]);
  EXPECT_EQ(at.text, "block B, row 0 (sample 3), column 'img'");
  // As data: the block's file, the column, the sample's key.
  EXPECT_EQ(at.place.url, "b");
  EXPECT_EQ(at.place.member, "img");
  EXPECT_EQ(at.place.key, "3");
}

TEST(BlockSampleSource, SampleOfADroppedBlockFailsNamingIt) {
  Fixture f;
  f.put_all();
  f.source.drop(0);
  EXPECT_EQ(f.source.blocks_held(), 1u);
  EXPECT_EQ(f.source.payload_bytes(2), 0u);
  const int64_t id = 2;
  EncodedSample out;
  std::optional<Error> error;
  f.source.read(&id, 1, &out, &error);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->message(), "block A, row 2 (sample 2): its block was not read ahead of the batch");
}

TEST(BlockSampleSource, OwnerLivesWhileASamplePointsIntoIt) {
  Fixture f;
  auto owner = std::make_shared<int>(7);
  f.put_all(owner);
  const int64_t id = 1;
  EncodedSample out;
  std::optional<Error> error;
  f.source.read(&id, 1, &out, &error);
  f.source.drop(0);
  f.source.drop(1);
  EXPECT_GT(owner.use_count(), 1);  // out still points into block A's buffer
  out.in_place = nullptr;
  EXPECT_EQ(owner.use_count(), 1);
}

TEST(BlockSampleSource, RejectsOffsetsPastTheBuffer) {
  Fixture f;
  std::vector<int64_t> bad{0, 1, 3, 9};
  try {
    f.source.put(0, {Fixture::column(f.img0, bad), Fixture::column(f.txt0, f.txt0_off)}, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "block A, column 'img': values end at byte 9 of a buffer of 3 bytes");
  }
}

TEST(BlockSampleSource, SamplesOfAnExpectedBlockWaitUntilItIsPut) {
  Fixture f;
  f.source.expect(1);
  const std::atomic<bool> cancel{false};
  std::atomic<bool> returned{false};
  const std::vector<int64_t> ids{0, 4};
  std::thread waiter([&] {
    f.source.wait_readable(ids.data(), ids.size(), cancel);
    returned = true;
  });
  // Block A was never expected: it does not hold the wait up.
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_FALSE(returned.load());
  f.put_all();
  waiter.join();
  EXPECT_TRUE(returned.load());
  std::vector<EncodedSample> out(ids.size());
  std::vector<std::optional<Error>> errors(ids.size());
  f.source.read(ids.data(), ids.size(), out.data(), errors.data());
  EXPECT_FALSE(errors[0].has_value());
  EXPECT_FALSE(errors[1].has_value());
  EXPECT_EQ(payload(out[1], 0), "d");
}

TEST(BlockSampleSource, SamplesOfAFailedBlockCarryItsError) {
  Fixture f;
  f.put_all();
  f.source.expect(0);  // already put: stays readable
  f.source.expect(1);
  const std::atomic<bool> cancel{false};
  f.source.fail(1, Error(ErrorKind::kData, "block B: corrupt page", __FILE__, __LINE__));
  const std::vector<int64_t> ids{2, 3, 4};
  f.source.wait_readable(ids.data(), ids.size(), cancel);  // a failed block is settled
  std::vector<EncodedSample> out(ids.size());
  std::vector<std::optional<Error>> errors(ids.size());
  f.source.read(ids.data(), ids.size(), out.data(), errors.data());
  EXPECT_FALSE(errors[0].has_value());
  for (size_t i : {1, 2}) {
    ASSERT_TRUE(errors[i].has_value());
    EXPECT_EQ(errors[i]->kind(), ErrorKind::kData);
    EXPECT_EQ(errors[i]->message(), "block B: corrupt page");
    EXPECT_EQ(out[i].source_index, 1u);  // still says where the sample is
  }
  EXPECT_EQ(out[2].offset, 1u);
  // Dropped, it is forgotten (read again, it may be put).
  f.source.drop(1);
  f.source.read(ids.data() + 1, 1, out.data(), errors.data());
  EXPECT_EQ(errors[0]->message(), "block B, row 0 (sample 3): its block was not read ahead of the batch");
}

TEST(BlockSampleSource, AWaitEndsWhenCancelled) {
  Fixture f;
  f.source.expect(0);
  std::atomic<bool> cancel{false};
  std::optional<Error> error;
  const int64_t id = 1;
  std::thread waiter([&] {
    try {
      f.source.wait_readable(&id, 1, cancel);
    } catch (const Error& e) {
      error = e;
    }
  });
  cancel = true;
  waiter.join();
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->message(), "block A: the engine closed while the block was read");
}

}  // namespace
}  // namespace chute
