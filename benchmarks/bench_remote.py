"""Tar shards in object storage: chute reading S3 urls against its own
local-file speed and against torch DataLoader + webdataset with ``pipe:curl``.

The shards of bench_wds.py's two jobs (tiny: 64 float32 ``npy`` + ``cls``,
batch 256; jpeg: 256x256 JPEG + ``cls``, batch 64, decoded to uint8 CHW)
are put in a local S3 server (moto's ThreadedMotoServer), reached through
the fault proxy of tests/remote_servers.py, which adds a fixed latency to
every request (20 ms and 100 ms: two proxies in front of one server). The
servers run in a process of their own; every configuration runs in its own
subprocess (common.run_config), the parent sampling its RSS.

Configurations, per job:
  - chute, local files: the reference the remote runs are compared with;
  - chute, s3:// urls at each latency, no cache (the default settings:
    8 MiB ranges, 4 in flight per shard, 256 MiB fetched ahead);
  - chute, s3:// urls at 20 ms with a cache_dir: a first epoch that fills
    the cache, then a second one that reads it (the cache-hit epoch);
  - torch DataLoader + webdataset, ``pipe:curl -s http://PROXY/bucket/key``
    (the objects are public-read, so curl needs no signature; webdataset has
    no s3 handler), with 0, 1 and 2 worker processes; the best is reported;
  - the server's own ceiling: every shard fetched by chute's reader alone,
    no parsing (MB/s), which bounds what any loader gets from this server.

Targets (issue 13), checked in the summary: at 20 ms chute reaches >= 90% of
its local-file samples/s, its first batch comes within 0.5 s, and on the
JPEG job it is >= 5x the best pure-Python loader; a cache-hit epoch runs at
local speed.

    python benchmarks/bench_remote.py            # bench_wds.py's full sizes
    python benchmarks/bench_remote.py --quick    # a tenth of that
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_wds import jpeg_shards, tiny_shards  # noqa: E402
from common import current_rss, run_config, save, table  # noqa: E402

BUCKET = "bench"
LATENCIES = (0.02, 0.1)
CREDENTIALS = {"access_key_id": "bench", "secret_access_key": "bench", "region": "us-east-1"}


# ---------------------------------------------------------------- the servers (own process)


def serve(shards: dict[str, list[str]]) -> None:
    """Starts moto and one latency proxy per LATENCIES, uploads the shards
    (public-read), prints the endpoints as JSON, and serves until stdin closes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import boto3
    from moto.server import ThreadedMotoServer
    from remote_servers import Fault, FaultProxy

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["access_key_id"],
        aws_secret_access_key=CREDENTIALS["secret_access_key"],
        region_name=CREDENTIALS["region"],
    )
    client.create_bucket(Bucket=BUCKET)
    for job, paths in shards.items():
        for path in paths:
            with open(path, "rb") as f:
                client.put_object(
                    Bucket=BUCKET, Key=f"{job}/{Path(path).name}", Body=f, ACL="public-read"
                )
    proxies = []
    for latency in LATENCIES:
        proxy = FaultProxy(port)
        for method in ("GET", "HEAD"):
            proxy.add(Fault("delay", method=method, times=1 << 62, seconds=latency))
        proxy.start()
        proxies.append(proxy)
    urls = {str(latency): p.url for latency, p in zip(LATENCIES, proxies, strict=True)}
    print(json.dumps({"endpoint": endpoint, "proxies": urls}), flush=True)
    sys.stdin.read()  # until the parent closes it
    for proxy in proxies:
        proxy.stop()
    server.stop()


# ---------------------------------------------------------------- one configuration (subprocess)


