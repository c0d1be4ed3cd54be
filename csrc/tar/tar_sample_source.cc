#include "tar/tar_sample_source.h"

#include "core/error.h"
#include "tar/mapped_shard.h"
#include "tar/sample_reader.h"

namespace chute {
namespace {

class TarSampleSource final : public SampleSource {
 public:
  TarSampleSource(std::unique_ptr<ByteSource> bytes, uint32_t index, bool in_place)
      : reader_(std::move(bytes), index, in_place) {}

  // A shard read in place that shrank under its mapping is reported as
  // such: the zeros read from it parse as a bad header or as the end of the
  // archive. (A sample's own bytes are checked after it is decoded.)
  bool next(EncodedSample& out) override {
    bool more = false;
    lost_ = false;
    try {
      more = reader_.next(out);
    } catch (const Error&) {
      if (out.in_place && out.in_place->refresh()) {
        lost_ = true;
        throw out.in_place->lost_error(out);
      }
      throw;
    }
    if (!more && out.in_place && out.in_place->refresh()) {
      lost_ = true;
      throw out.in_place->lost_error(out);
    }
    return more;
  }

  Failure failure() const override { return lost_ ? Failure{false, 1} : reader_.failure(); }

  bool in_place() const override { return reader_.in_place(); }

 private:
  SampleReader reader_;
  bool lost_ = false;  // the last error was the shard shrinking: nothing follows
};

}  // namespace

std::unique_ptr<SampleSource> TarSampleSources::open(const std::string& url, uint32_t index,
                                                     const SourceOpenOptions& options) const {
  SourceOptions source = options_;
  source.cancel = options.cancel;
  return std::make_unique<TarSampleSource>(open_source(url, source), index, options.in_place);
}

SampleLocation TarSampleSources::location(const std::string& url, const EncodedSample& sample,
                                          const SampleMember* member) const {
  return tar_location(url, sample, member);
}

}  // namespace chute
