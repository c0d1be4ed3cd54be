"""What every part of chute shares and nothing else knows of datasets:
errors and their mapping from the engine's (``errors``), webdataset's error
handlers (``handlers``), batch collation (``collate``), the image pixel
limit (``limits``), the stats schema (``stats``), the RSS sampler (``rss``)
and the one-thread rule for torch's intra-op threads (``intraop``)."""