def worker(config: dict[str, Any]) -> None:
    import torch

    rss_after_torch = current_rss()
    job, urls = config["job"], config["urls"]
    batch = 256 if job == "tiny" else 64
    if config["loader"] == "fetch":
        report_fetch(config)
        return
    if config["loader"] == "webdataset":
        import webdataset as wds_module

        loader_cls: Any = torch.utils.data.DataLoader
        kwargs: dict[str, Any] = {}
    else:
        import chute
        import chute.wds as wds_module

        loader_cls = chute.DataLoader
        kwargs = {}
        if config.get("storage_options"):
            kwargs["storage_options"] = config["storage_options"]
        if config.get("cache_dir"):
            kwargs["cache_dir"] = config["cache_dir"]
    epochs = []
    for _ in range(config.get("epochs", 1)):
        ds = wds_module.WebDataset(urls, shardshuffle=False, **kwargs)
        if job == "tiny":
            ds = ds.decode().to_tuple("npy", "cls").batched(batch)
        else:
            ds = ds.decode("torchrgb8").to_tuple("jpg", "cls").batched(batch)
        loader = loader_cls(ds, batch_size=None, num_workers=config["workers"])
        gc.collect()  # see bench_wds.py: importing torch leaves a full collection due
        cpu = _cpu_seconds_self()
        start = time.perf_counter()
        first = None
        samples = 0
        for item in loader:
            if first is None:
                first = time.perf_counter() - start
            samples += len(item[1])
        seconds = time.perf_counter() - start
        epochs.append(
            {
                "samples": samples,
                "seconds": seconds,
                "first_batch_seconds": first,
                "cpu_seconds": _cpu_seconds_self() - cpu,
            }
        )
    print(json.dumps({"epochs": epochs, "rss_after_import_torch": rss_after_torch}))


