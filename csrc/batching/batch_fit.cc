#include "batching/batch_fit.h"

#include <algorithm>
#include <string>

#include <unistd.h>

#include "core/error.h"

namespace chute {

uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

void check_batch_fits(int64_t batch_size, size_t max_batch_bytes, size_t sample_bytes,
                      uint64_t memory) {
  const auto rows = static_cast<uint64_t>(batch_size);
  if (memory == 0 || max_batch_bytes > 0 || rows <= 1) return;
  const uint64_t per_row = std::max<uint64_t>(1, sample_bytes);
  CHUTE_CHECK(rows <= memory / per_row, kUsage,
              "batch_size " << rows << " cannot fit: a batch of samples like the first one ("
                            << sample_bytes << " bytes each, encoded and decoded) needs about "
                            << (rows > UINT64_MAX / per_row ? std::string("more than 2^64")
                                                            : std::to_string(rows * per_row))
                            << " bytes, more than the " << memory
                            << " bytes of memory of this machine");
}

}  // namespace chute
