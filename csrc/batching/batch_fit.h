// Whether a batch of samples like the first one can fit in the machine's
// memory at all, asked when the first sample of an epoch is batched.
// Samples of a shard are alike: if batch_size of the first one cannot fit,
// the first full batch would fail to allocate, after holding the whole
// epoch's samples while it waited for them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chute {

// The machine's physical memory in bytes; 0 when it cannot be told.
uint64_t physical_memory();

// Throws kUsage when `batch_size` samples of `sample_bytes` each (encoded and
// decoded) need more than `memory` bytes. Nothing is checked when the memory
// is unknown (0), for batches of one sample, or when batches are cut by
// bytes (`max_batch_bytes` > 0) rather than formed of batch_size samples.
void check_batch_fits(int64_t batch_size, size_t max_batch_bytes, size_t sample_bytes,
                      uint64_t memory);

}  // namespace chute
