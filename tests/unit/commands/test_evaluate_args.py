"""``agentrl eval``'s pure parts: what a target is (run, checkpoint, export, model) and the
errors for paths that are none of them, the eval config's fixed budget, the held-out check,
the deterministic requests and run id, and the CLI's one-line errors. The real evaluation
(Ray, vLLM, the store) is ``tests/integration/cluster/test_evaluate.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.commands.evaluate import check_replaceable, eval_config, eval_identity, eval_run_id, resolve_target
from agentrl.driver.evaluation import eval_requests, held_out_task_ids
from agentrl.errors import CheckpointError, ConfigError
from agentrl.replay import ReplayStore

GUESS = "agentrl/GuessNumber-v0"


def _run(tmp_path: Path, *, checkpoint: bool = True, version: int = 3, env_split: str = "train") -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(f"run:\n  name: r\nenv:\n  id: {GUESS}\n  split: {env_split}\n")
    if checkpoint:
        ckpt = run / "checkpoints" / "iter_2"
        (ckpt / "trainer").mkdir(parents=True)
        (ckpt / "controller.json").write_text(json.dumps({"run_id": "r-1234", "iteration": 2, "policy_version": version}))
        (ckpt / "trainer" / "COMPLETE").write_text("ok\n")
        (run / "checkpoints" / "latest").write_text("iter_2")
    return run


def test_targets_are_classified_with_their_policy_version(tmp_path):
    run = _run(tmp_path)
    t = resolve_target(str(run))
    assert (t.kind, t.name, t.policy_version, t.model) == ("run", "r-1234", 3, None)
    assert t.checkpoint == run / "checkpoints" / "iter_2"
    c = resolve_target(str(run / "checkpoints" / "iter_2"))
    assert (c.kind, c.policy_version, c.run_dir) == ("checkpoint", 3, run)
    export = tmp_path / "exported"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / "agentrl_export.json").write_text(json.dumps({"run_id": "r-1234", "policy_version": 5}))
    e = resolve_target(str(export))
    assert (e.kind, e.policy_version, e.model) == ("export", 5, str(export.resolve()))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    m = resolve_target(str(hf))
    assert (m.kind, m.policy_version, m.name) == ("model", 0, "hf")
    assert resolve_target("tiny-random-smollm2").policy_version == 0


def test_paths_that_are_no_target_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"'.*nope' does not exist; expected a run directory"):
        resolve_target(str(tmp_path / "nope"))
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        resolve_target(str(tmp_path / "f.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="none of the accepted kinds"):
        resolve_target(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="no checkpoint yet"):
        resolve_target(str(_run(tmp_path / "a", checkpoint=False)))
    run = _run(tmp_path / "b")
    (run / "checkpoints" / "iter_2" / "trainer" / "COMPLETE").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_target(str(run / "checkpoints" / "iter_2"))


def test_the_eval_section_replaces_the_rollout_budget(tmp_path):
    t = resolve_target(str(_run(tmp_path)))
    cfg, train = eval_config(t, ["eval.samples=3", "eval.max_new_tokens=17", "eval.temperature=0.7",
                                 "rollout.max_new_tokens=99", "eval.seed=5"])
    assert train is not None and train.env.split == "train" and train.rollout.max_new_tokens == 256
    assert (cfg.env.group_size, cfg.env.split, cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (3, "test", 17, 0.7)
    assert (cfg.rollout.top_p, cfg.rollout.top_k, cfg.run.seed, cfg.controller.mode) == (1.0, -1, 5, "sync")
    with pytest.raises(ConfigError, match="eval.samples"):
        eval_config(t, ["eval.samples=0"])


def test_the_eval_split_must_be_held_out(tmp_path):
    t = resolve_target(str(_run(tmp_path)))
    cfg, train = eval_config(t, [])
    ids = held_out_task_ids(cfg, train)
    assert ids and all(i.startswith("guess/") for i in ids)
    cfg_all, _ = eval_config(t, ["eval.split=all"])
    with pytest.raises(ConfigError, match=r"--split 'all' shares \d+ of its \d+ tasks with the run's training tasks.*--allow-overlap"):
        held_out_task_ids(cfg_all, train)
    assert len(held_out_task_ids(cfg_all, train, allow_overlap=True)) > len(ids)
    # a bare model: the env's train split is the training split
    m = resolve_target("tiny-random-smollm2")
    cfg_m, none = eval_config(m, ["eval.split=train"], env_id=GUESS)
    assert none is None
    with pytest.raises(ConfigError, match="training split 'train'"):
        held_out_task_ids(cfg_m, None)
    cfg_n, _ = eval_config(m, ["eval.num_tasks=100000"], env_id=GUESS)
    with pytest.raises(ConfigError, match="eval.num_tasks=100000"):
        held_out_task_ids(cfg_n, None)


def test_requests_and_run_id_are_fixed_by_the_seed(tmp_path):
    m = resolve_target("tiny-random-smollm2")
    cfg, _ = eval_config(m, ["eval.num_tasks=3", "eval.samples=2", "eval.seed=4"], env_id=GUESS)
    ids = held_out_task_ids(cfg, None)
    run_id = eval_run_id(m, cfg)
    assert re.fullmatch(r"eval-tiny-random-smollm2-v0-agentrl-GuessNumber-v0-test-n2-s4-[0-9a-f]{10}", run_id)
    assert eval_run_id(m, eval_config(m, ["eval.num_tasks=3", "eval.samples=2", "eval.seed=4"], env_id=GUESS)[0]) == run_id
    a, b = eval_requests(cfg, ids, run_id), eval_requests(cfg, ids, run_id)
    assert a == b and len(a) == 6 and sorted({r.task_id for r in a}) == sorted(ids)
    cfg5, _ = eval_config(m, ["eval.num_tasks=3", "eval.samples=2", "eval.seed=5"], env_id=GUESS)
    assert [r.sample_seed for r in eval_requests(cfg5, ids, run_id)] != [r.sample_seed for r in a]


def _hf(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_run_id_tells_apart_models_of_one_folder_name_and_other_eval_settings(tmp_path):
    """Two different models named ``final`` (``/models/run1/final``, ``/models/run2/final``) or
    another temperature, token limit, turn cap, context budget or ``num_tasks`` each get their
    own run id (the hash of ``eval_identity``), so one eval never rewinds another's rows; the
    same model and settings keep theirs (a repeat replaces its rows)."""
    one, two = resolve_target(str(_hf(tmp_path / "run1" / "final"))), resolve_target(str(_hf(tmp_path / "run2" / "final")))
    assert one.name == two.name == "final"
    base = ["eval.num_tasks=3", "eval.samples=2"]
    cfg1, _ = eval_config(one, base, env_id=GUESS)
    cfg2, _ = eval_config(two, base, env_id=GUESS)
    assert eval_run_id(one, cfg1) != eval_run_id(two, cfg2)
    assert eval_identity(one, cfg1)["target"] == str((tmp_path / "run1" / "final").resolve())
    again = resolve_target(str(tmp_path / "run1" / ".." / "run1" / "final"))  # the same folder, written another way
    assert eval_run_id(again, eval_config(again, base, env_id=GUESS)[0]) == eval_run_id(one, cfg1)
    ids = {eval_run_id(one, cfg1)}
    for extra in ("eval.temperature=0.7", "eval.max_new_tokens=17", "eval.max_turns=2",
                  "eval.max_context_tokens=1024", "eval.num_tasks=2"):
        ids.add(eval_run_id(one, eval_config(one, [*base, extra], env_id=GUESS)[0]))
    assert len(ids) == 6
    run = _run(tmp_path / "r")  # a run and its checkpoint directory are the same target
    t, c = resolve_target(str(run)), resolve_target(str(run / "checkpoints" / "iter_2"))
    assert eval_run_id(t, eval_config(t, [])[0]) == eval_run_id(c, eval_config(c, [])[0])


def test_a_stored_eval_with_other_settings_is_not_replaced(tmp_path):
    """``check_replaceable`` (run before the store's rewind): a run id not stored, or stored
    with the same identity, may be replaced; one whose stored identity differs, or that
    records none, is a ``ConfigError`` naming the setting, and the stored run is untouched."""
    m = resolve_target(str(_hf(tmp_path / "m")))
    cfg, _ = eval_config(m, ["eval.num_tasks=3", "eval.temperature=1.0"], env_id=GUESS)  # not the default's 0.3
    hot, _ = eval_config(m, ["eval.num_tasks=3", "eval.temperature=0.5"], env_id=GUESS)
    run_id, identity = eval_run_id(m, cfg), eval_identity(m, cfg)
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        check_replaceable(store, run_id, identity)  # nothing stored yet
        store.start_run(run_id, {"kind": "eval", "identity": identity})
        check_replaceable(store, run_id, identity)  # the same eval again
        with pytest.raises(ConfigError, match=r"settings differ \(temperature: stored 1.0, now 0.5\)"):
            check_replaceable(store, run_id, eval_identity(m, hot))
        store.start_run("eval-old", {"kind": "eval"})
        with pytest.raises(ConfigError, match="'eval-old' is already in the replay store and it records no eval"):
            check_replaceable(store, "eval-old", identity)
        assert store.get_run(run_id).config["identity"] == identity


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(tmp_path / "nope"), "--env", GUESS])
    assert res.exit_code == 2 and "does not exist" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["eval", str(_run(tmp_path)), "--split", "all"])
    assert res.exit_code == 2 and "--allow-overlap" in res.output and "Traceback" not in res.output


def test_eval_during_training_settings_are_checked_at_start():
    from agentrl.driver.evaluation import TrainingEval, eval_budget
    from agentrl.rollout.budget import RolloutBudget
    from agentrl.types import SamplingRecord
    from agentrl.config import load_config, load_default_config

    with pytest.raises(ConfigError, match="eval.engine='rollout' with controller.mode='async'"):  # async: a dedicated one
        load_config(None, ["eval.every=1", "controller.mode=async", "eval.engine=rollout"])
    with pytest.raises(ConfigError, match="eval.max_context_tokens=4096 exceeds rollout.max_context_tokens=2048"):
        load_config(None, ["eval.every=1", "eval.max_context_tokens=4096"])
    # unset, the eval's context is the rollout's: a lowered rollout context lowers it too, so the
    # packaged default (evals before and after training) starts with rollout.max_context_tokens=1024
    assert load_config(None, ["eval.every=1", "rollout.max_context_tokens=1024"]).eval.max_context_tokens == 1024
    assert load_default_config(["rollout.max_context_tokens=1024"]).eval.max_context_tokens == 1024
    assert load_default_config().eval.max_context_tokens == 2048
    cfg = load_config(None, [f"env.id={GUESS}", "eval.every=2", "eval.num_tasks=3", "eval.max_new_tokens=5"])
    te = TrainingEval(cfg)
    assert len(te.task_ids) == 3 and [te.due(i) for i in range(1, 5)] == [False, True, False, True]
    assert eval_budget(cfg) == RolloutBudget(max_turns=3, max_new_tokens=5, max_context_tokens=2048,
                                             sampling=SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1),
                                             env_kwargs={})  # GuessNumber declares no separate judge: the run's env.kwargs
    assert TrainingEval(load_config(None, [f"env.id={GUESS}"])).task_ids == []  # every=0: nothing to check
    with pytest.raises(ConfigError, match="--allow-overlap"):
        TrainingEval(load_config(None, [f"env.id={GUESS}", "eval.every=1", "eval.split=all"]))
    assert TrainingEval(load_config(None, [f"env.id={GUESS}", "eval.every=1", "eval.split=all", "eval.num_tasks=2",
                                          "eval.allow_overlap=true"])).task_ids


def test_the_train_summary_shows_eval_pass_at_1_only_when_measured():
    from types import SimpleNamespace

    from rich.console import Console

    from agentrl.cli.train import summary_table as _summary_table

    def render(history):
        c = Console(width=200, record=True)
        c.print(_summary_table(SimpleNamespace(run_id="r", status="finished", history=history)))
        return c.export_text()

    assert "eval pass@1" not in render([{"iteration": 1.0}])
    out = render([{"iteration": 1.0, "eval/pass@1": 0.25}, {"iteration": 2.0}])
    assert "eval pass@1" in out and "0.250" in out


def test_eval_before_and_after_training_are_due_once_each():
    from agentrl.driver.evaluation import TrainingEval
    from agentrl.config import load_config

    # async mode: on the dedicated eval engine (tests/unit/driver/test_async_eval.py)
    assert load_config(None, ["eval.before_training=true", "controller.mode=async"]).eval_engine == "dedicated"
    base = [f"env.id={GUESS}", "run.iterations=3", "eval.num_tasks=2"]
    te = TrainingEval(load_config(None, [*base, "eval.before_training=true", "eval.after_training=true"]))
    assert len(te.task_ids) == 2  # the held-out split is checked at start-up, as with eval.every
    assert [te.due(i) for i in range(1, 4)] == [False, False, True] and te.due_before(0) and not te.due_before(2)
    both = TrainingEval(load_config(None, [*base, "eval.every=3", "eval.after_training=true"]))
    assert [both.due(i) for i in range(1, 4)] == [False, False, True]  # the last iteration evaluated once, not twice
    off = TrainingEval(load_config(None, base))
    assert off.task_ids == [] and not off.due_before(0) and not any(off.due(i) for i in range(1, 4))


def test_the_train_summary_ends_with_eval_before_and_after():
    from agentrl.eval.report import training_eval_lines

    def ev(prefix, version, p, lo, hi):
        return {f"{prefix}/policy_version": version, f"{prefix}/pass@1": p, f"{prefix}/pass@1_low": lo,
                f"{prefix}/pass@1_high": hi, f"{prefix}/tasks": 9.0, f"{prefix}/samples_scored": 36.0,
                f"{prefix}/samples_errored": 0.0}

    history = [{"iteration": 1.0, **ev("eval_before", 0.0, 0.25, 0.1, 0.4)}, {"iteration": 2.0},
               {"iteration": 3.0, **ev("eval", 3.0, 0.5, 0.3, 0.7)}]
    assert training_eval_lines(history) == [
        "held-out eval before training (policy version 0): pass@1 0.250 [0.100, 0.400] over 9 tasks x 4 samples "
        "(36 scored, 0 errored)",
        "held-out eval after training (policy version 3): pass@1 0.500 [0.300, 0.700] over 9 tasks x 4 samples "
        "(36 scored, 0 errored)"]
    mid = training_eval_lines([{"iteration": 1.0, **ev("eval", 1.0, float("nan"), float("nan"), float("nan"))},
                               {"iteration": 2.0}])
    assert mid == ["held-out eval after iteration 1 (policy version 1): pass@1 undefined over 9 tasks x 4 samples "
                   "(36 scored, 0 errored)"]
    assert training_eval_lines([{"iteration": 1.0}]) == []  # no eval in the run: no lines


def test_a_bare_model_on_another_env_is_evaluated_without_the_packaged_defaults_env_settings():
    """The packaged default is tuned for its env (ShellLookup: eval.num_tasks 12, temperature 0.3,
    stop strings): ``agentrl eval MODEL --env OTHER`` starts from the built-in defaults instead, so
    HumanEval is not silently cut to its first 12 test tasks; the packaged env keeps them."""
    from agentrl.commands.evaluate import eval_config, resolve_target
    from agentrl.config import load_default_config

    target = resolve_target("tiny-random-smollm2")
    other, _ = eval_config(target, [], env_id="agentrl/HumanEval-v0")
    assert other.env.id == "agentrl/HumanEval-v0" and other.eval.num_tasks is None
    assert other.rollout.stop_strings == [] and other.rollout.temperature == 1.0
    packaged = load_default_config()
    same, _ = eval_config(target, ["eval.samples=2"], env_id=packaged.env.id)
    assert same.eval.num_tasks == packaged.eval.num_tasks == 12 and same.eval.samples == 2
    assert same.rollout.stop_strings == packaged.rollout.stop_strings == ["</tool_call>"]
    assert eval_config(target, [])[0].env.id == packaged.env.id  # no env named: the packaged one
