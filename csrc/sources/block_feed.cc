#include "sources/block_feed.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace chute {

struct BlockFeed::Shared {
  std::vector<std::string> extensions;
  std::vector<std::string> column_names;
  std::vector<std::string> urls;
  std::vector<int64_t> rows;
  std::vector<std::string> names;
  std::vector<int64_t> first_keys;
  std::vector<std::string> files;
  std::unordered_map<std::string, size_t> by_url;

  std::mutex mutex;  // guards the fields below
  std::condition_variable requested;
  std::deque<Request> queue;
  std::unordered_map<uint64_t, std::weak_ptr<Pending>> waiting;  // by ticket
  uint64_t last_ticket = 0;
  bool closed = false;
  std::atomic<uint64_t> bytes_read{0};
};

struct BlockFeed::Pending {
  explicit Pending(size_t b) : block(b) {}
  const size_t block;
  std::mutex mutex;  // guards the fields below
  std::condition_variable arrived;
  bool ready = false;
  std::optional<Error> error;
  std::vector<BlockColumn> columns;
  std::shared_ptr<void> owner;
};

class BlockFeed::Source final : public SampleSource {
 public:
  Source(std::shared_ptr<Shared> shared, std::shared_ptr<Pending> pending, size_t block,
         uint32_t index, const std::atomic<bool>* cancel)
      : shared_(std::move(shared)),
        pending_(std::move(pending)),
        block_(block),
        index_(index),
        cancel_(cancel) {}

  bool next(EncodedSample& s) override {
    if (pending_ == nullptr) return false;
    if (!arrived_) await();
    const int64_t rows = shared_->rows[block_];
    if (row_ >= rows) {
      pending_ = nullptr;  // the block's memory goes once no sample points into it
      return false;
    }
    const auto row = static_cast<size_t>(row_);
    s.key = std::to_string(shared_->first_keys[block_] + row_);
    s.source_index = index_;
    s.offset = row;
    s.end_offset = row + 1;
    s.members.clear();
    s.nulls.clear();
    s.data.clear();
    s.in_place = nullptr;
    s.payload_bytes = 0;
    s.flawed = false;
    for (size_t c = 0; c < pending_->columns.size(); ++c) {
      const BlockColumn& col = pending_->columns[c];
      SampleMember m;
      m.extension = shared_->extensions[c];
      m.name = shared_->column_names[c];
      m.offset = row;
      if (col.present != nullptr && col.present[row] == 0) {
        s.nulls.push_back(std::move(m));
        continue;
      }
      m.data_offset = static_cast<uint64_t>(col.offsets[row]);
      m.data_size = static_cast<size_t>(col.offsets[row + 1] - col.offsets[row]);
      m.data_begin = s.data.size();
      const uint8_t* from = col.data + col.offsets[row];
      s.data.insert(s.data.end(), from, from + m.data_size);
      s.payload_bytes += m.data_size;
      s.members.push_back(std::move(m));
    }
    shared_->bytes_read.fetch_add(s.payload_bytes, std::memory_order_relaxed);
    ++row_;
    return true;
  }

  Failure failure() const override { return Failure{false, 1}; }
  bool in_place() const override { return false; }

 private:
  // Waits for the block; throws (and ends the source) when it cannot be read
  // or the engine closes meanwhile.
  void await() {
    std::unique_lock<std::mutex> lock(pending_->mutex);
    while (!pending_->ready) {
      if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
        lock.unlock();
        pending_ = nullptr;
        CHUTE_CHECK(false, kIo, shared_->names[block_] << ": closed while awaited");
      }
      pending_->arrived.wait_for(lock, std::chrono::milliseconds(50));
    }
    if (pending_->error) {
      // The block could not be read (or its columns do not fit it): a read
      // failure of its file.
      const Error error =
          pending_->error->scoped(ErrorScope::kRead, {shared_->files[block_], "", ""});
      lock.unlock();
      pending_ = nullptr;
      throw error;
    }
    arrived_ = true;
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Pending> pending_;  // null once the source ended
  const size_t block_;
  const uint32_t index_;
  const std::atomic<bool>* cancel_;
  bool arrived_ = false;
  int64_t row_ = 0;
};

BlockFeed::BlockFeed(std::vector<std::string> extensions, std::vector<std::string> column_names,
                     std::vector<std::string> urls, std::vector<int64_t> rows,
                     std::vector<std::string> names, std::vector<int64_t> first_keys,
                     std::vector<std::string> files)
    : shared_(std::make_shared<Shared>()) {
  CHUTE_CHECK(column_names.size() == extensions.size(), kUsage,
              "block feed: " << extensions.size() << " extensions but " << column_names.size()
                             << " column names");
  CHUTE_CHECK(rows.size() == urls.size() && names.size() == urls.size() &&
                  first_keys.size() == urls.size() && files.size() == urls.size(),
              kUsage, "block feed: " << urls.size() << " urls but " << rows.size() << " row counts, "
                                     << names.size() << " names, " << first_keys.size()
                                     << " first keys and " << files.size() << " files");
  for (size_t b = 0; b < urls.size(); ++b) {
    CHUTE_CHECK(rows[b] >= 0, kUsage, "block feed: " << names[b] << " has " << rows[b] << " rows");
    CHUTE_CHECK(shared_->by_url.emplace(urls[b], b).second, kUsage,
                "block feed: url '" << urls[b] << "' is given twice");
  }
  shared_->extensions = std::move(extensions);
  shared_->column_names = std::move(column_names);
  shared_->urls = std::move(urls);
  shared_->rows = std::move(rows);
  shared_->names = std::move(names);
  shared_->first_keys = std::move(first_keys);
  shared_->files = std::move(files);
}

