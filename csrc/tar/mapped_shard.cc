#include "tar/mapped_shard.h"

#include <sstream>

namespace chute {

MappedShard::MappedShard(std::shared_ptr<MappedFile> file, std::string url)
    : InPlaceStorage(file->data()), file_(std::move(file)), url_(std::move(url)) {}

// kData, as for a tar archive found truncated when read (this one was cut
// while mapped).
Error MappedShard::lost_error(const EncodedSample& sample) const {
  std::ostringstream os;
  if (sample.key.empty()) {
    os << "shard '" << url_ << "'";
  } else {
    os << tar_location(url_, sample, nullptr).text;
  }
  os << ": truncated tar archive: the file shrank while it was being read (cut or rewritten in"
     << " place; it now ends at offset " << file_->valid_size()
     << "), so the samples past that are gone";
  return Error(ErrorKind::kData, os.str(), __FILE__, __LINE__, ErrorScope::kRead,
               {url_, "", sample.key});
}

SampleLocation tar_location(const std::string& url, const EncodedSample& sample,
                            const SampleMember* member) {
  std::ostringstream os;
  os << "shard '" << url << "'";
  if (member != nullptr) {
    os << ", member '" << member->name << "' at offset " << member->offset;
  } else {
    os << ", sample '" << sample.key << "' at offset " << sample.offset;
  }
  return {os.str(), {url, member != nullptr ? member->name : "", sample.key}};
}

}  // namespace chute
