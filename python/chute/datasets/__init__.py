"""The dataset kinds: ``IndexedDataset`` (``indexed``, with its worker side
in ``indexed_workers``) and the index-driven datasets over it (``arrays``,
``h5``, ``tardataset``, ``parquet``, ``tokens``; ``text_tokens`` tokenizes
text into token files), mixing (``mix``, ``mix_stream``), schedules
(``curriculum``) and split directories (``splits``)."""
