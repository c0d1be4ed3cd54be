// A local tar shard mapped whole (io/mapped_region.h's MappedFile) as the
// storage of the samples read from it in place. If the file shrinks while
// mapped, the pages past its new end read as zeros; a sample whose bytes lay
// there is reported as a truncated archive, as a read would have found it.
#pragma once

#include <memory>
#include <string>

#include "io/mapped_region.h"
#include "sources/encoded_sample.h"

namespace chute {

class MappedShard final : public InPlaceStorage {
 public:
  MappedShard(std::shared_ptr<MappedFile> file, std::string url);

  bool refresh() const override { return file_->check_size(); }
  bool lost(const EncodedSample& sample) const override {
    return sample.end_offset > file_->valid_size();
  }
  Error lost_error(const EncodedSample& sample) const override;
  void release(uint64_t begin, uint64_t end) const override { file_->release(begin, end); }

 private:
  std::shared_ptr<MappedFile> file_;
  std::string url_;
};

// "shard 'URL', member 'NAME' at offset N" (or "..., sample 'KEY' at offset
// N" without a member): where a sample of a tar shard is, for errors.
SampleLocation tar_location(const std::string& url, const EncodedSample& sample,
                         const SampleMember* member);

}  // namespace chute
