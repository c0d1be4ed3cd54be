// How the stream engine reads samples without knowing their format: a source
// factory opens each url of the plan as a SampleSource (a tar shard over a
// file, a pipe or an object in a remote store; tar/tar_sample_source.h) and
// says where a sample is when an error must name it. Index-driven reading
// has its own interface (indexed_sample_source.h, row_source.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "sources/encoded_sample.h"

namespace chute {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Fills `out` with the next sample, reusing its buffers (`out.data` may
  // arrive with capacity); false at the end. Throws chute::Error naming the
  // url and offset when the source is malformed or cannot be read; see
  // failure() for what the error cost, and EncodedSample::flawed.
  virtual bool next(EncodedSample& out) = 0;
  // What the error that next() threw last cost.
  struct Failure {
    // next() goes on after the error; else the source ended there (a
    // corrupt header, a truncation, a failed read) and next() returns false.
    bool resumable = false;
    // Samples it cost: 1 for a bad sample; 0 for a fault reported after the
    // sample it flawed, which went on without it (a repeated member left
    // out); 1 for an error that ended the source: the sample it may have cut
    // short (delivered as read, so a consumer that drops the sample before
    // the end for what it lacks must not count it twice), or the one of
    // which nothing was read. What followed the end cannot be counted.
    uint64_t samples_lost = 1;
  };
  virtual Failure failure() const = 0;
  // Whether samples point into shared storage (InPlaceStorage) rather than
  // holding copies: they then need no payload buffer.
  virtual bool in_place() const = 0;
};

struct SourceOpenOptions {
  // Samples may point into the source's storage. The engine asks for it
  // only when samples do not wait in a shuffle buffer (views would keep the
  // storage of every shard they came from alive while they wait).
  bool in_place = false;
  // Set when the engine closes: a read blocked on a slow source gives up.
  // Owned by the engine, which outlives its sources.
  const std::atomic<bool>* cancel = nullptr;
};

class SampleSourceFactory {
 public:
  virtual ~SampleSourceFactory() = default;
  // Opens `url`; its samples carry `index` as their source_index.
  virtual std::unique_ptr<SampleSource> open(const std::string& url, uint32_t index,
                                             const SourceOpenOptions& options) const = 0;
  // Where `sample` (or its `member`, when not null) lies in `url`, for
  // errors. Built only on failure.
  virtual SampleLocation location(const std::string& url, const EncodedSample& sample,
                               const SampleMember* member) const = 0;
};

}  // namespace chute
