"""SandboxPool on real sandboxes of each backend: warm hand-out, reset vs replace, the
concurrency cap, health checks, cancelled leases, start-up latency."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.errors import ConfigError, SandboxError
from sandboxes import SandboxPool, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from tests.helpers.sandbox_checks import containers_with_label, procs_with_label, require_docker, wait_until


@pytest.fixture
def factory(backend, run_id):
    spec = SandboxSpec(run_id=run_id, memory_mb=256, pids_limit=64)
    if backend == "docker":
        from sandboxes.docker import DockerSandbox

        return lambda: DockerSandbox(spec)
    return lambda: BwrapSandbox(spec)


def _nothing_left(run_id: str) -> bool:
    return procs_with_label(run_id) == [] and containers_with_label(run_id) == []


def test_warm_acquire_is_fast_and_reset_clears_the_episode(factory, run_id):
    with SandboxPool(factory, size=2, max_sandboxes=3, between_episodes="reset") as pool:
        pool.wait_ready(60)
        seen = set()
        for episode in range(6):
            with pool.lease() as sb:
                assert sb.exec("ls -A /work").stdout == ""  # nothing from earlier episodes
                sb.write_file("episode.txt", str(episode))
                seen.add(id(sb))
            assert wait_until(lambda: pool.stats().idle >= 2, timeout_s=30)
        stats = pool.stats()
        assert stats.acquire_p50_s < 0.005, stats  # warm hand-out: < 5 ms
        assert stats.started <= 3 and stats.replaced == 0  # reused, not replaced
        assert len(seen) <= 3
        assert 0 < stats.startup_p50_s <= stats.startup_max_s < 30
    assert wait_until(lambda: _nothing_left(run_id), timeout_s=10)


def test_replace_mode_gives_a_fresh_sandbox_every_episode(factory, run_id):
    with SandboxPool(factory, size=1, between_episodes="replace") as pool:
        pool.wait_ready(60)
        first = pool.acquire()
        pool.release(first)
        assert wait_until(lambda: pool.stats().idle == 1 and pool.stats().replaced == 1, timeout_s=30)
        second = pool.acquire()
        assert second is not first and first.closed
        pool.release(second)
    assert wait_until(lambda: _nothing_left(run_id), timeout_s=10)


def test_concurrency_cap_makes_acquire_wait_and_time_out(factory, run_id):
    with SandboxPool(factory, size=0, max_sandboxes=2) as pool:
        a, b = pool.acquire(), pool.acquire()  # cold starts
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="no sandbox free within 0.5 s"):
            pool.acquire(timeout_s=0.5)
        assert 0.45 < time.monotonic() - t0 < 3
        pool.release(a)
        c = pool.acquire(timeout_s=30)  # a, once reset
        assert c is a
        pool.release(b)
        pool.release(c)
        with pytest.raises(ConfigError, match="not leased from this pool"):
            pool.release(c)
    assert wait_until(lambda: _nothing_left(run_id), timeout_s=10)


def test_cancelled_rollout_releases_and_replaces_its_sandbox(factory, run_id):
    async def rollout(pool: SandboxPool) -> None:
        with pool.lease() as sb:
            await asyncio.to_thread(sb.exec, "true")
            await asyncio.sleep(100)

    async def main(pool: SandboxPool) -> None:
        task = asyncio.create_task(rollout(pool))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with SandboxPool(factory, size=1) as pool:
        pool.wait_ready(60)
        # in a thread of its own: a browser test's sync Playwright leaves a running loop in
        # this thread when the suites share a process
        with ThreadPoolExecutor(1) as ex:
            ex.submit(asyncio.run, main(pool)).result()
        assert wait_until(lambda: pool.stats().leased == 0 and pool.stats().replaced == 1, timeout_s=30)
        assert wait_until(lambda: pool.stats().idle == 1, timeout_s=30)
    assert wait_until(lambda: _nothing_left(run_id), timeout_s=10)


def test_bad_pool_settings_raise_config_error(factory):
    with pytest.raises(ConfigError, match="size=-1"):
        SandboxPool(factory, size=-1)
    with pytest.raises(ConfigError, match="max_sandboxes=1"):
        SandboxPool(factory, size=2, max_sandboxes=1)
    with pytest.raises(ConfigError, match="between_episodes='keep'"):
        SandboxPool(factory, size=1, between_episodes="keep")  # type: ignore[arg-type]


@pytest.mark.docker
def test_health_check_replaces_a_dead_idle_container(run_id):
    require_docker()
    import docker

    from sandboxes.docker import DockerSandbox

    spec = SandboxSpec(run_id=run_id)
    client = docker.from_env()
    with SandboxPool(lambda: DockerSandbox(spec), size=1, health_check_interval_s=0.3) as pool:
        pool.wait_ready(60)
        victim = pool._idle[0]
        client.api.kill(victim.container_id)
        assert wait_until(lambda: pool.stats().failed_health_checks >= 1, timeout_s=10)
        assert wait_until(lambda: pool.stats().idle == 1, timeout_s=30)
        with pool.lease() as sb:
            assert sb is not victim and sb.exec("echo ok").stdout == "ok\n"
    assert wait_until(lambda: _nothing_left(run_id), timeout_s=10)
