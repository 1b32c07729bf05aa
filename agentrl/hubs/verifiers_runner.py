"""The runner of ``hub/Verifiers-v0``: one process of a hub venv's python (verifiers
installed there, never in agentrl's own venv) that loads a verifiers environment and runs
one thing. Standard library and verifiers only: agentrl is not importable here.

Run as ``<hub python> -I verifiers_runner.py``. The request is the first line of stdin, one
JSON object (``agentrl.hubs.verifiers_spec`` writes it); the answer is one JSON line on the
original stdout (everything the environment prints goes to stderr):
``{"ok": true, ...}`` or ``{"ok": false, "error": str, "config": bool}``. Modes:

* ``list``: ``{"count": n}``, the tasks of ``split`` (``train``: the classic env's
  ``dataset`` or the v1 taskset of ``args``; ``test``: its ``eval_dataset``, or the taskset
  of ``eval_args``), at most ``max_tasks``.
* ``rollout``: one rollout of task ``index`` of ``split`` with its model calls sent to the
  gateway (``gateway``: ``base_url``, ``session_id``, ``api_key``) as ``model``, each tagged
  ``X-Session-ID: <session_id>``. Classic API (0.3.x): ``env.rollout`` with an
  ``AsyncOpenAI`` client on the gateway, then ``env.rubric.score_rollout``. v1 (0.4.x): the
  taskset's own harness through verifiers' interception, the trace's id set to the session
  id (what verifiers sends as ``X-Session-ID``), the task's ``@vf.reward`` methods and
  judges. Answer: ``reward``, ``rewards`` (``{name: {"score", "weight"}}``), ``metrics``,
  ``stop``, ``calls``. stdin reaching EOF (the env closed it, or its process died) cancels it.
* ``score``: the same rollout against a local scripted server that answers the calls with
  ``replies`` (``[{"content", "finish_reason", "completion_tokens"}]``) in order: verifiers'
  own reward for those completions.

A turn cut by the run's token budget ends the episode in agentrl's rollout; the rollout
here stops at that turn too (``turn_was_cut``) and is scored on what it holds.

Failures are never a score: an environment that does not load, a rollout that raised, a
model call the gateway refused, a reward function or judge that raised (verifiers itself
would log it and score 0) all answer ``ok: false``. The model's own empty or invalid reply
(classic ``InvalidModelResponseError``) is scored.

Judges: every judge client verifiers makes goes to ``judge`` (``base_url``, ``model``, the
key from the variable ``api_key_env``), never to verifiers' defaults (OpenAI's for a classic
``JudgeRubric``, Prime's inference endpoint for a v1 ``JudgeConfig``). Classic: every
``JudgeRubric``'s ``judge_client`` and ``judge_model``, wherever it is made. v1: every
``vf.Judge``'s config, plugged (``task.judges``) or made by task code, and every client
verifiers builds from a ``JudgeConfig``. Without ``judge``: an environment whose rubric is
a ``JudgeRubric`` or whose task config plugs judges is refused at load; any other judge call
fails the episode (``config``), naming the judge, before a connection is made.

The runner's own environment is the allowlist of ``VerifiersSpec.runner_env``; the keys it
sets for verifiers (``GATEWAY_KEY_VAR``, ``JUDGE_KEY_VAR``) contain ``API_KEY``, which
verifiers' local runtime leaves out of a harness program's environment.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

GATEWAY_KEY_VAR = "AGENTRL_VERIFIERS_GATEWAY_API_KEY"
JUDGE_KEY_VAR = "AGENTRL_VERIFIERS_JUDGE_API_KEY"
"""Read by verifiers as a judge's key when ``judge.api_key_env`` is not given: unset, so ``EMPTY``."""
_NO_JUDGE = "give the adapter a judge endpoint (env.kwargs.judge: base_url, model, api_key_env)"
TURN_CUT_STOP = "agentrl_turn_cut"
_MODEL_FAULTS = ("InvalidModelResponseError", "EmptyModelResponseError")


class RunnerError(Exception):
    """Why the runner answers ``ok: false``; ``config``: a fault of the environment or its
    arguments (it would fail every time), not of one rollout."""

    def __init__(self, message: str, *, config: bool = False) -> None:
        super().__init__(message)
        self.config = config


