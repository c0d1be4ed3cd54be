"""``chute sample-data DIR``: the small data set that the README's examples
read, written where they look for it (run them from DIR):

- ``shards/train-000000.tar`` .. ``train-000127.tar``: webdataset shards of
  12 samples each, a JPEG (``jpg``), a label (``cls``), a float32 vector
  (``nsdgeneral.npy``) and the sample's number (``trial.npy``);
- ``sessions/s0.h5``, ``sessions/s1.h5``: HDF5 files of 600 rows each,
  ``betas`` (float32, 16 per row) and ``coco_ids`` (int64);
- ``data.h5``: one more HDF5 file (``x``, ``y``), for ``chute inspect``;
- ``questions.npy`` and ``cluster_ids.npy``: arrays of 300 rows.

Seeded: the same bytes on every run. Writing the JPEGs needs Pillow.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
from typing import Any, TextIO

import numpy as np

from chute.cli.common import EXIT_OK, UsageError

SHARDS = 128
PER_SHARD = 12


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _jpeg(rng: np.random.Generator, image: Any, size: int = 24) -> bytes:
    # Smooth gradients plus noise: compresses like a photo, not like static.
    y = np.linspace(0, 1, size)[:, None, None]
    x = np.linspace(0, 1, size)[None, :, None]
    base = y * rng.uniform(50, 200, 3) + x * rng.uniform(0, 50, 3)
    pixels = np.clip(base + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_sample_data(root: str) -> list[str]:
    """Writes the README's data under `root` (created when missing);
    returns what it wrote, relative to `root`."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise UsageError("sample-data writes JPEGs with Pillow: pip install pillow") from exc
    import h5py

    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(root, "shards"), exist_ok=True)
    os.makedirs(os.path.join(root, "sessions"), exist_ok=True)
    written = []
    images = [_jpeg(rng, Image) for _ in range(16)]
    for shard in range(SHARDS):
        name = f"shards/train-{shard:06d}.tar"
        with tarfile.open(os.path.join(root, name), "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
                key = f"trial{i:05d}"
                _add(tar, f"{key}.jpg", images[i % len(images)])
                _add(tar, f"{key}.cls", str(i % 10).encode())
                voxels = rng.standard_normal(50).astype(np.float32)
                _add(tar, f"{key}.nsdgeneral.npy", _npy(voxels))
                _add(tar, f"{key}.trial.npy", _npy(np.array([i], dtype=np.int64)))
        written.append(name)
    for s in range(2):
        name = f"sessions/s{s}.h5"
        with h5py.File(os.path.join(root, name), "w") as f:
            f["betas"] = rng.standard_normal((600, 16)).astype(np.float32)
            f["coco_ids"] = np.arange(600, dtype=np.int64) + 600 * s
        written.append(name)
    with h5py.File(os.path.join(root, "data.h5"), "w") as f:
        f.create_dataset("x", data=rng.standard_normal((1000, 8)).astype(np.float32), chunks=True)
        f["y"] = np.arange(1000, dtype=np.int64) % 10
    written.append("data.h5")
    np.save(os.path.join(root, "questions.npy"), rng.standard_normal((300, 8)).astype(np.float32))
    np.save(os.path.join(root, "cluster_ids.npy"), np.arange(300) % 7)
    written += ["questions.npy", "cluster_ids.npy"]
    return written


def run(args: argparse.Namespace, out: TextIO) -> int:
    written = write_sample_data(args.directory)
    shards = sum(1 for w in written if w.startswith("shards/"))
    print(
        f"wrote {shards} shards (shards/train-000000..{shards - 1:06d}.tar), "
        f"{', '.join(w for w in written if not w.startswith('shards/'))} in {args.directory}",
        file=out,
    )
    return EXIT_OK


def register(sub: Any) -> None:
    """Adds the ``sample-data`` command to the subparsers `sub`."""
    p = sub.add_parser(
        "sample-data",
        help="write the small data set the README's examples read (run them from DIR)",
    )
    p.add_argument("directory", metavar="DIR", help="where to write it (created when missing)")
    p.set_defaults(func=run)
