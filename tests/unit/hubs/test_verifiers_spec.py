"""``hub/Verifiers-v0``'s kwargs, task ids and runner protocol (``agentrl.hubs.verifiers_spec``):
the kwargs checked with errors that name the value, the request line, the runner's answer
read (a failure is always an error, never a score), and a runner run to its end against a
stand-in "python" (a script that answers as the runner would), so no hub venv is needed."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, InfraError
from agentrl.hubs import verifiers_spec as vs
from agentrl.hubs.verifiers_spec import (
    RolloutResult,
    VerifiersError,
    VerifiersSpec,
    list_task_ids,
    parse_answer,
    parse_task_id,
    run_runner,
    task_id,
)

OK = {"ok": True, "api": "classic", "reward": 0.75, "rewards": {"a": {"score": 1.0, "weight": 0.5},
                                                                "b": {"score": 0.5, "weight": 0.5}},
      "metrics": {"num_turns": 1.0}, "stop": "max_turns_reached", "calls": 1}


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for the hub python: it saves the request line next to itself
    (``<path>.req``), then runs ``body``."""
    path = tmp_path / "python"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n"
                    "req = sys.stdin.readline()\nopen(__file__ + '.req', 'w').write(req)\n" + body)
    path.chmod(0o755)
    return str(path)


def test_kwargs_are_checked_and_named():
    spec = VerifiersSpec.from_kwargs({"python": "~/venv/bin/python", "environment": "gsm8k",
                                      "python_path": ["rel/dir"], "sampling": {"max_tokens": 8}})
    assert spec.python == os.path.expanduser("~/venv/bin/python") and spec.api == "auto"
    assert spec.python_path == (os.path.abspath("rel/dir"),) and spec.sampling == {"max_tokens": 8}
    for kwargs, says in [({"environment": "x"}, "python=None"), ({"python": "p"}, "environment=None"),
                         ({"python": "p", "environment": "x", "api": "v2"}, "api='v2'"),
                         ({"python": "p", "environment": "x", "nope": 1}, "unknown kwargs ['nope']"),
                         ({"python": "p", "environment": "x", "args": [1]}, "args=[1] must be a dict"),
                         ({"python": "p", "environment": "x", "args": {"f": object()}}, "JSON values"),
                         ({"python": "p", "environment": "x", "python_path": "dir"}, "python_path='dir'"),
                         ({"python": "p", "environment": "x", "max_tasks": 0}, "max_tasks=0"),
                         ({"python": "p", "environment": "x", "timeout_s": -1}, "timeout_s=-1")]:
        with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
            VerifiersSpec.from_kwargs(kwargs)


def test_the_judge_is_an_endpoint_whose_key_stays_in_the_environment():
    base = {"python": "p", "environment": "x"}
    spec = VerifiersSpec.from_kwargs({**base, "judge": {"base_url": "http://127.0.0.1:9/v1", "model": "j",
                                                        "api_key_env": "JUDGE_KEY"}})
    assert spec.judge == {"base_url": "http://127.0.0.1:9/v1", "model": "j", "api_key_env": "JUDGE_KEY"}
    with pytest.raises(ConfigError, match="judge.api_key: a key does not belong"):
        VerifiersSpec.from_kwargs({**base, "judge": {"base_url": "http://h/v1", "model": "j", "api_key": "sk-1"}})
    with pytest.raises(ConfigError, match="judge.base_url='h:1'"):
        VerifiersSpec.from_kwargs({**base, "judge": {"base_url": "h:1", "model": "j"}})
    with pytest.raises(ConfigError, match="judge.model=None"):
        VerifiersSpec.from_kwargs({**base, "judge": {"base_url": "http://h/v1"}})
    with pytest.raises(ConfigError) as err:  # a pasted key is not printed back
        VerifiersSpec.from_kwargs({**base, "judge": {"base_url": "http://h/v1", "model": "j", "api_key_env": "sk-1"}})
    assert "sk-1" not in str(err.value)


def test_the_request_line_carries_the_spec_and_the_mode():
    spec = VerifiersSpec.from_kwargs({"python": "p", "environment": "x", "args": {"n": 2}, "eval_args": {"n": 1}})
    line = spec.request("rollout", split="test", index=3, lifeline=True)
    assert line.endswith("\n") and line.count("\n") == 1
    req = json.loads(line)
    assert req["mode"] == "rollout" and req["environment"] == "x" and req["args"] == {"n": 2}
    assert req["eval_args"] == {"n": 1} and req["split"] == "test" and req["index"] == 3 and req["lifeline"]
    assert spec.argv() == ["p", "-I", vs.RUNNER] and Path(vs.RUNNER).name == "verifiers_runner.py"


def test_task_ids():
    assert task_id("train", 7) == "train/7" and parse_task_id("test/0") == ("test", 0)
    for bad in ("train/07", "dev/1", "train/-1", "train", 3, None):
        with pytest.raises(ConfigError, match="not a hub/Verifiers-v0 task id"):
            parse_task_id(bad)


