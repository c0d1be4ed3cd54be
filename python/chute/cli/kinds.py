"""What a path holds, told by its content: a tar shard, an HDF5 file or a
Parquet file."""

from __future__ import annotations

import os

from chute.cli import remote
from chute.cli.common import UsageError

# Parquet files start (and end) with this magic.
PARQUET_MAGIC = b"PAR1"


def kind_of(path: str) -> str:
    """'tar', 'hdf5' or 'parquet' by content (extensions lie), else UsageError."""
    if remote.is_remote(path):
        kind = _kind_of_head(remote.head_bytes(path, 512))
    else:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file")
        if os.path.isdir(path):
            raise UsageError(f"{path}: is a directory (pass the shard or HDF5 files in it)")
        with open(path, "rb") as f:
            kind = _kind_of_head(f.read(512))
        if kind is None and path.endswith((".h5", ".hdf5", ".hdf")):
            # HDF5 may start at a 512-byte multiple (user block); let h5py decide.
            import h5py

            if h5py.is_hdf5(path):
                kind = "hdf5"
    if kind is None:
        raise UsageError(f"{path}: neither a tar shard, an HDF5 file nor a Parquet file")
    return kind


def _kind_of_head(head: bytes) -> str | None:
    """The kind a file's first 512 bytes show, or None."""
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    # ustar magic at 257 ("ustar\0" POSIX, "ustar  " GNU); also accept an empty
    # archive (all-zero first block), which tar writes for zero members.
    if len(head) == 512 and (head[257:262] == b"ustar" or head == bytes(512)):
        return "tar"
    return None
