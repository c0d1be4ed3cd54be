"""Batches and CUDA: page-locked batch memory without a copy (``pinning``) and
batches handed to a device on a side stream (``device``)."""