def turn_was_cut(finish_reason: Any, max_tokens: Any, completion_tokens: Any, max_new_tokens: int) -> bool:
    """Whether a reply ended the episode in agentrl's rollout: cut (``length``) by the run's
    budget or context, not by the request's own ``max_tokens`` below ``max_new_tokens`` (a
    reply shorter than that cap was cut by the context; one without a token count, by the cap)."""
    if finish_reason != "length":
        return False
    if isinstance(max_tokens, int) and max_tokens < max_new_tokens:
        return isinstance(completion_tokens, int) and completion_tokens < max_tokens
    return True


# --- classic API (verifiers 0.3.x) --------------------------------------------------------

def _classic_env(req: dict[str, Any]) -> Any:
    import verifiers as vf

    try:
        return vf.load_environment(req["environment"], **dict(req.get("args") or {}))
    except Exception as exc:
        raise RunnerError(f"load_environment({req['environment']!r}) failed: {exc}", config=True) from exc


def _classic_dataset(env: Any, split: str) -> Any:
    if split == "test":
        if getattr(env, "eval_dataset", None) is None and getattr(env, "eval_dataset_source", None) is None:
            raise RunnerError("the environment has no eval_dataset, so no 'test' split", config=True)
        return env.get_eval_dataset()
    if getattr(env, "dataset", None) is None and getattr(env, "dataset_source", None) is None:
        raise RunnerError("the environment has no dataset, so no 'train' split", config=True)
    return env.get_dataset()


def _rubrics(rubric: Any) -> list[Any]:
    inner = getattr(rubric, "rubrics", None)
    return [r for sub in inner for r in _rubrics(sub)] if isinstance(inner, list) else [rubric]


def _install_classic_judges(judge: dict[str, Any] | None, refused: list[str]) -> None:
    """Make every ``JudgeRubric`` of this process call ``judge``: its ``judge_client`` and
    ``judge_model`` read the configured ones whatever it was given (class properties, so a
    rubric made anywhere, at any time, is covered). Without ``judge``, its client refuses
    each call (recorded in ``refused``)."""
    from openai import AsyncOpenAI
    from verifiers.legacy.rubrics.judge_rubric import JudgeRubric

    clients: list[Any] = []

    def client(rubric: Any) -> Any:
        if judge is None:
            async def refuse(*args: Any, **kwargs: Any) -> Any:
                message = (f"a JudgeRubric ({type(rubric).__name__}, judge_model="
                           f"{rubric.__dict__.get('_agentrl_judge_model')!r}) called its judge; {_NO_JUDGE}")
                refused.append(message)
                raise RunnerError(message, config=True)
            return SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=refuse)))
        if not clients:
            clients.append(AsyncOpenAI(base_url=judge["base_url"], api_key=_judge_key(judge), max_retries=0))
        return clients[0]

    def model(rubric: Any) -> Any:
        return judge["model"] if judge is not None else rubric.__dict__.get("_agentrl_judge_model")

    JudgeRubric.judge_client = property(client, lambda rubric, value: None)
    JudgeRubric.judge_model = property(model, lambda rubric, value: rubric.__dict__.update(_agentrl_judge_model=value))


def _refuse_classic_judges(env: Any, judge: dict[str, Any] | None) -> None:
    """Refuse an environment whose rubric has a ``JudgeRubric`` when no ``judge`` is given."""
    from verifiers.legacy.rubrics.judge_rubric import JudgeRubric

    for rubric in _rubrics(env.rubric):
        if isinstance(rubric, JudgeRubric) and judge is None:
            raise RunnerError(f"the environment scores with a JudgeRubric (judge_model={rubric.judge_model!r}); "
                              + _NO_JUDGE, config=True)


def _wrap_reward_funcs(env: Any, failures: list[str]) -> None:
    """Record a reward function's exception (the rubric logs it and scores 0)."""
    for rubric in _rubrics(env.rubric):
        if getattr(rubric, "has_group_rewards", False):
            raise RunnerError("the rubric has group reward functions (scored over a group of rollouts); one "
                              "rollout per episode cannot score them", config=True)

        def wrap(fn: Any) -> Any:
            @functools.wraps(fn)
            async def recorded(*args: Any, **kwargs: Any) -> Any:
                try:
                    value = fn(*args, **kwargs)
                    return await value if inspect.isawaitable(value) else value
                except Exception as exc:
                    failures.append(f"reward function {getattr(fn, '__name__', fn)!r} raised "
                                    f"{type(exc).__name__}: {exc}")
                    raise
            return recorded

        rubric.funcs = [wrap(f) for f in rubric.funcs]


