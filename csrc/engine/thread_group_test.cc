#include "engine/thread_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>

namespace chute {
namespace {

TEST(ThreadGroup, DestructionJoinsEveryThread) {
  std::atomic<int> done{0};
  {
    ThreadGroup group;
    for (int i = 0; i < 4; ++i) group.spawn("chute-test", [&done] { done.fetch_add(1); });
    EXPECT_EQ(group.size(), 4u);
  }
  EXPECT_EQ(done.load(), 4);
}

TEST(ThreadGroup, JoinEmptiesTheGroup) {
  std::atomic<int> done{0};
  ThreadGroup group;
  group.spawn("chute-test", [&done] { done.fetch_add(1); });
  group.join();
  EXPECT_EQ(done.load(), 1);
  EXPECT_EQ(group.size(), 0u);
  group.join();  // again: nothing to do
}

#if defined(__linux__)
TEST(ThreadGroup, ThreadsCarryTheirName) {
  std::string name;
  {
    ThreadGroup group;
    group.spawn("chute-decode", [&name] {
      char buf[16] = {};
      pthread_getname_np(pthread_self(), buf, sizeof buf);
      name = buf;
    });
  }
  EXPECT_EQ(name, "chute-decode");
}
#endif

}  // namespace
}  // namespace chute
