"""``agentrl train`` in a subprocess for the SIGKILL-and-resume tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def train_cli(args: list[str], kill_at: str | None = None, timeout_s: float = 420, *,
              kill_signal: str = "KILL") -> tuple[int, str]:
    """Run ``agentrl train ARGS`` to its end or its kill (``kill_at``: the value of
    ``$AGENTRL_TEST_KILL_AT``, ``agentrl.driver.checkpoint.kill_point``; ``kill_signal``
    ``"TERM"``: the driver SIGTERMs itself there instead, ``$AGENTRL_TEST_KILL_SIGNAL``);
    returns (exit code, output). It runs in its own process group, which is SIGKILLed
    afterwards: the Ray head and workers a SIGKILLed driver leaves behind go with it."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTRL_TEST_KILL_AT", "AGENTRL_TEST_KILL_SIGNAL")}
    env["OMP_NUM_THREADS"] = "1"
    if kill_at:
        env["AGENTRL_TEST_KILL_AT"] = kill_at
        env["AGENTRL_TEST_KILL_SIGNAL"] = kill_signal
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return proc.returncode, out.decode(errors="replace")