async def _classic_rollout(req: dict[str, Any], base_url: str, session_id: str, api_key: str) -> dict[str, Any]:
    from openai import AsyncOpenAI
    from verifiers.legacy.clients import OpenAIChatCompletionsClient

    refused: list[str] = []
    _install_classic_judges(req.get("judge"), refused)
    env = _classic_env(req)
    _refuse_classic_judges(env, req.get("judge"))
    failures: list[str] = []
    _wrap_reward_funcs(env, failures)
    dataset = _classic_dataset(env, req["split"])
    index = req["index"]
    if not 0 <= index < len(dataset):
        raise RunnerError(f"task index {index} is outside the {req['split']!r} split ({len(dataset)} rows)",
                          config=True)
    sampling = {**dict(getattr(env, "sampling_args", None) or {}), **dict(req.get("sampling") or {})}
    max_new = int(req["max_new_tokens"])

    async def agentrl_turn_cut(state: Any) -> bool:
        steps = state.get("trajectory") or []
        if not steps:
            return False
        response = steps[-1].get("response")
        message, usage = getattr(response, "message", None), getattr(response, "usage", None)
        cap = sampling.get("max_tokens", sampling.get("max_completion_tokens"))
        return turn_was_cut(getattr(message, "finish_reason", None), cap,
                            getattr(usage, "completion_tokens", None), max_new)

    env._stop_conditions.append(agentrl_turn_cut)
    # no retries (a refused call is the episode's end) and no read limit of the SDK's own: the env's
    # watchdog (rollout.env_timeout_s) bounds a silent turn
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=None,
                                                     default_headers={"X-Session-ID": session_id}))
    state = await env.rollout(dict(dataset[index]), client, req["model"], sampling)
    error = state.get("error")
    if error is not None and not any(c.__name__ in _MODEL_FAULTS for c in type(error).__mro__):
        cause = error.__cause__ or error.__context__
        raise RunnerError(f"the rollout failed: {type(error).__name__}: {error}"
                          + (f" ({type(cause).__name__}: {cause})" if cause else ""))
    await env.rubric.score_rollout(state)
    await env.rubric.cleanup(state)
    if refused:
        raise RunnerError(refused[0], config=True)
    if failures:
        raise RunnerError("; ".join(failures))
    names, weights = env.rubric._get_reward_func_names(), env.rubric._get_reward_weights()
    metrics = {str(k): float(v) for k, v in (state.get("metrics") or {}).items() if v is not None}
    rewards = {n: {"score": metrics[n], "weight": float(w)} for n, w in zip(names, weights) if w and n in metrics}
    return {"reward": float(state["reward"]), "rewards": rewards,
            "metrics": {k: v for k, v in metrics.items() if k not in rewards},
            "stop": state.get("stop_condition"), "calls": len(state.get("trajectory") or [])}


def _classic_count(req: dict[str, Any]) -> int:
    return len(_classic_dataset(_classic_env(req), req["split"]))


# --- v1 API (verifiers 0.4.x) -------------------------------------------------------------

def _v1_env_config(req: dict[str, Any]) -> dict[str, Any]:
    args = dict((req.get("eval_args") if req["split"] == "test" else req.get("args")) or {})
    if req["split"] == "test" and req.get("eval_args") is None:
        raise RunnerError("a v1 taskset has no 'test' split of its own; give eval_args (the taskset config of the "
                          "held-out tasks)", config=True)
    task = dict(args.pop("task", None) or {})
    judges = list(task.get("judges") or [])
    if judges:
        judge = req.get("judge")
        if judge is None:
            raise RunnerError(f"the taskset plugs judges {[j.get('id') for j in judges]}; {_NO_JUDGE}", config=True)
        task["judges"] = [{**j, "base_url": judge["base_url"], "model": judge["model"],
                           "api_key_var": judge.get("api_key_env") or JUDGE_KEY_VAR} for j in judges]
    if req["mode"] != "list":
        task["stops"] = {**dict(task.get("stops") or {}), TURN_CUT_STOP: {"fn": f"{__name__}:{TURN_CUT_STOP}"}}
    agent: dict[str, Any] = {"runtime": req.get("runtime") or {"type": "subprocess"}}
    if req.get("harness"):
        agent["harness"] = req["harness"]
    return {"taskset": {**args, "id": req["environment"], "task": task}, "agent": agent}


def _v1_env(req: dict[str, Any]) -> Any:
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    try:
        return load_environment(resolve_env_config(_v1_env_config(req)))
    except RunnerError:
        raise
    except Exception as exc:
        raise RunnerError(f"taskset {req['environment']!r} did not load: {type(exc).__name__}: {exc}",
                          config=True) from exc