def _cpu_seconds_self() -> float:
    """CPU time of this process and its finished children (webdataset's
    worker processes and curl commands)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cpu_seconds(pid: int) -> float:
    """CPU time of a running process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report_fetch(config: dict[str, Any]) -> None:
    """Every shard read to the end by the remote reader, four at once, no parsing."""
    from concurrent.futures import ThreadPoolExecutor

    from chute.remote import RemoteOptions, get_session

    session = get_session(RemoteOptions(storage_options=config["storage_options"]))
    start = time.perf_counter()

    def fetch(url: str) -> int:
        with session.open(url) as f:
            return f.drain()

    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(fetch, config["urls"]))
    seconds = time.perf_counter() - start
    print(json.dumps({"bytes": sum(sizes), "seconds": seconds}))


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--jobs", default="tiny,jpeg")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.serve:
        serve(json.loads(args.serve))
        return
    n_tiny, n_jpeg = (20_000, 400) if args.quick else (200_000, 4_000)
    jobs = args.jobs.split(",")
    local = {"tiny": tiny_shards(n_tiny), "jpeg": jpeg_shards(n_jpeg)}
    local = {job: local[job] for job in jobs}
    script = str(Path(__file__).resolve())
    servers = subprocess.Popen(
        [sys.executable, script, "--serve", json.dumps(local)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert servers.stdout is not None
        endpoints = json.loads(servers.stdout.readline())
        rows, summary = run_all(script, jobs, local, endpoints, servers.pid)
    finally:
        assert servers.stdin is not None
        servers.stdin.close()
        servers.wait(timeout=60)
    print()
    print(
        table(
            rows,
            [
                ("job", "job"),
                ("config", "configuration"),
                ("workers", "workers"),
                ("samples_per_s", "samples/s"),
                ("mb_per_s", "MB/s"),
                ("first_batch_s", "first batch s"),
                ("peak_rss_mib", "peak RSS MiB"),
            ],
        )
    )
    print()
    print(json.dumps(summary, indent=2))
    load = os.getloadavg()
    path = save(
        "remote",
        {
            "quick": args.quick,
            "load_average_at_end": list(load),
            "rows": rows,
            "summary": summary,
        },
    )
    print(f"saved {path} (load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")


def run_all(
    script: str,
    jobs: list[str],
    local: dict[str, list[str]],
    endpoints: dict[str, Any],
    server_pid: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    threads = os.cpu_count() or 2
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}

    def s3_urls(job: str) -> list[str]:
        return [f"s3://{BUCKET}/{job}/{Path(p).name}" for p in local[job]]

    def storage(latency: float) -> dict[str, str]:
        return {"endpoint": endpoints["proxies"][str(latency)], **CREDENTIALS}

    def measure(config: dict[str, Any]) -> dict[str, Any]:
        """run_config, plus the CPU seconds the servers spent meanwhile (on
        this machine they share the cores with the loader)."""
        before = _cpu_seconds(server_pid)
        report = run_config(script, config)
        report["server_cpu_seconds"] = _cpu_seconds(server_pid) - before
        return report

    def record(job: str, label: str, workers: int, report: dict[str, Any], epoch: int = 0) -> None:
        e = report["epochs"][epoch]
        size = sum(os.path.getsize(p) for p in local[job])
        row = {
            "job": job,
            "config": label,
            "workers": workers,
            "samples": e["samples"],
            "samples_per_s": e["samples"] / e["seconds"],
            "mb_per_s": size / 1e6 / e["seconds"],
            "first_batch_s": e["first_batch_seconds"],
            "peak_rss_mib": report["peak_tree_rss"] / 2**20,
            "loader_cpu_s_per_1k_samples": 1000 * e["cpu_seconds"] / max(1, e["samples"]),
            # Over all epochs of the run (one, except for the cache runs).
            "server_cpu_seconds": report["server_cpu_seconds"],
            "run_seconds": sum(x["seconds"] for x in report["epochs"]),
        }
        rows.append(row)
        print(
            f"  {job:5s} {label:42s} workers={workers}: {row['samples_per_s']:,.0f} samples/s,"
            f" {row['mb_per_s']:,.1f} MB/s, first batch {row['first_batch_s']:.3f} s,"
            f" loader CPU {row['loader_cpu_s_per_1k_samples']:.3f} s/1k samples,"
            f" servers' CPU {row['server_cpu_seconds']:.2f} s of {row['run_seconds']:.2f} s",
            flush=True,
        )

    for job in jobs:
        base = {"job": job, "workers": threads, "loader": "chute"}
        record(job, "chute, local files", threads, measure({**base, "urls": local[job]}))
        local_rate = rows[-1]["samples_per_s"]
        remote_rows = {}
        for latency in LATENCIES:
            config = {**base, "urls": s3_urls(job), "storage_options": storage(latency)}
            record(job, f"chute, s3 +{latency * 1000:.0f} ms", threads, measure(config))
            remote_rows[latency] = rows[-1]
        with tempfile.TemporaryDirectory(prefix="chute-bench-cache-") as cache:
            config = {
                **base,
                "urls": s3_urls(job),
                "storage_options": storage(LATENCIES[0]),
                "cache_dir": cache,
                "epochs": 2,
            }
            report = measure(config)
            record(job, "chute, s3 +20 ms, cache_dir, 1st epoch", threads, report, 0)
            record(job, "chute, s3 +20 ms, cache_dir, cache hit", threads, report, 1)
            hit_rate = rows[-1]["samples_per_s"]
        best_python: dict[str, Any] | None = None
        for workers in (0, 1, 2):
            proxy = endpoints["proxies"][str(LATENCIES[0])]
            urls = [f"pipe:curl -s -f {proxy}/{BUCKET}/{job}/{Path(p).name}" for p in local[job]]
            config = {"job": job, "workers": workers, "loader": "webdataset", "urls": urls}
            record(job, "torch + webdataset, pipe:curl +20 ms", workers, measure(config))
            if best_python is None or rows[-1]["samples_per_s"] > best_python["samples_per_s"]:
                best_python = rows[-1]
        assert best_python is not None
        fetch = measure(
            {"job": job, "loader": "fetch", "urls": s3_urls(job), "storage_options": storage(0.02)}
        )
        ceiling = fetch["bytes"] / 1e6 / fetch["seconds"]
        print(f"  {job:5s} server ceiling at +20 ms (fetch only): {ceiling:,.1f} MB/s", flush=True)
        at20 = remote_rows[LATENCIES[0]]
        summary[job] = {
            "local_samples_per_s": local_rate,
            "s3_20ms_samples_per_s": at20["samples_per_s"],
            "s3_100ms_samples_per_s": remote_rows[LATENCIES[1]]["samples_per_s"],
            "fraction_of_local_at_20ms": at20["samples_per_s"] / local_rate,
            "first_batch_s_at_20ms": at20["first_batch_s"],
            "cache_hit_fraction_of_local": hit_rate / local_rate,
            "best_python_samples_per_s": best_python["samples_per_s"],
            "best_python_workers": best_python["workers"],
            "speedup_at_20ms_vs_best_python": at20["samples_per_s"] / best_python["samples_per_s"],
            "server_ceiling_mb_per_s": ceiling,
            # The cores the servers took from the loader during the 20 ms run.
            "server_cpu_share_at_20ms": at20["server_cpu_seconds"]
            / (at20["run_seconds"] * (os.cpu_count() or 1)),
            "s3_20ms_fraction_of_server_ceiling": at20["mb_per_s"] / ceiling,
            "targets": {
                "fraction_of_local_at_20ms >= 0.9": at20["samples_per_s"] / local_rate >= 0.9,
                "first_batch_s_at_20ms <= 0.5": (at20["first_batch_s"] or 1e9) <= 0.5,
                "speedup_vs_best_python >= 5 (jpeg job)": (
                    at20["samples_per_s"] / best_python["samples_per_s"] >= 5
                    if job == "jpeg"
                    else None
                ),
            },
        }
    return rows, summary


if __name__ == "__main__":
    main()
