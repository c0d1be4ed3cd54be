"""``chute.DataLoader`` and what it runs datasets with: the protocol between
the loader and a dataset on the engine (``protocol``), the engine's shared
Python side (``engine``), worker processes for a loader (``loader_workers``),
elastic resume of map-style samplers (``elastic_sampler``), torch's index
batches as arrays (``index_batches``), the progress bar (``progress``) and
batch checks (``validate``)."""
