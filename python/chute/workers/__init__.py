"""Worker processes for the Python stages of chute's datasets (see the
README, "Python stages and worker processes"): `pool` is the loader's side,
`main` a worker's, `transport` how batches travel between them (shared
memory, no pickling of array data), `failures` how errors and warnings do.
A loader's use of them is in ``chute.loader.loader_workers``, the
index-driven datasets' tasks in ``chute.datasets.indexed_workers``."""
