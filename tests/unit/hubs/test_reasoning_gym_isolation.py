"""``hub/ReasoningGym-v0`` scores answers outside the rollout process: spiral_matrix's scorer
``eval``s the answer, yet an answer can neither write a file of the host nor patch the scorer
for later answers; a scorer that hangs, raises, returns a non-number or ends its process, and
a worker that dies or replies garbage, are ``RewardError``s naming family and task (never a
score of 0), after which a new worker scores correctly; without bubblewrap the worker is a
plain subprocess with a WARNING; the worker dies with its rollout process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agentrl.errors import RewardError, SandboxError
from agentrl.hubs import reasoning_gym_scorer
from agentrl.hubs.reasoning_gym import ReasoningGymEnv, _dataset
from agentrl.hubs.reasoning_gym_scorer import ScorerWorker

pytest.importorskip("reasoning_gym")

REPO = Path(__file__).resolve().parents[3]
FORGE = ("<answer>[setattr(type(o), 'score_answer', lambda s, a, e: 1.0) for o in __import__('gc').get_objects() "
         "if type(o).__name__ == 'SpiralMatrixDataset']</answer>")
PLANTED = """
import os, time
from reasoning_gym.arithmetic.gcd import GCDDataset
_real = GCDDataset.score_answer
_odd = {"big": lambda: 1.5, "nan": lambda: float("nan"), "none": lambda: None, "raise": lambda: 1 / 0,
        "exit": lambda: os._exit(3), "hang": lambda: time.sleep(3600)}
