"""``examples/custom_env.py`` runs as documented: registers its env, passes the checker, and
trains one iteration through Ray, whose rollout actor makes the env (it imports the script's
module through AGENTRL_ENV_MODULES)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def test_custom_env_example_checks_and_trains_one_iteration(tmp_path, tiny_model_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "custom_env.py"), str(run_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "example/Add-v0: PASS" in out.stdout
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1
    m = metrics[0]
    # the rollout actor made and reset the env: 2 tasks x 2 rollouts, none an infra error
    assert m["rollout/episodes"] == 4 and m["rollout/termination/infra_error"] == 0
    assert m["rollout/generated_tokens"] > 0  # without AGENTRL_ENV_MODULES all 4 are infra errors


def test_custom_env_example_uses_only_the_public_api_and_declares_what_the_readme_says():
    """README: an env that runs no commands sets ``uses_sandbox = False``; the example
    declares its spaces and reaches agentrl through ``import agentrl``, not its internals."""
    import importlib

    src = (REPO / "examples" / "custom_env.py").read_text()
    assert "agentrl.cluster" not in src and "agentrl.config" not in src
    sys.path.insert(0, str(REPO / "examples"))
    try:
        mod = importlib.import_module("custom_env")
    finally:
        sys.path.remove(str(REPO / "examples"))
    env_cls = mod.AddEnv
    assert env_cls.uses_sandbox is False
    env = env_cls()
    obs, info = env.reset(options={"task_id": "add/12"})
    assert env.observation_space.contains(obs) and env.action_space.contains("5")
    assert env.step("6")[1] == 1.0  # task add/12 asks 12 % 10 + (12 // 10 + 3) = 2 + 4
