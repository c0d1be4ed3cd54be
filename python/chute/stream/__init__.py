"""The native stream pipeline that ``chute.wds``, ``TarDataset`` and
``ParquetDataset`` share: the engine's part of a pipeline (``prefix``), its
field plans, seeds and failure routing (``native``), one class per stage kind
(``stages``), the compiler from stages to a native pipeline (``compiler``),
the engine's batches as webdataset's types (``convert``), and the stages
built under webdataset's names (``autodecode``, ``filters``, ``fluent``)."""
