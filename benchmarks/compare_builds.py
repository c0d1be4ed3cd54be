"""chute against another build of itself: the chute jobs of bench_wds.py,
bench_h5.py and bench_transforms.py, each checkout running them with its own benchmark scripts
and its own python/ on the path, alternately, so that a change to the engine
can be checked for a speed regression on one machine in one session (the VM
drifts between sessions). Each round runs every job once with each build, in
alternating order; the median of the rounds is reported. Data is generated
once, by this checkout's scripts.

    PYTHONPATH=python python benchmarks/compare_builds.py \\
        --before /path/to/old/checkout [--after .] [--rounds 5] [--quick] \\
        [--groups tar,h5,transforms]

Both checkouts must be built (scripts/dev_build.sh links _core into
python/chute) and take the same configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_h5  # noqa: E402
import bench_transforms  # noqa: E402
import bench_wds  # noqa: E402
from common import RESULTS, save, table  # noqa: E402

HERE = Path(__file__).resolve().parent


GROUPS = ("tar", "h5", "transforms")


def jobs(quick: bool, groups: tuple[str, ...] = GROUPS) -> list[tuple[str, list[str]]]:
    """(name, [script name, arguments]) of each chute job of `groups`."""
    n_tiny, n_jpeg = (20_000, 400) if quick else (200_000, 4_000)
    threads = os.cpu_count() or 2
    out: list[tuple[str, list[str]]] = []
    if "tar" in groups:
        for job, urls in (
            ("tiny", bench_wds.tiny_shards(n_tiny)),
            ("jpeg", bench_wds.jpeg_shards(n_jpeg)),
        ):
            config = {"loader": "chute", "workers": threads, "job": job, "urls": urls}
            out.append((f"tar {job}", ["bench_wds.py", "--worker", json.dumps(config)]))
    if "h5" in groups:
        files = bench_h5.make_data(quick)
        for cfg in bench_h5.configs(files, quick):
            if cfg["kind"] == "chute_h5" and cfg.get("threads") == 2 and cfg.get("shuffle", True):
                out.append((bench_h5.label(cfg), ["bench_h5.py", "--run", json.dumps(cfg)]))
    if "transforms" in groups:
        n = 600 if quick else 3_000
        for job, urls in (
            ("train", bench_transforms.shards(n)),
            ("eval", bench_transforms.shards(n)),
            ("map", bench_transforms.map_shards(n)),
        ):
            config = {"loader": "chute", "workers": threads, "job": job, "urls": urls}
            out.append(
                (f"transforms {job}", ["bench_transforms.py", "--worker", json.dumps(config)])
            )
    return out


def run_once(checkout: Path, command: list[str]) -> float:
    """Samples (rows) per second of one job run by `checkout`'s own script
    with its python/ on the path."""
    script, *arguments = command
    env = dict(os.environ, PYTHONPATH=str(checkout / "python"))
    proc = subprocess.run(
        [sys.executable, str(checkout / "benchmarks" / script), *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script} of {checkout} failed:\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if "samples_per_s" in report:
        return float(report["samples_per_s"])
    return float(report["samples"]) / float(report["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="checkout of the old build")
    parser.add_argument("--after", default=str(HERE.parent), help="checkout of the new build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument(
        "--groups", default=",".join(GROUPS), help="jobs to run: any of " + ", ".join(GROUPS)
    )
    args = parser.parse_args()
    groups = tuple(g for g in args.groups.split(",") if g)
    unknown = set(groups) - set(GROUPS)
    if unknown:
        parser.error(f"unknown groups {sorted(unknown)}: choose from {', '.join(GROUPS)}")
    builds = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    rates: dict[tuple[str, str], list[float]] = {}
    for round_index in range(args.rounds):
        for name, command in jobs(args.quick, groups):
            order = ["before", "after"] if round_index % 2 == 0 else ["after", "before"]
            for build in order:
                rate = run_once(builds[build], command)
                rates.setdefault((name, build), []).append(rate)
                print(f"round {round_index + 1} {name:40s} {build:6s} {rate:14,.0f}/s", flush=True)
    rows = []
    for name, _ in jobs(args.quick, groups):
        before = statistics.median(rates[(name, "before")])
        after = statistics.median(rates[(name, "after")])
        rows.append(
            {
                "job": name,
                "before_per_s": before,
                "after_per_s": after,
                "after_over_before": after / before,
                "before_runs": rates[(name, "before")],
                "after_runs": rates[(name, "after")],
            }
        )
    print(
        table(
            rows,
            [
                ("job", "job"),
                ("before_per_s", "before (median/s)"),
                ("after_per_s", "after (median/s)"),
                ("after_over_before", "after / before"),
            ],
        )
    )
    path = save(
        "compare_builds" if groups == GROUPS else "compare_builds_" + "_".join(groups),
        {
            "builds": {k: str(v) for k, v in builds.items()},
            "rounds": args.rounds,
            "quick": args.quick,
            "groups": list(groups),
            "rows": rows,
        },
        Path(args.results_dir),
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