def test_an_answer_is_read_from_the_last_line_and_a_failure_is_never_a_score():
    assert parse_answer("noise\n" + json.dumps(OK) + "\n\n", "", 0, "rollout")["reward"] == 0.75
    with pytest.raises(VerifiersError, match=r"gave no answer \(exit 1\); stderr: 'Traceback: boom'") as err:
        parse_answer("", "Traceback: boom\n", 1, "rollout")
    assert isinstance(err.value, InfraError) and err.value.stderr == "Traceback: boom"
    with pytest.raises(VerifiersError, match="gave no answer"):
        parse_answer("{not json", "", 0, "rollout")
    with pytest.raises(VerifiersError, match="failed: the rollout failed: ModelError") as err:
        parse_answer(json.dumps({"ok": False, "error": "the rollout failed: ModelError", "config": False}), "", 0, "x")
    assert not err.value.config
    with pytest.raises(VerifiersError) as err:
        parse_answer(json.dumps({"ok": False, "error": "no eval_dataset", "config": True}), "", 0, "x")
    assert err.value.config


def test_a_result_and_its_counters():
    res = RolloutResult.from_answer(OK)
    assert res.reward == 0.75 and res.rewards == {"a": (1.0, 0.5), "b": (0.5, 0.5)} and res.calls == 1
    assert res.counters() == {"verifiers/reward/a": 1.0, "verifiers/reward/b": 0.5, "verifiers/metric/num_turns": 1.0}
    res = RolloutResult.from_answer({**OK, "metrics": {"inf": math.inf, "ok": 2}})
    assert res.counters()["verifiers/metric/ok"] == 2.0 and "verifiers/metric/inf" not in res.counters()
    for bad in ({**OK, "reward": None}, {**OK, "reward": True}, {**OK, "reward": math.nan},
                {k: v for k, v in OK.items() if k != "rewards"}, {**OK, "rewards": {"a": 1.0}}):
        with pytest.raises(VerifiersError, match="not a result"):
            RolloutResult.from_answer(bad)


def test_a_runner_run_to_its_end(tmp_path):
    python = fake_python(tmp_path, f"print('env noise')\nprint({json.dumps(json.dumps(OK))})\n")
    spec = VerifiersSpec.from_kwargs({"python": python, "environment": "x"})
    assert run_runner(spec, spec.request("score", split="train", index=0), "score")["reward"] == 0.75
    assert json.loads(Path(python + ".req").read_text())["mode"] == "score"

    crash = VerifiersSpec.from_kwargs({"python": fake_python(tmp_path, "sys.stderr.write('boom'); sys.exit(3)\n"),
                                       "environment": "x"})
    with pytest.raises(VerifiersError, match=r"exit 3.*boom"):
        run_runner(crash, crash.request("score"), "score")
    slow = VerifiersSpec.from_kwargs({"python": fake_python(tmp_path, "time.sleep(30)\n"), "environment": "x",
                                      "timeout_s": 0.5})
    with pytest.raises(VerifiersError, match="ran past timeout_s=0.5"):
        run_runner(slow, slow.request("score"), "score")
    missing = VerifiersSpec.from_kwargs({"python": str(tmp_path / "no-such-python"), "environment": "x"})
    with pytest.raises(VerifiersError, match="could not run the verifiers runner.*scripts/hub_venvs.sh"):
        run_runner(missing, missing.request("score"), "score")


def test_task_ids_are_listed_by_the_runner_once_and_a_config_fault_is_a_config_error(tmp_path):
    python = fake_python(tmp_path, "print(json.dumps({'ok': True, 'count': 3}))\n")
    spec = VerifiersSpec.from_kwargs({"python": python, "environment": "listed-once"})
    assert list_task_ids(spec, "train") == ["train/0", "train/1", "train/2"]
    Path(python).write_text(f"#!{sys.executable}\nraise SystemExit(9)\n")  # a second run would fail
    assert list_task_ids(spec, "train") == ["train/0", "train/1", "train/2"]
    capped = VerifiersSpec.from_kwargs({"python": fake_python(tmp_path, "print(json.dumps({'ok': True, 'count': 5}))"),
                                        "environment": "capped", "max_tasks": 2})
    assert list_task_ids(capped, "test") == ["test/0", "test/1"]
    assert json.loads(Path(capped.python + ".req").read_text())["split"] == "test"
    with pytest.raises(ConfigError, match="split='dev'"):
        list_task_ids(capped, "dev")
    broken = VerifiersSpec.from_kwargs({"python": fake_python(tmp_path, "print(json.dumps({'ok': False, 'config': "
                                                                        "True, 'error': 'no eval_dataset'}))"),
                                        "environment": "broken"})
    with pytest.raises(ConfigError, match="no eval_dataset"):
        list_task_ids(broken, "test")
