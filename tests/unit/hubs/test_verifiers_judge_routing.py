"""Where the judges of a verifiers environment go, and what the runner's process inherits
(``agentrl/hubs/verifiers_runner.py``, ``VerifiersSpec.runner_env``).

A v1 judge made by task code (``tests/helpers/verifiers_codejudge.py``: no judge plugged in the
task config) goes to ``env.kwargs.judge`` whatever endpoint it was made with, and without
``judge`` its call fails the episode as an infrastructure error naming it; neither ever reaches
verifiers' default endpoint (Prime's, stood in for by a local server through
``PRIME_INFERENCE_URL``). The runner gets an allowlisted environment: a secret-looking
variable of agentrl's is absent there unless named in ``pass_env``. The runs of the real
runner need the verifiers-0.4.0 hub venv (skipped without it, naming scripts/hub_venvs.sh)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium
import pytest

import agentrl.hubs  # noqa: F401 - registers the hub/ ids
from agentrl.errors import ConfigError
from agentrl.hubs.verifiers_env import ENV_ID
from agentrl.hubs.verifiers_runner import GATEWAY_KEY_VAR, JUDGE_KEY_VAR
from agentrl.hubs.verifiers_spec import RUNNER_ENV_NAMES, VerifiersError, VerifiersSpec, run_runner
from tests.helpers.run_async import run_async
from tests.helpers.verifiers_hub import HELPERS, V1_VENV, hub_python
from tests.unit.hubs.test_verifiers_env import TASK
from tests.unit.hubs.test_verifiers_runner import server
from tests.unit.hubs.test_verifiers_spec import OK, fake_python

SECRETS = {"HF_TOKEN": "hf_secret", "AWS_SECRET_ACCESS_KEY": "aws-secret", "GITHUB_TOKEN": "gh-secret",
           "OPENAI_BASE_URL": "http://elsewhere/v1", "PRIME_API_KEY": "pk-secret"}
DUMP_ENV = "open(__file__ + '.env', 'w').write(json.dumps(dict(os.environ)))\n"


def _codejudge_rollout(policy_url: str, **kwargs: Any) -> dict[str, Any]:
    spec = VerifiersSpec.from_kwargs({"python": hub_python(V1_VENV), "python_path": [HELPERS],
                                      "environment": "verifiers_codejudge", "timeout_s": 180, **kwargs})
    req = spec.request("rollout", split="train", index=0, model="agentrl-policy", max_new_tokens=16,
                       gateway={"base_url": policy_url, "session_id": "s", "api_key": "k"})
    return run_runner(spec, req, "rollout")


@pytest.mark.slow
def test_a_judge_of_task_code_without_a_judge_endpoint_fails_and_reaches_no_default():
    with server("an apple") as (policy_url, policy_calls), server("yes") as (prime_url, prime_calls):
        # the stand-in for Prime's endpoint is handed to the runner on purpose: even where verifiers'
        # default resolves to a live server, the judge's call must not be made
        env = {"PRIME_INFERENCE_URL": prime_url}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            with pytest.raises(VerifiersError, match=r"a verifiers judge \(JudgeConfig: id='', "
                                                     r"model='openai/.*'.*was called; give the adapter a judge") as err:
                _codejudge_rollout(policy_url, pass_env=list(env))
    assert err.value.config and len(policy_calls) == 1 and not prime_calls


@pytest.mark.slow
@pytest.mark.parametrize("own_endpoint", [False, True])
def test_a_judge_of_task_code_goes_to_the_judge_endpoint(monkeypatch, own_endpoint):
    monkeypatch.setenv("AGENTRL_TEST_JUDGE_KEY", "sk-judge")
    with server("an apple") as (policy_url, policy_calls), server("yes") as (prime_url, prime_calls), \
            server("yes") as (judge_url, judged):
        monkeypatch.setenv("PRIME_INFERENCE_URL", prime_url)
        judge = {"base_url": judge_url, "model": "the-judge", "api_key_env": "AGENTRL_TEST_JUDGE_KEY"}
        args = {"judge_url": prime_url} if own_endpoint else {}  # a judge made with an endpoint of its own
        answer = _codejudge_rollout(policy_url, judge=judge, args=args, pass_env=["PRIME_INFERENCE_URL"])
    assert answer["reward"] == 1.0 and len(policy_calls) == 1 and not prime_calls
    (call,) = judged
    assert call["path"] == "/v1/chat/completions" and call["body"]["model"] == "the-judge"
    assert call["headers"]["authorization"] == "Bearer sk-judge"


def test_the_runner_env_is_an_allowlist():
    environ = {"PATH": "/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp/x",
               "MY_JUDGE_KEY": "sk-j", "EXTRA": "e", **SECRETS}
    spec = VerifiersSpec.from_kwargs({"python": "p", "environment": "x", "pass_env": ["EXTRA"],
                                      "judge": {"base_url": "http://j/v1", "model": "m", "api_key_env": "MY_JUDGE_KEY"}})
    assert spec.runner_env(environ) == {"PATH": "/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                                        "TMPDIR": "/tmp/x", "MY_JUDGE_KEY": "sk-j", "EXTRA": "e"}
    bare = VerifiersSpec.from_kwargs({"python": "p", "environment": "x"}).runner_env(environ)
    assert set(bare) == {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"}
    assert not any(("KEY" in n or "TOKEN" in n or "SECRET" in n) for n in RUNNER_ENV_NAMES)
    assert "API_KEY" in GATEWAY_KEY_VAR and "API_KEY" in JUDGE_KEY_VAR  # verifiers' local runtime drops them
    for bad in ("EXTRA", ["A=B"], [""], [3]):
        with pytest.raises(ConfigError, match="pass_env="):
            VerifiersSpec.from_kwargs({"python": "p", "environment": "x", "pass_env": bad})


def test_a_secret_of_the_parent_is_absent_in_the_runner(tmp_path, monkeypatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PASSED_ON", "yes")
    python = fake_python(tmp_path, DUMP_ENV + "print(json.dumps({'ok': True, 'count': 1}))\n")
    spec = VerifiersSpec.from_kwargs({"python": python, "environment": "x", "pass_env": ["PASSED_ON"]})
    run_runner(spec, spec.request("list", split="train"), "list")
    listed = json.loads(Path(python + ".env").read_text())
    assert not set(SECRETS) & set(listed) and listed["PASSED_ON"] == "yes" and "PATH" in listed
    python = fake_python(tmp_path, DUMP_ENV + f"print({json.dumps(json.dumps(OK))})\n")
    env = gymnasium.make(ENV_ID, disable_env_checker=True, python=python, environment="x").unwrapped
    env.set_rollout(None, SimpleNamespace(temperature=1.0, top_p=1.0, top_k=-1), 16)
    run_async(env._run_rollout(TASK, None))  # an episode's runner: the same allowlist
    episode = json.loads(Path(python + ".env").read_text())
    assert not set(SECRETS) & set(episode) and "PASSED_ON" not in episode and "PATH" in episode
