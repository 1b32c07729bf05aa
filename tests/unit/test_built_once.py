"""tests/helpers/built_once.py: with a shared folder, two processes asking at once build once;
a build that raised is built again; without the folder each caller builds in its own."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from tests.helpers.built_once import SHARED_DIR_ENV, built_once


def _build(folder, log):
    with open(log, "a") as f:
        f.write(f"{folder.name}\n")
    time.sleep(0.5)  # the other process asks meanwhile
    (folder / "made").write_text("x")
    return {"made": str(folder / "made")}


def _ask(log, out):
    rec = built_once("thing", lambda d: _build(d, log), lambda: pytest.fail("no own folder with a shared one"))
    out.put(rec)


def test_two_processes_share_one_build(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path))
    log = tmp_path / "builds.log"
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_ask, args=(log, out)) for _ in range(2)]
    for p in procs:
        p.start()
    recs = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert log.read_text() == "thing\n"  # built once
    assert recs[0] == recs[1] == {"made": str(tmp_path / "thing" / "made")}


def test_a_failed_build_is_built_again_and_no_shared_folder_builds_in_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path))

    def broken(folder):
        (folder / "half").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        built_once("thing", broken, lambda: tmp_path)
    rec = built_once("thing", lambda d: {"left": sorted(p.name for p in d.iterdir())}, lambda: tmp_path)
    assert rec == {"left": []}  # the half-made folder was emptied
    assert built_once("thing", broken, lambda: tmp_path) == rec  # recorded: not built again
    monkeypatch.delenv(SHARED_DIR_ENV)
    own = tmp_path / "own"
    own.mkdir()
    assert built_once("thing", lambda d: {"in": str(d)}, lambda: own) == {"in": str(own)}


def test_a_build_held_too_long_by_another_process_is_a_timeout_naming_the_lock(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path))
    ctx = multiprocessing.get_context("fork")
    held, done = ctx.Event(), ctx.Event()

    def hold():
        with open(tmp_path / "thing.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            held.set()
            done.wait(30)

    p = ctx.Process(target=hold)
    p.start()
    try:
        assert held.wait(30)
        with pytest.raises(TimeoutError, match="thing.lock"):
            built_once("thing", lambda d: pytest.fail("built while the other holds the lock"), lambda: tmp_path,
                       wait_s=1.0)
    finally:
        done.set()
        p.join(30)
    assert built_once("thing", lambda d: {"ok": 1}, lambda: tmp_path, wait_s=1.0) == {"ok": 1}
