#include "compose/indexed_request.h"

#include <utility>

#include "compose/catalog.h"
#include "core/error.h"
#include "tokens/token_field_source.h"

namespace chute {

std::shared_ptr<IndexedTarSource> compose_tar_index_source(TarIndexRequest request) {
  IndexedTarSource::ReaderFactory open = [remote = std::move(request.remote)](
                                             const TarIndex::Shard& shard) {
    return shard_reader_for(shard, remote);
  };
  return std::make_shared<IndexedTarSource>(std::move(request.index), request.options,
                                            std::move(open));
}

std::shared_ptr<BlockSampleSource> compose_block_samples(BlockSamplesRequest request) {
  return std::make_shared<BlockSampleSource>(
      std::move(request.extensions), std::move(request.column_names),
      std::move(request.block_starts), std::move(request.block_names),
      std::move(request.block_urls));
}

std::shared_ptr<H5RowSource> compose_h5_rows(std::shared_ptr<H5Context> context,
                                             std::string name, std::vector<H5Layout> layouts) {
  return std::make_shared<H5RowSource>(std::move(context), std::move(name), std::move(layouts));
}

std::shared_ptr<MemoryRowSource> compose_memory_rows(MemoryRowsRequest request) {
  return std::make_shared<MemoryRowSource>(
      std::move(request.name), request.data, request.num_rows, request.row_stride, request.dtype,
      std::move(request.row_shape), std::move(request.owner), std::move(request.element_descr));
}

std::shared_ptr<RowSource> compose_token_field(std::shared_ptr<const TokenPacker> packer,
                                               const std::string& field) {
  TokenField f = TokenField::kInputIds;
  if (field == "labels") {
    f = TokenField::kLabels;
  } else if (field == "position_ids") {
    f = TokenField::kPositionIds;
  } else if (field == "window") {
    CHUTE_CHECK(packer->options().mode == PackMode::kWindows, kUsage,
                "the token field 'window' is for windows packing, not documents");
    f = TokenField::kWindow;
  } else {
    CHUTE_CHECK(field == "input_ids", kUsage, "no token field '" << field << "'");
  }
  return std::make_shared<TokenFieldSource>(std::move(packer), f, field);
}

}  // namespace chute
