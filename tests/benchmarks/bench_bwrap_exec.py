"""Measure BwrapSandbox.exec latency against a bare subprocess.run of the same command.

Not a test (timings depend on the machine); run it by hand:

    .venv/bin/python tests/integration/sandboxes/measure_exec_latency.py [--runs 50]

Prints median and 90th percentile wall time per command, for the sandbox with each limit
mechanism this host supports, and the sandbox's overhead over the bare run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from sandboxes import BwrapSandbox, SandboxSpec  # noqa: E402
from sandboxes.limits import cgroup_v1_bases  # noqa: E402

COMMANDS = {
    "python3 -c pass": ["/usr/bin/python3", "-c", "pass"],
    "true": ["/usr/bin/true"],
}


def _time(fn, runs: int) -> list[float]:
    fn()  # warm caches
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _fmt(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=10)
    return f"median {statistics.median(samples) * 1e3:6.1f} ms   p90 {q[-1] * 1e3:6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="timed runs per command (default 50)")
    args = parser.parse_args()
    modes = (["cgroup"] if cgroup_v1_bases() is not None else []) + ["rlimit"]
    for name, argv in COMMANDS.items():
        bare = _time(lambda argv=argv: subprocess.run(argv, check=True), args.runs)
        print(f"{name:18s} bare subprocess.run      {_fmt(bare)}")
        for mode in modes:
            with BwrapSandbox(SandboxSpec(run_id="latency"), limits=mode) as sb:

                def run(sb: BwrapSandbox = sb, argv: list[str] = argv) -> None:
                    r = sb.exec(argv)
                    assert r.exit_code == 0, r

                boxed = _time(run, args.runs)
            overhead = (statistics.median(boxed) - statistics.median(bare)) * 1e3
            print(f"{name:18s} BwrapSandbox ({sb.limits:9s}) {_fmt(boxed)}   overhead {overhead:+.1f} ms")


if __name__ == "__main__":
    main()