def _v1_count(req: dict[str, Any]) -> int:
    taskset, cap = _v1_env(req).taskset, req.get("max_tasks")
    if cap is None and not taskset.bounded:
        raise RunnerError(f"taskset {req['environment']!r} is infinite; give max_tasks", config=True)
    return sum(1 for _ in (taskset.take(cap) if cap is not None else taskset))


def _install_v1_turn_cut(max_new: int) -> None:
    from verifiers.v1 import Trace

    def agentrl_turn_cut(trace: Any) -> bool:
        call = trace.calls[-1] if trace.calls else None
        if call is None or call.error is not None:
            return False
        cap = call.sampling.max_tokens if call.sampling is not None else None
        out = call.usage.output_tokens if call.usage is not None else None
        return turn_was_cut(call.finish_reason, cap, out, max_new)

    # verifiers picks a stop's boundary by its annotation, read with get_type_hints: the class itself
    agentrl_turn_cut.__annotations__ = {"trace": Trace, "return": bool}
    setattr(sys.modules[__name__], TURN_CUT_STOP, agentrl_turn_cut)


def _install_v1_judges(judge: dict[str, Any] | None, refused: list[str]) -> None:
    """Point every judge verifiers v1 can make at ``judge``. ``vf.Judge.config`` becomes a
    property whose setter rewrites the config (plugged judges and judges made by task code
    alike) to ``judge``'s ``base_url``, ``model`` and key variable, its headers dropped; a
    judge whose default endpoint is a path under Prime's inference URL (the decision judge's
    ``/evaluations``) gets that path under ``judge.base_url``. ``build_async_openai``, in every
    verifiers module that holds it, builds a ``JudgeConfig``'s client from the rewritten
    config. Without ``judge``, building one raises (recorded in ``refused``): no judge call
    reaches verifiers' default endpoint."""
    from verifiers.v1 import judge as judge_module
    from verifiers.v1.clients import base
    from verifiers.v1.configs.client import DEFAULT_PRIME_INFERENCE_URL
    from verifiers.v1.configs.judge import JudgeConfig

    def repoint(config: Any) -> Any:
        if judge is None or not isinstance(config, JudgeConfig):
            return config
        default = type(config).model_fields["base_url"].default
        path = default[len(DEFAULT_PRIME_INFERENCE_URL):] if isinstance(default, str) and default.startswith(
            DEFAULT_PRIME_INFERENCE_URL + "/") else ""
        return config.model_copy(update={"base_url": judge["base_url"].rstrip("/") + path if path else
                                         judge["base_url"], "model": judge["model"], "headers": {},
                                         "headers_from_env": {},
                                         "api_key_var": judge.get("api_key_env") or JUDGE_KEY_VAR})

    original = base.build_async_openai

    def build_async_openai(config: Any) -> Any:
        if isinstance(config, JudgeConfig):
            if judge is None:
                message = (f"a verifiers judge ({type(config).__name__}: id={config.id!r}, model={config.model!r}, "
                           f"base_url={config.base_url!r}) was called; {_NO_JUDGE}")
                refused.append(message)
                raise RunnerError(message, config=True)
            _judge_key(judge)
            config = repoint(config)
        return original(config)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("verifiers.") and \
                getattr(module, "build_async_openai", None) is original:
            module.build_async_openai = build_async_openai
    judge_module.Judge.config = property(lambda j: j.__dict__["_agentrl_config"],
                                         lambda j, config: j.__dict__.update(_agentrl_config=repoint(config)))


