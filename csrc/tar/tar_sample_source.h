// Tar shards (the webdataset layout) as the stream engine's sample source:
// each url is opened through io/ (a local file, `pipe:COMMAND`, with the
// pipe cache), its members grouped into samples by SampleReader, read in
// place from a mapped local file when the engine allows it.
#pragma once

#include <memory>
#include <string>

#include "io/byte_source.h"
#include "sources/sample_source.h"

namespace chute {

class TarSampleSources final : public SampleSourceFactory {
 public:
  explicit TarSampleSources(SourceOptions options) : options_(std::move(options)) {}

  std::unique_ptr<SampleSource> open(const std::string& url, uint32_t index,
                                     const SourceOpenOptions& options) const override;
  SampleLocation location(const std::string& url, const EncodedSample& sample,
                       const SampleMember* member) const override;

 private:
  const SourceOptions options_;
};

}  // namespace chute
