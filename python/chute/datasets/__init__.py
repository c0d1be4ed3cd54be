"""The dataset kinds: ``IndexedDataset`` (``indexed``, with its worker side
in ``indexed_workers``) and the index-driven datasets over it (``arrays``,
``h5``, ``tardataset``, ``parquet``, ``tokens``, whose text is tokenized
by ``chute.tokenize``), mixing (``mix``, ``mix_stream``), schedules
(``curriculum``) and split directories (``splits``)."""
