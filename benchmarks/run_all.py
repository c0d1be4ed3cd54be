"""The demo: generates sample tar shards and HDF5 files, loads them with chute
and with the pure-Python loaders (torch DataLoader + webdataset / h5py /
TensorDataset), and prints the side-by-side tables.

    python benchmarks/run_all.py --quick   # a few minutes: what scripts/demo.sh runs
    python benchmarks/run_all.py --full    # the sizes quoted in the README

Results are saved under benchmarks/results/local/ (ignored by git): a run of
the demo never rewrites the published results in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The demo's benchmarks. They run on the installed package alone (no
# chute_testing, which the wheel does not ship): tests/test_readme.py checks.
DEMO_SCRIPTS = (
    ("bench_wds.py", "Tar shards: chute vs torch DataLoader + webdataset"),
    ("bench_h5.py", "HDF5 rows and arrays: chute vs torch DataLoader + h5py / TensorDataset"),
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small data (the default)")
    size.add_argument("--full", action="store_true", help="the README's sizes")
    args = parser.parse_args()
    flags = ([] if args.full else ["--quick"]) + ["--results-dir", str(HERE / "results" / "local")]
    for script, title in DEMO_SCRIPTS:
        print(f"\n=== {title} ===", flush=True)
        subprocess.run([sys.executable, str(HERE / script), *flags], check=True)


if __name__ == "__main__":
    main()
