"""Benchmark: sandbox exec latency against its floor, pool acquire latency, and episodes/s.

Run on demand (pytest does not collect this file; Docker parts need a daemon and the base
image, as scripts/test.sh sets up)::

    .venv/bin/python tests/benchmarks/bench_sandbox_exec.py [--runs 50] [--episodes 96]

Prints, per backend:

* exec latency p50 / p95 of ``sandbox.exec(["true"])`` against its floor: for bubblewrap a
  bare ``subprocess.run(["true"])``; for Docker the ``docker exec`` CLI on the same container
  and the SDK's raw ``container.exec_run`` (target: our exec p50 within 1.2x of
  ``exec_run``);
* ``SandboxPool`` warm acquire latency p50 / p95 (target < 5 ms) and sandbox start-up p50;
* episodes/s with 32 concurrent sandboxes from a pool (an episode: lease, write a file,
  three execs (one ``python3``), release with reset).

Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from sandboxes import BwrapSandbox, SandboxPool, SandboxSpec  # noqa: E402
from sandboxes.docker.daemon import docker_daemon_answers  # noqa: E402

CONCURRENCY = 32


def _times(fn, runs: int) -> list[float]:
    fn()  # warm caches
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _q(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def _fmt(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples) * 1e3:7.2f} ms   p95 {_q(samples, 0.95) * 1e3:7.2f} ms"


def _exec_latency(backend: str, runs: int) -> bool:
    ok = True
    spec = SandboxSpec(run_id="bench")
    if backend == "bwrap":
        floor = _times(lambda: subprocess.run(["true"], check=True), runs)
        print(f"  floor: subprocess.run(['true'])      {_fmt(floor)}")
        with BwrapSandbox(spec) as sb:
            ours = _times(lambda: sb.exec(["true"]), runs)
        print(f"  BwrapSandbox.exec(['true'])          {_fmt(ours)}   "
              f"({statistics.median(ours) / statistics.median(floor):.1f}x floor)")
        return ok
    from sandboxes.docker import DockerSandbox

    with DockerSandbox(spec) as sb:
        container = sb._client.containers.get(sb.container_id)
        raw = _times(lambda: container.exec_run(["true"]), runs)
        cli = shutil.which("docker")
        if cli:
            floor = _times(lambda: subprocess.run([cli, "exec", sb.container_id, "true"], check=True), runs)
            print(f"  floor: docker exec CLI               {_fmt(floor)}")
        print(f"  SDK raw container.exec_run           {_fmt(raw)}")
        ours = _times(lambda: sb.exec(["true"]), runs)
        ratio = statistics.median(ours) / statistics.median(raw)
        verdict = "ok" if ratio <= 1.2 else "MISSED"
        ok = ratio <= 1.2
        print(f"  DockerSandbox.exec(['true'])         {_fmt(ours)}   "
              f"({ratio:.2f}x exec_run; target <= 1.2x: {verdict})")
    return ok


def _factory(backend: str):
    spec = SandboxSpec(run_id="bench", memory_mb=256, pids_limit=64)
    if backend == "docker":
        from sandboxes.docker import DockerSandbox

        return lambda: DockerSandbox(spec)
    return lambda: BwrapSandbox(spec)


def _episode(pool: SandboxPool, i: int) -> None:
    with pool.lease() as sb:
        sb.write_file("solution.py", f"print({i} * 2)\n")
        r = sb.exec(["python3", "solution.py"])
        assert r.stdout == f"{i * 2}\n", r
        sb.exec("ls -la")
        sb.exec("cat solution.py")


def _pool(backend: str, episodes: int) -> bool:
    ok = True
    with SandboxPool(_factory(backend), size=4, max_sandboxes=4) as pool:
        pool.wait_ready(120)
        for _ in range(50):
            sb = pool.acquire()
            pool.release(sb)
            while pool.stats().idle < 4:
                time.sleep(0.002)
        s = pool.stats()
        verdict = "ok" if s.acquire_p50_s < 0.005 else "MISSED"
        ok = s.acquire_p50_s < 0.005
        print(f"  pool warm acquire                    p50 {s.acquire_p50_s * 1e3:7.3f} ms   "
              f"p95 {s.acquire_p95_s * 1e3:7.3f} ms   (target < 5 ms: {verdict})")
        print(f"  sandbox start-up                     p50 {s.startup_p50_s * 1e3:7.1f} ms   "
              f"max {s.startup_max_s * 1e3:7.1f} ms")
    with SandboxPool(_factory(backend), size=CONCURRENCY, max_sandboxes=CONCURRENCY) as pool:
        pool.wait_ready(300)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as ex:
            list(ex.map(lambda i: _episode(pool, i), range(episodes)))
        elapsed = time.perf_counter() - t0
        print(f"  {episodes} episodes, {CONCURRENCY} concurrent sandboxes   "
              f"{episodes / elapsed:7.1f} episodes/s")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="timed execs per measurement (default 50)")
    parser.add_argument("--episodes", type=int, default=96, help="episodes for the throughput run (default 96)")
    parser.add_argument("--backend", choices=["all", "bwrap", "docker"], default="all")
    args = parser.parse_args()
    backends = ["bwrap", "docker"] if args.backend == "all" else [args.backend]
    ok = True
    for backend in backends:
        if backend == "docker" and not docker_daemon_answers():
            print("docker: no daemon answers; skipped (scripts/test.sh starts one)")
            if args.backend == "docker":
                ok = False
            continue
        print(f"{backend}:")
        ok &= _exec_latency(backend, args.runs)
        ok &= _pool(backend, args.episodes)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