BlockFeed::~BlockFeed() { close(); }

size_t BlockFeed::num_blocks() const { return shared_->urls.size(); }

int64_t BlockFeed::block_rows(size_t block) const {
  CHUTE_CHECK(block < shared_->rows.size(), kUsage,
              "block " << block << " is out of range (" << shared_->rows.size() << " blocks)");
  return shared_->rows[block];
}

uint64_t BlockFeed::bytes_read() const {
  return shared_->bytes_read.load(std::memory_order_relaxed);
}

std::unique_ptr<SampleSource> BlockFeed::open(const std::string& url, uint32_t index,
                                              const SourceOpenOptions& options) const {
  const auto found = shared_->by_url.find(url);
  CHUTE_CHECK(found != shared_->by_url.end(), kUsage,
              "'" << url << "' is not one of the row groups this stream was opened with");
  auto pending = std::make_shared<Pending>(found->second);
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    const uint64_t ticket = ++shared_->last_ticket;
    shared_->waiting[ticket] = pending;
    shared_->queue.push_back(Request{ticket, found->second});
  }
  shared_->requested.notify_one();
  return std::make_unique<Source>(shared_, std::move(pending), found->second, index,
                                  options.cancel);
}

SampleLocation BlockFeed::location(const std::string& url, const EncodedSample& sample,
                                   const SampleMember* member) const {
  const auto found = shared_->by_url.find(url);
  const bool known = found != shared_->by_url.end();
  std::ostringstream os;
  os << (known ? shared_->names[found->second] : "'" + url + "'") << ", row " << sample.offset;
  if (member != nullptr) os << ", column '" << member->name << "'";
  return {os.str(),
          {known ? shared_->files[found->second] : url, member != nullptr ? member->name : "",
           sample.key}};
}

std::optional<BlockFeed::Request> BlockFeed::next_request(std::optional<double> timeout_s) const {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(timeout_s.value_or(0)));
  std::unique_lock<std::mutex> lock(shared_->mutex);
  while (true) {
    while (!shared_->queue.empty()) {
      const Request request = shared_->queue.front();
      shared_->queue.pop_front();
      const auto it = shared_->waiting.find(request.ticket);
      if (it != shared_->waiting.end() && !it->second.expired()) return request;
      if (it != shared_->waiting.end()) shared_->waiting.erase(it);  // its source is gone
    }
    if (shared_->closed) return std::nullopt;
    if (!timeout_s) {
      shared_->requested.wait(lock);
    } else if (shared_->requested.wait_until(lock, until) == std::cv_status::timeout &&
               shared_->queue.empty()) {
      return std::nullopt;
    }
  }
}

namespace {

std::shared_ptr<BlockFeed::Pending> take_waiting(BlockFeed::Shared& shared, uint64_t ticket) {
  std::lock_guard<std::mutex> lock(shared.mutex);
  const auto it = shared.waiting.find(ticket);
  if (it == shared.waiting.end()) return nullptr;
  std::shared_ptr<BlockFeed::Pending> pending = it->second.lock();
  shared.waiting.erase(it);
  return pending;
}

}  // namespace

void BlockFeed::put(uint64_t ticket, std::vector<BlockColumn> columns,
                    std::shared_ptr<void> owner) const {
  std::shared_ptr<Pending> pending = take_waiting(*shared_, ticket);
  if (pending == nullptr) return;
  std::optional<Error> bad;
  try {
    check_block_columns(shared_->names[pending->block], shared_->column_names,
                        shared_->rows[pending->block], columns);
  } catch (const Error& e) {
    bad = e;
  }
  {
    std::lock_guard<std::mutex> lock(pending->mutex);
    if (bad) {
      pending->error = bad;
    } else {
      pending->columns = std::move(columns);
      pending->owner = std::move(owner);
    }
    pending->ready = true;
  }
  pending->arrived.notify_all();
  if (bad) throw *bad;
}

void BlockFeed::fail(uint64_t ticket, const Error& error) const {
  std::shared_ptr<Pending> pending = take_waiting(*shared_, ticket);
  if (pending == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pending->mutex);
    pending->error = error;
    pending->ready = true;
  }
  pending->arrived.notify_all();
}

void BlockFeed::close() const {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->closed = true;
  }
  shared_->requested.notify_all();
}

}  // namespace chute
