"""Where ``agentrl eval``'s budget comes from, said where a user reads it: ``budget_source``
(the run's stored config, the packaged default config, or the built-in defaults; the
overrides that change it), the line ``agentrl eval`` prints before it rolls out, its
``--help`` and docs/eval-and-diagnose.md, whose numbers must be those of the configs they name."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.commands.evaluate import budget_source, eval_config, resolve_target
from agentrl.config import EvalConfig, load_default_config
from agentrl.eval.report import format_budget

GUESS = "agentrl/GuessNumber-v0"
REPO = Path(__file__).resolve().parents[3]


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "iter_1"
    (ckpt / "trainer").mkdir(parents=True)
    (run / "config.yaml").write_text(f"run:\n  name: r\nenv:\n  id: {GUESS}\n  split: train\n"
                                     "eval:\n  temperature: 0.6\n  max_turns: 2\n  max_new_tokens: 64\n")
    (ckpt / "controller.json").write_text(json.dumps({"run_id": "r-1", "iteration": 1, "policy_version": 1}))
    (ckpt / "trainer" / "COMPLETE").write_text("ok\n")
    (run / "checkpoints" / "latest").write_text("iter_1")
    return run


def test_a_run_is_evaluated_with_its_stored_eval_section_and_says_so(tmp_path):
    run = _run(tmp_path)
    target = resolve_target(str(run))
    cfg, _ = eval_config(target, ["eval.max_new_tokens=32"])
    assert (cfg.rollout.temperature, cfg.rollout.max_turns, cfg.rollout.max_new_tokens) == (0.6, 2, 32)
    src = budget_source(target, cfg, ["eval.max_new_tokens=32", "rollout.kv_cache_gb=1"])
    assert src == f"the eval section of the run's stored config ({run / 'config.yaml'}); overridden: eval.max_new_tokens=32"


def test_a_bare_model_names_the_packaged_default_or_the_built_in_defaults():
    model = resolve_target("tiny-random-smollm2")
    packaged, _ = eval_config(model, [])
    d = load_default_config().eval
    assert (packaged.rollout.temperature, packaged.rollout.max_turns, packaged.rollout.max_new_tokens) == (
        d.temperature, d.max_turns, d.max_new_tokens)
    assert budget_source(model, packaged) == \
        "the eval section of the packaged default config (agentrl/defaults/shell_lookup.yaml)"
    other, _ = eval_config(model, [], env_id=GUESS)
    b = EvalConfig()
    assert (other.rollout.temperature, other.rollout.max_turns, other.rollout.max_new_tokens) == (
        b.temperature, b.max_turns, b.max_new_tokens)
    assert budget_source(model, other).startswith("the built-in eval defaults (agentrl.config)")
    assert budget_source(model, packaged, ["rollout.max_new_tokens=9"], section="rollout").endswith(
        "; overridden: rollout.max_new_tokens=9")


def test_the_budget_line_says_what_and_from_where():
    settings = {"env": GUESS, "split": "test", "tasks": 3, "samples": 2, "seed": 4, "temperature": 0.3, "top_p": 1.0,
                "top_k": -1, "max_turns": 4, "max_new_tokens": 128, "max_context_tokens": 2048,
                "budget_source": "the eval section of the run's stored config (r/config.yaml)"}
    assert format_budget(settings) == (
        "budget: temperature 0.3 (top_p 1, top_k off), max_turns 4, max_new_tokens 128, max_context_tokens 2048; "
        "from the eval section of the run's stored config (r/config.yaml); 3 tasks x 2 samples of "
        "agentrl/GuessNumber-v0 split test, seed 4")


def test_agentrl_eval_prints_its_budget_before_anything_runs(tmp_path):
    """The line comes before the engines and the replay store (and a checkpoint's export): a
    store that cannot be opened fails after it, before any Ray or vLLM start."""
    r = CliRunner().invoke(app, ["eval", "tiny-random-smollm2", "--num-tasks", "2", "--replay-url", "nosuch://x",
                                 "eval.max_turns=1", f"run.output_dir={tmp_path}"], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    d = load_default_config().eval
    assert (f"budget: temperature {d.temperature:g} (top_p 1, top_k off), max_turns 1, max_new_tokens "
            f"{d.max_new_tokens}") in out
    assert "from the eval section of the packaged default config" in out and "overridden: eval.max_turns=1" in out
    assert out.index("budget:") < out.index("error: replay store url='nosuch://x'")


def test_help_and_docs_name_the_source_and_its_numbers():
    r = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "300"})
    assert r.exit_code == 0
    text = re.sub(r"[\s│]+", " ", r.output)
    d, b = load_default_config().eval, EvalConfig()
    assert "the eval section of: the run's stored config (RUN/config.yaml) for a run or a checkpoint" in text
    assert (f"the packaged default config (agentrl/defaults/shell_lookup.yaml: temperature {d.temperature:g}, "
            f"max_turns {d.max_turns}, max_new_tokens {d.max_new_tokens}, {d.num_tasks} tasks)") in text
    assert (f"otherwise the built-in defaults (temperature {b.temperature:.1f}, max_turns {b.max_turns}, "
            f"max_new_tokens {b.max_new_tokens}, all tasks)") in text and b.num_tasks is None
    assert "printed before the rollout" in text
    page = (REPO / "docs" / "eval-and-diagnose.md").read_text()
    section = page[page.index("## Held-out evaluation"):page.index("## Task difficulty")]
    assert (f"temperature {d.temperature:g}, {d.max_turns} turns, {d.max_new_tokens} new tokens, {d.num_tasks} tasks "
            f"x {d.samples} samples") in section
    assert f"temperature {b.temperature:.1f}, {b.max_turns} turns, {b.max_new_tokens} new tokens, all tasks" in section
    assert "`RUN/config.yaml`" in section and "`agentrl/defaults/shell_lookup.yaml`" in section