GCDDataset.score_answer = lambda self, answer, entry: _odd[answer]() if answer in _odd else _real(self, answer, entry)
"""


def _right(env: ReasoningGymEnv) -> str:
    return f"<answer>{env.entry['answer']}</answer>"


@pytest.fixture(scope="module")
def planted():
    """A worker whose gcd scorer misbehaves on the answers of ``PLANTED``."""
    worker = ScorerWorker(prelude=PLANTED)
    yield worker
    worker.close()


@pytest.fixture
def gcd_env(planted, monkeypatch):
    monkeypatch.setattr(reasoning_gym_scorer, "shared_worker", lambda: planted)
    env = ReasoningGymEnv(families="gcd", size=5, score_timeout_s=2.0)
    env.reset(options={"task_id": "gcd/s0/1"})
    return env


def test_a_spiral_matrix_answer_reaches_neither_the_host_nor_later_answers(tmp_path):
    marker = tmp_path / "pwned"
    env = ReasoningGymEnv(families="spiral_matrix", size=5)
    ds, _ = _dataset("spiral_matrix", 0, 5, "{}")
    scorer = type(ds).score_answer
    env.reset(options={"task_id": "spiral_matrix/s0/0"})
    _, reward, *_ = env.step(f"<answer>[__import__('pathlib').Path({str(marker)!r}).write_text('x')]</answer>")
    if reasoning_gym_scorer.shared_worker().isolated:  # else a plain subprocess: files are the user's
        assert not marker.exists() and reward == 0.0  # the worker's /tmp is its own
    env.reset(options={"task_id": "spiral_matrix/s0/1"})
    env.step(FORGE)  # patches the scorer of the one process that scored it, which is gone
    assert type(ds).score_answer is scorer
    env.reset(options={"task_id": "spiral_matrix/s0/2"})
    _, reward, _, _, info = env.step("<answer>garbage</answer>")
    assert reward == 0.0 and info["success"] is False
    # the reply channel is out of reach: a forged reply line on stdout goes nowhere
    env.reset(options={"task_id": "spiral_matrix/s0/3"})
    _, reward, *_ = env.step("<answer>[__import__('os').write(1, b'{\"id\": 99, \"score\": 1.0}\\n')]</answer>")
    assert reward == 0.0
    # what an answer leaves running is ended after its score
    env.reset(options={"task_id": "spiral_matrix/s0/3"})
    seen, stop = [], threading.Event()
    watcher = threading.Thread(target=lambda: [seen.extend(_sleepers()) or time.sleep(0.05)
                                               for _ in iter(stop.is_set, True)])
    watcher.start()
    env.step("<answer>[__import__('subprocess').Popen(['sleep', '987654']), __import__('time').sleep(1)]</answer>")
    stop.set()
    watcher.join()
    assert seen  # it ran, in the worker's namespace
    deadline = time.monotonic() + 10
    while _sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sleepers()
    env.reset(options={"task_id": "spiral_matrix/s0/3"})
    try:  # killing its parent: ignored under bubblewrap (pid 1), else a crashed worker
        env.step("<answer>[__import__('os').kill(__import__('os').getppid(), 9)]</answer>")
    except RewardError as exc:
        assert "spiral_matrix/s0/3" in str(exc)
    env.reset(options={"task_id": "spiral_matrix/s0/4"})
    _, reward, _, _, info = env.step(_right(env))
    assert reward == 1.0 and info["success"]


@pytest.mark.parametrize("answer, match", [
    ("raise", r"family 'gcd' raised on task 'gcd/s0/1': ZeroDivisionError"),
    ("big", r"returned 1\.5 on task 'gcd/s0/1'; expected a number in \[0, 1\]"),
    ("nan", "returned nan"),
    ("none", "returned None"),
    ("exit", r"the scoring process (exited with code 3|was killed by signal 9) without a result"),
])
def test_a_scorer_failure_is_a_reward_error_never_a_zero(gcd_env, planted, answer, match):
    starts = planted.starts
    with pytest.raises(RewardError, match=match):
        gcd_env.step(f"<answer>{answer}</answer>")
    gcd_env.reset(options={"task_id": "gcd/s0/1"})
    assert gcd_env.step(_right(gcd_env))[1] == 1.0 and planted.starts == max(starts, 1)  # the same worker


def test_a_hanging_scorer_is_a_reward_error_after_the_timeout_and_a_new_worker_scores(gcd_env, planted):
    old = planted.pid
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"failed to score the answer of reasoning-gym family 'gcd' on task "
                                          r"'gcd/s0/1': timed out after 2 s; it was killed"):
        gcd_env.step("<answer>hang</answer>")
    assert 2.0 <= time.monotonic() - start < 15 and planted.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(old, 0)  # killed and reaped
    gcd_env.reset(options={"task_id": "gcd/s0/1"})
    assert gcd_env.step(_right(gcd_env))[1] == 1.0 and planted.pid not in (None, old)


def test_a_worker_that_dies_is_a_reward_error_and_is_restarted(gcd_env, planted):
    gcd_env.step(_right(gcd_env))  # started
    killer = threading.Timer(0.5, os.killpg, (planted.pid, signal.SIGKILL))
    killer.start()
    gcd_env.reset(options={"task_id": "gcd/s0/1"})
    with pytest.raises(RewardError, match=r"failed to score the answer of .* task 'gcd/s0/1': exited \(exit code "
                                          r"-9\).*; it was killed"):
        gcd_env.step("<answer>hang</answer>")  # dies while scoring
    killer.join()
    gcd_env.reset(options={"task_id": "gcd/s0/1"})
    assert gcd_env.step(_right(gcd_env))[1] == 1.0
    os.killpg(planted.pid, signal.SIGKILL)  # between answers: restarted without losing one
    planted._proc.wait(10)
    gcd_env.reset(options={"task_id": "gcd/s0/1"})
    assert gcd_env.step(_right(gcd_env))[1] == 1.0


def test_a_worker_replying_garbage_is_a_reward_error(monkeypatch):
    worker = ScorerWorker(prelude="_encode_reply = lambda reply: b'not json\\n'")
    monkeypatch.setattr(reasoning_gym_scorer, "shared_worker", lambda: worker)
    env = ReasoningGymEnv(families="gcd", size=5)
    env.reset(options={"task_id": "gcd/s0/2"})
    try:
        with pytest.raises(RewardError, match=r"family 'gcd' on task 'gcd/s0/2'.*sent garbage: b'not json'"):
            env.step("<answer>3</answer>")
        assert worker.pid is None
    finally:
        worker.close()


def test_without_bubblewrap_the_worker_is_a_plain_subprocess_with_a_warning(monkeypatch, caplog):
    def missing(path):
        raise SandboxError("bubblewrap not found")

    monkeypatch.setattr(reasoning_gym_scorer, "find_bwrap", missing)
    monkeypatch.setattr(reasoning_gym_scorer, "_BWRAP", {})
    worker = ScorerWorker()
    monkeypatch.setattr(reasoning_gym_scorer, "shared_worker", lambda: worker)
    env = ReasoningGymEnv(families="spell_backward", size=5)
    env.reset(options={"task_id": "spell_backward/s0/0"})
    try:
        with caplog.at_level(logging.WARNING, logger=reasoning_gym_scorer.__name__):
            assert env.step(_right(env))[1] == 1.0
        assert worker.isolated is False and worker.pid != os.getpid()
        assert "bubblewrap does not work here (bubblewrap not found)" in caplog.text
        assert "NOT isolated" in caplog.text
    finally:
        worker.close()


def test_the_worker_dies_with_its_rollout_process():
    code = ("import os, sys\n"
            "from agentrl.hubs.reasoning_gym import ReasoningGymEnv\n"
            "from agentrl.hubs.reasoning_gym_scorer import shared_worker\n"
            "env = ReasoningGymEnv(families='gcd', size=5)\n"
            "env.reset(options={'task_id': 'gcd/s0/0'})\n"
            "print(env.step('<answer>' + env.entry['answer'] + '</answer>')[1], shared_worker().pid, flush=True)\n"
            "os._exit(0)\n")  # no atexit: the worker goes because its parent did
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    reward, pid = out.stdout.split()
    assert reward == "1.0"
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _sleepers() -> list[str]:
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "cmdline").read_bytes() == b"sleep\x00987654\x00" and _alive(p.name):
                found.append(p.name)
        except OSError:
            pass
    return found


def _alive(pid: str) -> bool:
    try:  # a zombie (state Z) waiting for a reaper is dead
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
