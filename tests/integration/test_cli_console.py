"""What a command prints: ``agentrl eval`` (tiny model, GuessNumber) shows its budget and the
episodes' progress, and none of the known-harmless vLLM / Ray lines (``agentrl.logs``) that
came before its first useful line (30 lines here before the filter: vLLM's CPU platform
notices, settings agentrl chose, model loading bars, Ray's token-auth notice); every one of
them is in ``console.log`` in the eval directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.logs import known_harmless

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_eval_hides_known_harmless_lines_and_writes_them_to_the_log_file(tmp_path):
    env = dict(os.environ, COLUMNS="200", TERM="dumb", OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "tiny-random-smollm2", "--env",
                        "agentrl/GuessNumber-v0", "--num-tasks", "2", "--samples", "2",
                        "--replay-url", f"sqlite:///{tmp_path / 'replay.db'}", "eval.max_turns=2",
                        "eval.max_new_tokens=8", "eval.max_context_tokens=512", "rollout.kv_cache_gb=1",
                        "rollout.max_num_seqs=8", f"run.output_dir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    printed = (r.stdout + r.stderr).splitlines()
    assert [line for line in printed if known_harmless(line)] == []
    assert [line for line in printed if "(RolloutActor pid=" in line] == []  # nothing else of the engine's either
    assert r.stderr.splitlines()[0].startswith("budget: temperature 1 (top_p 1")  # the first line of all
    assert "4/4" in r.stderr  # the progress bar: episodes finished / requested
    log = (tmp_path / "eval" / "console.log").read_text()
    hidden = [line for line in log.splitlines() if "[hidden " in line]
    names = {line.split("[hidden ", 1)[1].split("]", 1)[0] for line in hidden}
    # (Ray's token-auth notice is hidden where Ray prints it; some installs do not.)
    assert {"vllm-enforce-eager", "vllm-ld-preload", "vllm-loading-shards",
            "vllm-no-tokenizer-eos", "torch-reduce-op-deprecated", "continuation"} <= names
    assert len(hidden) >= 25
    print(f"console lines: {len(printed)} printed, {len(hidden)} known-harmless lines hidden (in {tmp_path}/eval/console.log)")
