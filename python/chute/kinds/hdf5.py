"""HDF5 files, read by ``H5Dataset`` (map-style rows of datasets)."""

from __future__ import annotations

from typing import Any, TextIO

from chute.kinds.registry import DataKind, FileFormat, Target, register_kind
from chute.kinds.report import human_size, print_problems

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _h5_stat(target: Target) -> Any:
    """os.stat of a local file; a remote object's size and version."""
    import os

    if not target.is_remote:
        return os.stat(target.path)
    from chute.sources.h5layout import RemoteStat

    return RemoteStat(target.size(), target.version())


def inspect_hdf5(target: Target) -> dict[str, Any]:
    import h5py

    from chute.remote import get_session
    from chute.sources.h5layout import describe_dataset

    path = target.path
    st = _h5_stat(target)
    datasets: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        f = h5py.File(get_session(target.remote).file(path) if target.is_remote else path, "r")
    except OSError as exc:
        return {
            "path": path,
            "kind": "hdf5",
            "size": st.st_size,
            "datasets": [],
            "problems": [f"unreadable: {exc}"],
        }
    with f:

        def visit(name: str, obj: Any) -> None:
            if not isinstance(obj, h5py.Dataset):
                return
            dcpl = obj.id.get_create_plist()
            filters = []
            for i in range(dcpl.get_nfilters()):
                _, _, _, fname = dcpl.get_filter(i)
                filters.append(
                    fname.decode(errors="replace") if isinstance(fname, bytes) else str(fname)
                )
            layout = {
                h5py.h5d.CONTIGUOUS: "contiguous",
                h5py.h5d.CHUNKED: "chunked",
                h5py.h5d.COMPACT: "compact",
            }.get(dcpl.get_layout(), "virtual" if obj.is_virtual else "other")
            entry: dict[str, Any] = {
                "name": obj.name,
                "layout": layout,
                "dtype": str(obj.dtype),
                "shape": [int(x) for x in obj.shape],
                "chunks": None if obj.chunks is None else [int(c) for c in obj.chunks],
                "filters": filters,
            }
            if obj.ndim == 0:
                entry["read"] = "no: a scalar, not rows"
            elif obj.dtype.kind not in "biufc" or obj.dtype.fields is not None:
                entry["read"] = f"no: non-numeric dtype {obj.dtype}"
            else:
                try:
                    _, reason = describe_dataset(obj, path, st)
                except Exception as exc:
                    reason = f"cannot describe it: {exc}"
                    problems.append(f"{obj.name}: {exc}")
                entry["read"] = "native" if reason is None else f"slow path: {reason}"
            datasets.append(entry)

        f.visititems(visit)
    if not datasets:
        problems.append("no datasets")
    row_counts = {d["shape"][0] for d in datasets if d["shape"]}
    return {
        "path": path,
        "kind": "hdf5",
        "size": st.st_size,
        "datasets": datasets,
        "row_counts": sorted(row_counts),
        "problems": problems,
    }


class Hdf5Files(FileFormat):
    """HDF5 files: told by their signature at offset 0, or, for a local
    ``.h5``/``.hdf5``/``.hdf`` file, at any 512-byte multiple (a user block:
    h5py decides)."""

    name = "hdf5"
    noun = "an HDF5 file"
    plural = "HDF5 files"

    def claims(self, target: Target) -> bool:
        if target.is_dir():
            return False
        if target.head(8) == HDF5_SIGNATURE:
            return True
        if target.is_remote or not target.path.endswith((".h5", ".hdf5", ".hdf")):
            return False
        import h5py

        return bool(h5py.is_hdf5(target.path))

    def inspect(self, target: Target, options: Any) -> dict[str, Any]:
        return inspect_hdf5(target)

    def print_report(self, report: dict[str, Any], out: TextIO) -> None:
        print(f"{report['path']}: HDF5 file, {human_size(report['size'])}", file=out)
        for d in report["datasets"]:
            chunks = d["layout"] if d["chunks"] is None else f"chunks {tuple(d['chunks'])}"
            filters = "+".join(d["filters"]) or "no filters"
            print(
                f"  {d['name']}: {d['dtype']} {tuple(d['shape'])}, {chunks}, {filters}"
                f" -> {d['read']}",
                file=out,
            )
        if len(report.get("row_counts", [])) > 1:
            print(f"  note: datasets have different row counts {report['row_counts']}", file=out)
        print_problems(report["problems"], out)


HDF5_FILES = Hdf5Files()


class H5DatasetKind(DataKind):
    name = "H5Dataset"
    summary = "rows of HDF5 datasets (chunked, compressed, remote), map-style"
    files = HDF5_FILES


register_kind(H5DatasetKind())
