"""What chute knows of where samples are, before any dataset reads them:
shard lists (``shards``), tar shards' sidecar indexes (``tarindex``) and
their columns (``tarcolumns``), HDF5 layouts (``h5layout``), what datasets
share about remote urls (``remote_urls``) and the sample-count registry of
stream formats (``sample_counts``)."""
