"""Tables streamed through webdataset's pipeline: datasets whose shards are
parts of table files (``parquet``: ``ParquetStream``, a Parquet file's row
groups) and whose rows are samples. They are ``WebDataset``s (the shard
shuffle, splitters, state dicts and elastic resume are ``chute.wds``'s),
not webdataset names, so they live here, above ``chute.wds``."""

import chute.wds
from chute.table_streams.parquet import ParquetStream

# chute.wds.ParquetStream, where the class lived before: set from here, as
# chute.wds cannot import what builds on it. Importing chute.wds imports
# chute first, and chute imports this package, so the alias is always there.
setattr(chute.wds, "ParquetStream", ParquetStream)  # noqa: B010

__all__ = ["ParquetStream"]