async def _v1_rollout(req: dict[str, Any], base_url: str, session_id: str, api_key: str) -> dict[str, Any]:
    import verifiers.v1 as vf

    _install_v1_turn_cut(int(req["max_new_tokens"]))
    refused: list[str] = []
    _install_v1_judges(req.get("judge"), refused)
    env = _v1_env(req)
    index = req["index"]
    task = next(iter(env.taskset.skip(index).take(1)), None)
    if task is None:
        raise RunnerError(f"task index {index} is outside the {req['split']!r} tasks", config=True)
    os.environ[GATEWAY_KEY_VAR] = api_key
    client = vf.EvalClientConfig(base_url=base_url, api_key_var=GATEWAY_KEY_VAR)
    ctx = vf.ModelContext(model=req["model"], client=client,
                          sampling=vf.SamplingConfig(**dict(req.get("sampling") or {})))

    def on_trace(trace: Any) -> None:
        trace.id = session_id  # verifiers sends the trace id as X-Session-ID: the gateway session's

    async with env.serving():
        episode = await env.run_episode(task, ctx, on_trace=on_trace)
    if refused:
        raise RunnerError(refused[0], config=True)
    problems = [f"{e.type}: {e.message}" for e in episode.errors] + [
        f"{e.type}: {e.message}" for t in episode.traces for e in t.errors]
    if problems or not episode.ok:
        raise RunnerError("the episode failed: " + ("; ".join(problems) or "verifiers marked it not ok"))
    if len(episode.traces) != 1:
        raise RunnerError(f"the episode has {len(episode.traces)} agent traces; hub/Verifiers-v0 trains single-agent "
                          "environments", config=True)
    trace = episode.traces[0]
    unscored = [k for k, v in {**trace.rewards, **trace.metrics}.items() if v is None]
    if unscored:
        raise RunnerError(f"scoring did not run for {unscored}")
    return {"reward": float(trace.reward),
            "rewards": {k: {"score": v.score, "weight": v.weight} for k, v in trace.rewards.items()},
            "metrics": {k: float(v) for k, v in trace.metrics.items()},
            "stop": trace.stop_condition, "calls": len(trace.calls)}


# --- the modes ----------------------------------------------------------------------------

def _judge_key(judge: dict[str, Any]) -> str:
    var = judge.get("api_key_env")
    key = os.environ.get(var) if var else "EMPTY"
    if not key:
        raise RunnerError(f"judge.api_key_env={var!r} names a variable that is not set", config=True)
    return key


def _api(req: dict[str, Any]) -> str:
    if req.get("api") in ("classic", "v1"):
        return req["api"]
    if importlib.util.find_spec("verifiers.legacy") is None:
        return "v1"
    name = req["environment"].replace("-", "_").split("/")[-1]
    try:
        module = importlib.import_module(name)
    except ImportError:
        return "v1"
    return "classic" if callable(getattr(module, "load_environment", None)) else "v1"


class _Scripted(BaseHTTPRequestHandler):
    """Answers each chat call with the next scripted reply (``score`` mode); 409 past the last."""

    replies: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.lock:
            reply = type(self).replies.pop(0) if type(self).replies else None
        if reply is None:
            body, status = {"error": {"message": "no scripted reply left", "type": "conflict"}}, 409
        else:
            n = int(reply.get("completion_tokens") or 0)
            body, status = {"id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": "scripted",
                            "choices": [{"index": 0, "finish_reason": reply.get("finish_reason") or "stop",
                                         "logprobs": None,
                                         "message": {"role": "assistant", "content": reply.get("content") or ""}}],
                            "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}}, 200
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


async def _run(req: dict[str, Any]) -> dict[str, Any]:
    mode, api = req["mode"], _api(req)
    if mode == "list":
        return {"api": api, "count": _classic_count(req) if api == "classic" else _v1_count(req)}
    rollout = _classic_rollout if api == "classic" else _v1_rollout
    if mode == "rollout":
        gw = req["gateway"]
        return {"api": api, **await rollout(req, gw["base_url"], gw["session_id"], gw["api_key"])}
    if mode != "score":
        raise RunnerError(f"mode={mode!r}; expected list, rollout or score", config=True)
    handler = type("Scripted", (_Scripted,), {"replies": list(req.get("replies") or [])})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        return {"api": api, **await rollout(req, url, "scored", "scripted")}
    finally:
        server.shutdown()


async def _main_async(req: dict[str, Any]) -> dict[str, Any]:
    task = asyncio.ensure_future(_run(req))
    if req.get("lifeline"):
        loop = asyncio.get_running_loop()

        def watch() -> None:  # stdin's EOF: the env closed it or its process died
            sys.stdin.read()
            loop.call_soon_threadsafe(task.cancel)

        threading.Thread(target=watch, daemon=True).start()
    return await task


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # agentrl/hubs shadows packages
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the environment prints goes to stderr; the answer alone to the saved stdout
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for var, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("OPENAI_API_KEY", "EMPTY")):
        os.environ.setdefault(var, value)
    try:
        req = json.loads(sys.stdin.readline())
        sys.path[:0] = [str(p) for p in req.get("python_path") or ()]
        answer: dict[str, Any] = {"ok": True, **asyncio.run(_main_async(req))}
    except RunnerError as exc:
        answer = {"ok": False, "error": str(exc), "config": exc.config}
    except asyncio.CancelledError:
        answer = {"ok": False, "error": "cancelled: stdin closed", "config": False}
    except Exception as exc:
        traceback.print_exc()
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "config": False}
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
