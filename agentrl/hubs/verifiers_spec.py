"""What ``hub/Verifiers-v0`` runs and how it talks to its runner: the env kwargs checked into
a ``VerifiersSpec``, the task ids, the request line the runner reads, its answer parsed
(``RolloutResult``), and a runner run to its end (``run_runner``: listing the tasks, scoring
given completions). The runner itself is ``agentrl/hubs/verifiers_runner.py``, run by the hub
venv's python with an allowlisted environment (``VerifiersSpec.runner_env``); nothing here
imports verifiers.

Every runner failure is an infrastructure error (``VerifiersError``), never a score; one the
runner marks ``config`` (the environment does not load, an index past its tasks, a judge
missing) is a ``ConfigError`` where a configuration is being checked (listing tasks).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from agentrl.errors import ConfigError, InfraError

RUNNER = str(Path(__file__).resolve().with_name("verifiers_runner.py"))
"""The runner script, run as ``<python> -I RUNNER``."""
SPLITS = ("train", "test")
APIS = ("auto", "classic", "v1")
COUNTER_PREFIX = "verifiers/"
_TASK_ID = re.compile(r"^(train|test)/(0|[1-9][0-9]*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEYS = ("api_key", "key", "token", "secret", "password", "authorization")
_STDERR_TAIL_CHARS = 3000
RUNNER_ENV_NAMES = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TMP", "TEMP",
                    "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "UV_CACHE_DIR")
"""The variables of agentrl's environment the runner gets (with every ``LC_*``, the judge key's
variable and ``pass_env``): the locale, temporary and cache directories, nothing that holds a
secret. The gateway's address and the session's key travel in the request, not the
environment."""
RUNNER_ENV_PREFIXES = ("LC_",)


class VerifiersError(InfraError):
    """The verifiers runner failed: it did not start, crashed, answered off-protocol, or
    reported a failed load, rollout, reward function or judge. Never the model's fault; the
    episode ends with ``infra_error``. ``stderr``: the tail of what the runner printed."""

    def __init__(self, message: str, *, stderr: str = "", config: bool = False) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.config = config


def _json_dict(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}={value!r} must be a dict")
    try:
        return json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must hold JSON values only ({exc})") from None


def _judge(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    judge = _json_dict("judge", value)
    for key in judge:
        if key.lower() in _SECRET_KEYS:
            raise ConfigError(f"judge.{key}: a key does not belong in the config; name its variable in "
                              "judge.api_key_env")
    unknown = sorted(set(judge) - {"base_url", "model", "api_key_env"})
    if unknown:
        raise ConfigError(f"judge has keys {unknown}; expected base_url, model and api_key_env")
    url, model, var = judge.get("base_url"), judge.get("model"), judge.get("api_key_env")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"judge.base_url={url!r}; expected the judge server's http(s) OpenAI base URL")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"judge.model={model!r}; expected the model name the judge server serves")
    if var is not None and not (isinstance(var, str) and _ENV_NAME.match(var)):
        raise ConfigError("judge.api_key_env: expected the NAME of an environment variable (not shown: it may "
                          "be a key)")
    return {"base_url": url, "model": model, "api_key_env": var}


@dataclass(frozen=True)
class VerifiersSpec:
    """The env kwargs of ``hub/Verifiers-v0`` (docs/hubs/verifiers.md), checked.

    Attributes:
        python: the hub venv's python, where verifiers and the environment are installed
            (``~`` expanded). Never agentrl's own venv: verifiers pins another ``openai``.
        environment: the classic environment id (``load_environment``'s module) or the v1
            taskset id (an installed package exporting a ``Taskset``).
        api: ``classic`` (0.3.x), ``v1`` (0.4.x) or ``auto`` (the environment's module
            defines ``load_environment``: classic).
        args: classic: ``load_environment``'s kwargs; v1: the taskset config (``task``
            included) of the ``train`` split.
        eval_args: v1: the taskset config of the ``test`` split (None: no test split); the
            classic ``test`` split is the environment's ``eval_dataset``.
        harness, runtime: v1: the agent's harness config (None: the taskset's own) and
            runtime (None: ``{"type": "subprocess"}``, a local process).
        sampling: classic ``sampling_args`` / v1 sampling merged into every model call (e.g.
            ``max_tokens``); the run's temperature, top_p and top_k are the gateway's.
        judge: the endpoint every judge of the environment calls (a classic
            ``JudgeRubric``, a v1 ``vf.Judge`` plugged or made by task code): ``base_url``,
            ``model``, ``api_key_env`` (the key's variable, passed to the runner). None: an
            environment with a ``JudgeRubric`` or plugged judges is refused; any other judge
            call fails its episode.
        python_path: directories put first on the runner's ``sys.path`` (environment modules
            that are not installed), made absolute.
        pass_env: names of variables of agentrl's environment the runner also gets (e.g. a key
            the environment's own code reads, ``HTTPS_PROXY``); everything else is left out
            (``runner_env``).
        max_tasks: at most this many tasks per split (needed for an infinite v1 taskset).
        timeout_s: seconds a listing or scoring run may take.

    Raises:
        ConfigError: a missing or malformed value, naming it.
    """

    python: str
    environment: str
    api: str = "auto"
    args: dict[str, Any] = field(default_factory=dict)
    eval_args: dict[str, Any] | None = None
    harness: dict[str, Any] | None = None
    runtime: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    judge: dict[str, Any] | None = None
    python_path: tuple[str, ...] = ()
    pass_env: tuple[str, ...] = ()
    max_tasks: int | None = None
    timeout_s: float = 600.0

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any] | None) -> VerifiersSpec:
        """The spec of ``kwargs`` (the env's own kwargs, ``sandbox`` and ``split`` left out)."""
        kw = dict(kwargs or {})
        unknown = sorted(set(kw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"hub/Verifiers-v0 got unknown kwargs {unknown}; expected some of "
                              f"{sorted(cls.__dataclass_fields__)}")
        python, env = kw.get("python"), kw.get("environment")
        if not isinstance(python, str) or not python:
            raise ConfigError(f"python={python!r}; expected the hub venv's python (scripts/hub_venvs.sh makes "
                              "~/.cache/agentrl/hub-venvs/verifiers-0.4.0/bin/python)")
        if not isinstance(env, str) or not env:
            raise ConfigError(f"environment={env!r}; expected a verifiers environment or taskset id")
        api = kw.get("api", "auto")
        if api not in APIS:
            raise ConfigError(f"api={api!r} is not one of {APIS}")
        opt = {name: None if kw.get(name) is None else _json_dict(name, kw[name])
               for name in ("eval_args", "harness", "runtime")}
        paths = kw.get("python_path") or ()
        if isinstance(paths, str) or not all(isinstance(p, str) and p for p in paths):
            raise ConfigError(f"python_path={paths!r}; expected a list of directories")
        pass_env = kw.get("pass_env") or ()
        if isinstance(pass_env, str) or not all(isinstance(n, str) and _ENV_NAME.match(n) for n in pass_env):
            raise ConfigError(f"pass_env={pass_env!r}; expected a list of environment variable names")
        max_tasks, timeout_s = kw.get("max_tasks"), kw.get("timeout_s", 600.0)
        if max_tasks is not None and (isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1):
            raise ConfigError(f"max_tasks={max_tasks!r} must be None or an int >= 1")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(f"timeout_s={timeout_s!r} must be a number of seconds > 0")
        return cls(python=os.path.expanduser(python), environment=env, api=api,
                   args=_json_dict("args", kw.get("args") or {}), sampling=_json_dict("sampling", kw.get("sampling")
                                                                                      or {}),
                   judge=_judge(kw.get("judge")), python_path=tuple(os.path.abspath(os.path.expanduser(p))
                                                                    for p in paths),
                   pass_env=tuple(pass_env), max_tasks=max_tasks, timeout_s=float(timeout_s), **opt)

    def key(self) -> str:
        """The spec as one JSON string (equal specs, equal keys)."""
        return json.dumps({k: getattr(self, k) for k in self.__dataclass_fields__}, sort_keys=True)

    def request(self, mode: str, **extra: Any) -> str:
        """The runner's request line (module docstring of the runner) for ``mode``, with
        ``extra`` (``split``, ``index``, ``gateway``, ``model``, ``max_new_tokens``,
        ``replies``, ``lifeline``)."""
        body = {"mode": mode, "environment": self.environment, "api": self.api, "args": self.args,
                "eval_args": self.eval_args, "harness": self.harness, "runtime": self.runtime,
                "sampling": self.sampling, "judge": self.judge, "python_path": list(self.python_path),
                "max_tasks": self.max_tasks, **extra}
        return json.dumps(body) + "\n"

    def argv(self) -> list[str]:
        """The runner's command line: the hub python, isolated (``-I``: no user site, no
        ``PYTHON*`` variables, not the script's directory on ``sys.path``)."""
        return [self.python, "-I", RUNNER]

    def runner_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The runner's environment: of ``environ`` (default ``os.environ``), only
        ``RUNNER_ENV_NAMES``, ``LC_*``, the judge key's variable (``judge.api_key_env``) and
        ``pass_env``, those that are set. A v1 harness's default runtime (a local process)
        inherits it, so tokens and cloud keys of agentrl's environment never reach
        environment code unless named here."""
        source = os.environ if environ is None else environ
        names = set(RUNNER_ENV_NAMES) | set(self.pass_env)
        if self.judge is not None and self.judge.get("api_key_env"):
            names.add(self.judge["api_key_env"])
        return {k: v for k, v in source.items() if k in names or k.startswith(RUNNER_ENV_PREFIXES)}


def task_id(split: str, index: int) -> str:
    """``<split>/<index>``: row ``index`` of the classic split's dataset, or the taskset's
    ``index``-th task."""
    return f"{split}/{index}"


def parse_task_id(value: Any) -> tuple[str, int]:
    """``(split, index)`` of a task id. Raises ConfigError for any other value."""
    m = _TASK_ID.match(value) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"task_id={value!r} is not a hub/Verifiers-v0 task id; expected '<train|test>/<index>'")
    return m.group(1), int(m.group(2))


@dataclass(frozen=True)
class RolloutResult:
    """What one rollout (or scoring) returned.

    Attributes:
        reward: verifiers' reward: the weighted sum of ``rewards`` (classic: the rubric's).
        rewards: ``{name: (score, weight)}`` per reward function / ``@vf.reward`` method.
        metrics: ``{name: value}`` of the metrics (weight-0 functions, ``@vf.metric``).
        stop: why verifiers' rollout stopped (its stop condition), or None.
        calls: the model calls it made.
        api: ``classic`` or ``v1``.
    """

    reward: float
    rewards: dict[str, tuple[float, float]]
    metrics: dict[str, float]
    stop: str | None = None
    calls: int = 0
    api: str = ""

    def counters(self) -> dict[str, float]:
        """``verifiers/reward/<name>`` (each reward's score, unweighted) and
        ``verifiers/metric/<name>``, finite values only (``StepInfo.counters``)."""
        out = {f"{COUNTER_PREFIX}reward/{k}": s for k, (s, _) in self.rewards.items() if math.isfinite(s)}
        out.update({f"{COUNTER_PREFIX}metric/{k}": v for k, v in self.metrics.items() if math.isfinite(v)})
        return out

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> RolloutResult:
        """Read a runner's ``ok`` answer. Raises VerifiersError when it is malformed."""
        try:
            reward = answer["reward"]
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise ValueError(f"reward={reward!r} is not a finite number")
            rewards = {str(k): (float(v["score"]), float(v["weight"])) for k, v in dict(answer["rewards"]).items()}
            metrics = {str(k): float(v) for k, v in dict(answer.get("metrics") or {}).items()}
            stop = answer.get("stop")
            return cls(float(reward), rewards, metrics, None if stop is None else str(stop),
                       int(answer.get("calls") or 0), str(answer.get("api") or ""))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise VerifiersError(f"the verifiers runner answered {json.dumps(answer)[:300]}, not a result: "
                                 f"{type(exc).__name__}: {exc}") from None


def parse_answer(stdout: str, stderr: str, returncode: int | None, what: str) -> dict[str, Any]:
    """The runner's ``ok`` answer (its last stdout line, JSON) for ``what`` (e.g.
    ``"rollout of task 'train/3'"``).

    Raises:
        VerifiersError: no answer, not JSON, or ``ok: false`` (``config`` copied); the
            message holds the runner's error, its exit code, and its stderr tail.
    """
    tail = stderr[-_STDERR_TAIL_CHARS:].strip()
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        raise VerifiersError(f"the verifiers runner's {what} gave no answer (exit {returncode}); stderr: {tail!r}",
                             stderr=tail)
    if not answer["ok"]:
        config = bool(answer.get("config"))
        raise VerifiersError(f"the verifiers runner's {what} failed: {answer.get('error')}"
                             + ("" if config else f"; stderr: {tail[-1000:]!r}"), stderr=tail, config=config)
    return answer


def run_runner(spec: VerifiersSpec, request: str, what: str) -> dict[str, Any]:
    """Run the runner on ``request`` to its end (at most ``spec.timeout_s``, with
    ``spec.runner_env()``) and return its ``ok`` answer.

    Raises:
        VerifiersError: the python could not start, the run timed out, or ``parse_answer``'s.
    """
    try:
        res = subprocess.run(spec.argv(), input=request, capture_output=True, text=True, timeout=spec.timeout_s,
                             env=spec.runner_env(), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise VerifiersError(f"the verifiers runner's {what} ran past timeout_s={spec.timeout_s:g}",
                             stderr=err[-_STDERR_TAIL_CHARS:]) from None
    except OSError as exc:
        raise VerifiersError(f"python={spec.python!r} could not run the verifiers runner ({exc}); make the hub venv "
                             "with scripts/hub_venvs.sh") from None
    return parse_answer(res.stdout, res.stderr, res.returncode, what)


@functools.lru_cache(maxsize=64)
def _count(spec_key: str, split: str) -> int:
    spec = VerifiersSpec.from_kwargs(json.loads(spec_key))
    answer = run_runner(spec, spec.request("list", split=split), f"task list of {spec.environment!r}")
    count = answer.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise VerifiersError(f"the verifiers runner listed count={count!r} tasks; expected an int >= 0")
    return count


def list_task_ids(spec: VerifiersSpec, split: str) -> list[str]:
    """The task ids of ``split`` (``train`` or ``test``), at most ``max_tasks``, from a
    runner run (once per spec and split in a process).

    Raises:
        ConfigError: an unknown split; the environment does not load or has no such split.
        VerifiersError: the runner failed otherwise.
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}; hub/Verifiers-v0 has splits {SPLITS}")
    try:
        n = _count(spec.key(), split)
    except VerifiersError as exc:
        if exc.config:
            raise ConfigError(str(exc)) from None
        raise
    n = n if spec.max_tasks is None else min(n, spec.max_tasks)
    return [task_id(split, i) for i in range(n)]
