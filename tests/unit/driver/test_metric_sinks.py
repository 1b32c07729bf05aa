"""TensorBoard and W&B (offline) sinks (agentrl/driver/metric_sinks.py): metrics lines go
through ``RunDir.append_metrics`` (the path every iteration takes) and are read back with
the libraries' own readers (TensorBoard's ``EventAccumulator``; the W&B offline run's
``.wandb`` file through W&B's protobuf records, tests/helpers/wandb_log.py), then compared
with ``metrics.jsonl``'s names and values. A resume rebuilds each sink from the checkpoint's
history, exactly as ``metrics.jsonl`` is rewritten: every iteration once."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest

from agentrl.driver.checkpoint import RunDir
from agentrl.driver.metric_sinks import Sinks, check_packages, open_sinks, scalars_of, wandb_run_id
from agentrl.config import load_config
from agentrl.errors import ConfigError, ContractError


def line(it: int, shift: float = 0.0) -> dict[str, float | None]:
    """A metrics line shaped as ``record_iteration`` writes it (null: a non-finite value)."""
    return {"iteration": float(it), "policy_version": float(it), "rollout/reward_mean": 0.25 * it + shift,
            "rollout/turns_mean": 1.5 + shift, "loss/policy": -0.125 * it, "train/grad_norm": None,
            "eval/pass@1": (0.5 + shift) if it % 2 == 0 else None, "time/update_s": 3.0 + it}


def jsonl(rd: RunDir) -> dict[int, dict[str, float]]:
    """``metrics.jsonl`` as ``{iteration: {name: value}}`` without its nulls (and the step)."""
    rows = [json.loads(t) for t in rd.metrics_path.read_text().splitlines()]
    return dict(scalars_of(r) for r in rows)


def crash_and_resume(tmp_path: Path, cfg, run_id: str) -> RunDir:
    """Iterations 1-3 written, a checkpoint after 2, a crash, a resume that redoes 3 with other
    values, then 4: what ``controller.train`` does (``rewind`` then ``open_sinks``)."""
    rd = RunDir(tmp_path / "run")
    rd.reset_metrics([])
    rd.sinks = open_sinks(cfg, rd.path, run_id, [])
    history = [line(1), line(2)]
    for m in (*history, line(3)):
        rd.append_metrics(m)
    rd.sinks.close()  # the process dies after iteration 3 (checkpoint at 2)
    resumed = RunDir(tmp_path / "run")
    resumed.rewind(2, history)
    resumed.sinks = open_sinks(cfg, resumed.path, run_id, history)
    resumed.append_metrics(line(3, shift=0.01))
    resumed.append_metrics(line(4))
    resumed.sinks.close()
    return resumed


def test_tensorboard_holds_metrics_jsonl_names_and_values_once_per_iteration_after_a_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, ["logging.tensorboard=true"])
    rd = crash_and_resume(tmp_path, cfg, "r-0001")
    expected = jsonl(rd)
    assert sorted(expected) == [1, 2, 3, 4] and expected[3]["rollout/reward_mean"] == 0.76  # the re-run's value
    acc = EventAccumulator(str(rd.path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {k for row in expected.values() for k in row}  # metrics.jsonl's names, nulls skipped
    for tag in tags:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert steps == sorted(set(steps)), (tag, steps)  # each iteration once, in order
        assert steps == [it for it, row in expected.items() if tag in row]
        for e in events:
            assert e.value == pytest.approx(expected[e.step][tag], rel=1e-6), (tag, e.step)  # float32 scalars


def test_wandb_offline_holds_metrics_jsonl_names_and_values_once_per_iteration_after_a_resume(tmp_path, monkeypatch):
    from tests.helpers.wandb_log import history_rows, records

    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # dir= in the config wins over it
    cfg = load_config(None, ["logging.wandb.project=agentrl-test", "logging.wandb.mode=offline", "run.name=wb"])
    hook = sys.excepthook
    rd = crash_and_resume(tmp_path, cfg, "wb-0002")
    assert sys.excepthook is hook  # wandb.init's own hook is taken back when the sink closes
    runs = sorted((rd.path / "wandb").glob("offline-run-*"))
    assert [p.name.rsplit("-", 2)[-2:] for p in runs] == [["wb", "0002"]]  # one offline run: the abandoned one is gone
    wandb_file = next(runs[0].glob("run-*.wandb"))
    # complete once the sink closed: the exit record is written, after every history row (W&B's
    # system-info "environment" record may land after it: seen as the last record under load)
    kinds = [r.WhichOneof("record_type") for r in records(wandb_file)]
    assert "exit" in kinds and "history" not in kinds[kinds.index("exit"):], kinds
    rows = history_rows(wandb_file)
    expected = jsonl(rd)
    got = {int(r["_step"]): {k: v for k, v in r.items() if not k.startswith("_")} for r in rows}
    assert [int(r["_step"]) for r in rows] == [1, 2, 3, 4]  # each iteration once, the re-run's 3
    assert got == expected  # the same names and values (float64 in W&B's JSON)


def test_a_missing_package_names_the_extra_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "tensorboard") else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging.tensorboard=true needs the tensorboard package.*pip install 'agentrl\[tensorboard\]'"):
        check_packages(load_config(None, ["logging.tensorboard=true"]))
    with pytest.raises(ConfigError, match=r"logging.wandb needs the wandb package.*pip install 'agentrl\[wandb\]'"):
        check_packages(load_config(None, ["logging.wandb.mode=offline"]))
    check_packages(load_config(None, []))  # nothing asked: nothing checked


def test_config_errors_and_the_online_run_ids():
    with pytest.raises(ConfigError, match=r"logging.wandb.mode='cloud'.*'offline' or 'online'"):
        load_config(None, ["logging.wandb.mode=cloud"])
    with pytest.raises(ConfigError, match=r"logging.tensorbord"):
        load_config(None, ["logging.tensorbord=true"])
    # W&B's own tag limit (1-64 characters, checked by wandb.init) is a load-time error here
    with pytest.raises(ConfigError, match=r"logging.wandb.tags\[1\]='x{65}' has 65 characters; W&B takes tags of 1-64"):
        load_config(None, ["logging.wandb.tags=[ok, " + "x" * 65 + "]"])
    with pytest.raises(ConfigError, match=r"logging.wandb.tags\[0\]='' has 0 characters"):
        load_config(None, ["logging.wandb.tags=['']"])
    assert load_config(None, ["logging.wandb.tags=[" + "y" * 64 + "]"]).logging.wandb.tags == ["y" * 64]
    assert wandb_run_id("r-1", "offline", 4) == "r-1"
    assert (wandb_run_id("r-1", "online", 0), wandb_run_id("r-1", "online", 4)) == ("r-1", "r-1-resume-4")
    with pytest.raises(ContractError, match="without an integral 'iteration'"):
        scalars_of({"loss/policy": 1.0})


def test_a_failing_sink_is_switched_off_and_metrics_jsonl_keeps_every_line(tmp_path, caplog):
    class Broken:
        name = "broken"
        writes = 0

        def write(self, step, scalars):
            Broken.writes += 1
            raise OSError("disk full")

        def close(self):
            pass

    rd = RunDir(tmp_path / "run")
    rd.reset_metrics([])
    rd.sinks = Sinks([Broken()])
    with caplog.at_level(logging.WARNING):
        for it in (1, 2):
            rd.append_metrics(line(it))
    assert Broken.writes == 1 and not rd.sinks
    assert "metric sink broken failed at iteration 1 and is switched off" in caplog.text
    assert sorted(jsonl(rd)) == [1, 2]


def test_wandb_online_without_a_login_is_one_clear_error_before_the_run(tmp_path, monkeypatch):
    """W&B online needs a login: without one (no API key here), the sink refuses at start
    with an InfraError naming the mode and the way out, never a traceback mid-run."""
    from agentrl.errors import InfraError

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))  # no stored login either
    monkeypatch.setenv("HOME", str(tmp_path))
    hook = sys.excepthook
    cfg = load_config(None, ["logging.wandb.mode=online"])
    with pytest.raises(InfraError, match=r"logging.wandb \(mode='online', project='agentrl'\): W&B could not start "
                                         r"a run: UsageError.*logging.wandb.mode=offline"):
        open_sinks(cfg, tmp_path / "run", "r-0003", [])
    assert sys.excepthook is hook
