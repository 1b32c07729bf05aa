"""``agentrl eval``: a policy on a held-out split, with a fixed sampling budget, through the
normal rollout path (Ray, vLLM engines, sandboxes), scored with unbiased pass@k.

What is evaluated (``resolve_target``), each with its policy version:

- a run directory (``config.yaml``): its latest complete checkpoint;
- a checkpoint directory (``RUN/checkpoints/iter_N``);
- a folder ``agentrl export`` wrote (its marker names the policy version);
- a local Hugging Face model folder or a known model name (``agentrl models prepare``):
  the untrained policy, version 0.

A path that does not exist is a ``ConfigError`` naming it (hub ids are not fetched here).
A checkpoint is first written as a Hugging Face folder with ``agentrl export``'s checked path
(``agentrl.commands.export``) into ``RUN/eval/model-iter_N`` (kept: the next eval of that
checkpoint reuses it), and the engines load that folder.

The configuration (``eval_config``): the run's own config (env kwargs, engines, sandboxes)
or, for a bare model, the packaged default (on another env than the packaged default's: the
built-in defaults, since its settings are tuned for its env), with the ``eval`` section's fixed budget put in
place of the rollout's (``eval.temperature`` with top_p 1 / top_k off, ``eval.max_turns``,
``eval.max_new_tokens``, ``eval.max_context_tokens``) and ``env.group_size = eval.samples``.
``budget_source`` says in words which config's section that was; ``evaluate`` reports it
with the settings before any export or rollout.
The env is made with its declared judge kwargs over ``env.kwargs`` (``agentrl.driver.judge``:
e.g. HumanEval trained on the visible examples is judged on the full hidden check), in
``agentrl eval`` and ``eval.every`` alike; the report names the judge. With ``eval.judge`` set
(the run's, or an override) an LLM judge scores the episodes too, combined with that rule as
``reward.combine`` says: ``evaluate`` starts its service (``agentrl-judge-eval-<eval run
id>``, health-checked) before the engines and stops it after the rollout; the training
reward's judge (``reward.judge``) is never the eval's unless named as ``eval.judge`` too,
which is allowed with a warning (``agentrl.driver.judge.warn_same_judge``).

Held out: the eval tasks must not overlap the training tasks (the run's ``env.split`` /
``env.task_ids`` on the same env; for a bare model the env's ``train`` split) unless
``allow_overlap``; else a ``ConfigError`` names the overlap.

Requests (``eval_requests``): the split's tasks (the first ``eval.num_tasks`` in listed
order, or all), each once, ``eval.samples`` rollouts each, from a ``TaskSource`` seeded
with ``eval.seed`` (so env instances and sampling seeds are fixed by the seed). An episode
that errors (infrastructure, reward function, engine lost) is excluded from n, never
counted as a failure (``agentrl.eval.passk``).

Storage: the episodes go to the replay store (the run's, or ``runs/eval/replay.db`` for a
bare model; ``replay_url`` overrides) under their own run id (``eval_run_id``:
deterministic from what was evaluated, version, env, split, samples and seed, ending in a
short hash of ``eval_identity``: the resolved target path and every eval setting the
episodes or numbers depend on), iteration 0, marked ``kind='eval'``, with the report's
metrics (``eval/*``); the run row's config records the target, the policy version, the eval
settings and that identity. An evaluation repeated with the same identity replaces its
earlier rows; a stored run of that id with another identity is refused
(``check_replaceable``), never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from agentrl.cluster.actors.actor_errors import as_cluster_error
from agentrl.cluster.actors.judge_service import start_judge_service, stop_judge_service
from agentrl.cluster.actors.ray_connect import connect
from agentrl.cluster.actors.sandbox_choice import announce_sandboxes
from agentrl.cluster.actors.sandbox_host import start_sandbox_hosts, stop_sandbox_hosts
from agentrl.cluster.engines.pool import EnginePool
from agentrl.cluster.engines.progress import EpisodeProgress
from agentrl.commands.export import EXPORT_MARKER, TRAINER_DIR, export_run, prepare_export, resolve_checkpoint
from agentrl.config import DEFAULT_CONFIG_RESOURCE, Config, config_from_dict, load_config, load_default_config
from agentrl.driver.checkpoint import CONTROLLER_STATE, RunDir
from agentrl.driver.evaluation import eval_budget, eval_report, eval_requests, held_out_task_ids, store_eval_episodes
from agentrl.driver.judge import eval_llm_judge, judge_env_kwargs, judge_label, judge_name, warn_same_judge
from agentrl.errors import ConfigError, ContractError
from agentrl.eval.passk import EvalReport
from agentrl.logs import LOG_FILE_NAME, attach_log_file
from agentrl.model_zoo import KNOWN_MODELS, resolve_model_path
from agentrl.replay import ReplayStore
from agentrl.types import Episode
from sandboxes import reap_orphans

log = logging.getLogger(__name__)

__all__ = ["EvalResult", "EvalTarget", "TrainingEval", "budget_source", "check_replaceable", "eval_budget", "eval_config",
           "eval_report", "eval_identity", "eval_requests", "eval_run_id", "evaluate", "held_out_task_ids",
           "resolve_target"]

BUDGET_KEYS = {"eval": ("eval.temperature", "eval.max_turns", "eval.max_new_tokens", "eval.max_context_tokens",
                        "rollout.max_context_tokens"),
               "rollout": ("rollout.temperature", "rollout.max_turns", "rollout.max_new_tokens",
                           "rollout.max_context_tokens")}
"""Per section, the overrides that change its sampling budget (``budget_source`` names them;
``eval.max_context_tokens`` None follows ``rollout.max_context_tokens``)."""


@dataclass(frozen=True)
class EvalTarget:
    """What ``agentrl eval`` evaluates.

    Attributes:
        kind: ``run``, ``checkpoint``, ``export`` or ``model``.
        given: the argument as the user wrote it.
        name: a short name for ids (the training run id, or the model folder's name).
        policy_version: the weights' version (0 for a bare model).
        model: what the engines load: a model folder or a known model name (for a
            checkpoint: None until ``materialize`` wrote its folder).
        run_dir, checkpoint: the run and checkpoint it comes from (None for a bare model).
    """

    kind: str
    given: str
    name: str
    policy_version: int
    model: str | None
    run_dir: Path | None = None
    checkpoint: Path | None = None


def _policy_version(ckpt: Path) -> tuple[int, str]:
    state = json.loads((ckpt / CONTROLLER_STATE).read_text())
    return int(state["policy_version"]), str(state["run_id"])


def resolve_target(given: str) -> EvalTarget:
    """Classify ``given`` (module docstring) without loading anything heavy.

    Raises:
        ConfigError: a path that does not exist, a folder that is none of the accepted
            kinds, a run without a checkpoint, or an unknown model name.
        CheckpointError: an incomplete checkpoint.
    """

    expected = ("expected a run directory (config.yaml), a checkpoint directory (RUN/checkpoints/iter_N), a folder "
                f"`agentrl export` wrote, a local Hugging Face model folder, or a model name {sorted(KNOWN_MODELS)}")
    if given in KNOWN_MODELS:
        return EvalTarget("model", given, given, 0, given)
    p = Path(given).expanduser()
    if not p.exists():
        raise ConfigError(f"MODEL_OR_RUN_OR_CHECKPOINT={given!r} does not exist; {expected}")
    if not p.is_dir():
        raise ConfigError(f"MODEL_OR_RUN_OR_CHECKPOINT={given!r} is a file; {expected}")
    p = p.resolve()
    if (p / CONTROLLER_STATE).is_file() or (p / TRAINER_DIR).is_dir():
        run_dir = p.parent.parent
        ckpt = resolve_checkpoint(run_dir, p.name)
        version, run_id = _policy_version(ckpt)
        return EvalTarget("checkpoint", given, run_id, version, None, run_dir, ckpt)
    if (p / "config.yaml").is_file():
        ckpt = resolve_checkpoint(p)
        version, run_id = _policy_version(ckpt)
        return EvalTarget("run", given, run_id, version, None, p, ckpt)
    if (p / EXPORT_MARKER).is_file():
        marker = json.loads((p / EXPORT_MARKER).read_text())
        return EvalTarget("export", given, str(marker.get("run_id") or p.name), int(marker["policy_version"]), str(p))
    if (p / "config.json").is_file():
        return EvalTarget("model", given, p.name, 0, str(p))
    raise ConfigError(f"MODEL_OR_RUN_OR_CHECKPOINT={given!r} is a folder of none of the accepted kinds; {expected}")


def materialize(target: EvalTarget, progress: Callable[[str], None] | None = None) -> EvalTarget:
    """A target whose ``model`` the engines can load: a checkpoint is exported (checked, as
    ``agentrl export`` does) into ``RUN/eval/model-iter_N``, or that folder is reused when an
    earlier eval wrote it from the same checkpoint."""
    if target.model is not None:
        return target

    assert target.run_dir is not None and target.checkpoint is not None
    out = target.run_dir / "eval" / f"model-{target.checkpoint.name}"
    marker = out / EXPORT_MARKER
    if marker.is_file():
        m = json.loads(marker.read_text())
        if m.get("checkpoint") == target.checkpoint.name and int(m.get("policy_version", -1)) == target.policy_version:
            return EvalTarget(target.kind, target.given, target.name, target.policy_version, str(out),
                              target.run_dir, target.checkpoint)
    req = prepare_export(target.run_dir, out, checkpoint=target.checkpoint.name, force=True)
    report = export_run(req, progress=progress)
    return EvalTarget(target.kind, target.given, target.name, report.policy_version, str(report.out_dir),
                      target.run_dir, target.checkpoint)


def eval_config(target: EvalTarget, overrides: Sequence[str] = (), *, env_id: str | None = None,
                judge: bool = True) -> tuple[Config, Config | None]:
    """``(eval config, training config or None)`` for ``target`` (module docstring).

    ``overrides`` (``key=value``, e.g. ``eval.samples=8``, ``rollout.kv_cache_gb=1``) apply
    before the eval section is put in place of the rollout's. ``judge=False`` keeps the
    training reward's ``env.kwargs`` (no judge kwargs: e.g. a difficulty profile, which
    measures the reward training sees; no eval LLM judge either: ``eval.judge`` is unset).

    Raises:
        ConfigError: a bad override (the key and value named).
    """
    train_cfg = RunDir(target.run_dir).load_config([]) if target.run_dir is not None else None
    extra = [f"env.id={env_id}"] if env_id else []
    if train_cfg is not None:
        base = RunDir(target.run_dir).load_config([*extra, *overrides])
    else:
        # the packaged default's rollout and eval settings (temperature, stop strings, its
        # eval.num_tasks ...) are tuned for its own env; another env starts from the built-in
        # defaults, so none of them silently shapes that env's evaluation
        base = load_default_config([*extra, *overrides])
        if base.env.id != load_default_config().env.id:  # --env or an env.id override named another env
            base = load_config(None, [*extra, *overrides])
    ev = base.eval
    data = base.model_dump(mode="json")
    data["model"]["path"] = target.model if target.model is not None else data["model"]["path"]
    data["env"].update(split=ev.split, task_ids=None, group_size=ev.samples)
    # every eval episode is scored by the env's declared judge, not the training reward (agentrl.driver.judge)
    if judge:
        data["env"]["kwargs"] = judge_env_kwargs(base.env.id, data["env"]["kwargs"], base.env.import_modules)
    # never by the training reward's LLM judge (reward.judge) as such: by the env's rule, and eval.judge
    # (its own service, a budget with judge="eval") when set
    data.setdefault("reward", {})["judge"] = None
    if not judge:
        data["eval"]["judge"] = None
    data["rollout"].update(temperature=ev.temperature, top_p=1.0, top_k=-1, max_turns=ev.max_turns,
                           max_new_tokens=ev.max_new_tokens, max_context_tokens=ev.max_context_tokens)
    data["run"]["seed"] = ev.seed
    # the eval's own settings, not the training's: no reward shaping, no refills
    data["algorithm"].update(dynamic_sampling=False, overlong_buffer_tokens=0)
    data["controller"]["mode"] = "sync"

    return config_from_dict(data), train_cfg


def budget_source(target: EvalTarget, cfg: Config, overrides: Sequence[str] = (), *, section: str = "eval") -> str:
    """Where the sampling budget of ``eval_config(target, overrides)`` (``cfg``) comes from,
    in words (printed by ``agentrl eval`` before it rolls out): the ``section`` (``eval``, or
    ``rollout`` for ``agentrl tasks profile``) of the run's stored config for a run or
    checkpoint; of the packaged default config (``agentrl/defaults/shell_lookup.yaml``) for
    an exported folder or a bare model on the packaged default's env; else the built-in
    defaults of ``agentrl.config`` (e.g. eval: temperature 1.0, max_turns 3, max_new_tokens
    256); then the ``overrides`` that change it (``BUDGET_KEYS``)."""
    if target.run_dir is not None:
        where = f"the {section} section of the run's stored config ({Path(target.run_dir) / 'config.yaml'})"
    else:
        default_env = load_default_config().env.id
        if cfg.env.id == default_env:
            where = f"the {section} section of the packaged default config (agentrl/{DEFAULT_CONFIG_RESOURCE})"
        else:
            where = (f"the built-in {section} defaults (agentrl.config), not the packaged default config's, which are "
                     f"tuned for {default_env}")
    changed = [o for o in overrides if o.split("=", 1)[0].strip() in BUDGET_KEYS.get(section, ())]
    return where + (f"; overridden: {', '.join(changed)}" if changed else "")


def eval_identity(target: EvalTarget, cfg: Config) -> dict[str, Any]:
    """What an evaluation's rows depend on: the resolved target (the checkpoint directory, or
    the model folder's absolute path, or a known model name) and every setting that changes
    its episodes or numbers (env and its kwargs, split, ``num_tasks``, samples, seed, the
    sampling and the limits, the prompt layout, the bootstrap). Resources (engines, KV cache)
    are left out. JSON-serializable; ``eval_run_id`` hashes it."""
    if target.checkpoint is not None:
        where = str(Path(target.checkpoint).resolve())
    elif target.model is not None and os.path.isabs(os.path.expanduser(target.model)):
        where = str(Path(target.model).expanduser().resolve())
    else:
        where = str(target.model)  # a known model name
    r, ev = cfg.rollout, cfg.eval
    return {"target": where, "policy_version": target.policy_version, "env": cfg.env.id,
            "env_kwargs": cfg.env.model_dump(mode="json")["kwargs"], "split": ev.split, "num_tasks": ev.num_tasks,
            "samples": ev.samples, "seed": ev.seed, "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
            "max_turns": r.max_turns, "max_new_tokens": r.max_new_tokens, "max_context_tokens": r.max_context_tokens,
            "prompt_mode": r.prompt_mode, "history_length": r.history_length, "score_truncated": r.score_truncated,
            **({"stop_strings": list(r.stop_strings)} if r.stop_strings else {}), "confidence": ev.confidence, "num_resamples": ev.num_resamples,
            **({"judge": _judge_identity(cfg)} if ev.judge is not None else {})}


def _judge_identity(cfg: Config) -> dict[str, Any]:
    """What an eval LLM judge's scores and pass@k depend on: the judge (kind, model, URL,
    sampling, structured output, a pool's dtype), its rubric as given (None: the env class's),
    the combine settings and ``reward.success_threshold``."""
    j, r = cfg.eval.judge, cfg.reward
    assert j is not None
    return {"kind": j.kind, "model": j.model, "base_url": j.base_url if j.kind == "endpoint" else None,
            "temperature": j.temperature, "max_tokens": j.max_tokens,
            "rubric": cfg.eval.rubric if cfg.eval.rubric is not None else r.rubric, "combine": r.combine,
            "rule_weight": r.rule_weight, "rule_pass": r.rule_pass, "success_threshold": r.success_threshold,
            "structured": j.structured, "dtype": j.dtype if j.kind == "pool" else None}


def eval_run_id(target: EvalTarget, cfg: Config) -> str:
    """The store's run id for this evaluation: deterministic from what is evaluated and how
    (readable parts, then 10 hex digits of the SHA-256 of ``eval_identity``: two models of
    one folder name, e.g. ``/models/run1/final`` and ``/models/run2/final``, or two evals
    with another temperature, token limit or ``num_tasks`` get different ids)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", target.name).strip("-")[:80] or "model"
    env = re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.env.id).strip("-")
    ev = cfg.eval
    digest = hashlib.sha256(json.dumps(eval_identity(target, cfg), sort_keys=True).encode()).hexdigest()[:10]
    return f"eval-{slug}-v{target.policy_version}-{env}-{ev.split}-n{ev.samples}-s{ev.seed}-{digest}"


def check_replaceable(store: Any, run_id: str, identity: dict[str, Any]) -> None:
    """Refuse to replace (rewind) a stored run ``run_id`` unless it is an evaluation with this
    ``identity`` (``eval_identity``); a run not stored yet is fine.

    Raises:
        ConfigError: the stored run records another identity (the settings that differ
            named) or none (not an eval this agentrl wrote).
    """
    try:
        info = store.get_run(run_id)
    except ContractError:
        return  # not stored yet
    stored = info.config.get("identity") if isinstance(info.config, dict) else None
    if stored == identity:
        return
    if not isinstance(stored, dict):
        why = "it records no eval identity (a run this eval did not write, or one of an older agentrl)"
    else:
        diff = [f"{k}: stored {stored.get(k)!r}, now {identity.get(k)!r}"
                for k in sorted(set(stored) | set(identity)) if stored.get(k) != identity.get(k)]
        why = "its settings differ (" + "; ".join(diff) + ")"
    raise ConfigError(f"eval run id {run_id!r} is already in the replay store and {why}; refusing to replace "
                      "its episodes: expected a run of the same target and eval settings (use another "
                      "--replay-url, or remove that run)")


@dataclass
class EvalResult:
    """An evaluation's report and where its episodes are.

    Attributes:
        report: the numbers (``agentrl.eval.passk.EvalReport``).
        target: what was evaluated (with its model folder).
        run_id: the store's run id of the eval episodes; ``replay_url``: the store.
        episodes: every episode rolled out (errored and aborted ones included).
        settings: the fixed sampling configuration and budget used (printed by the CLI).
        rollout_s: wall seconds of the rollout.
    """

    report: EvalReport
    target: EvalTarget
    run_id: str
    replay_url: str
    episodes: list[Episode]
    settings: dict[str, Any]
    rollout_s: float


def settings_of(cfg: Config, num_tasks: int) -> dict[str, Any]:
    r, ev = cfg.rollout, cfg.eval
    return {"env": cfg.env.id, "split": ev.split, "tasks": num_tasks, "samples": ev.samples, "seed": ev.seed,
            "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_turns": r.max_turns,
            "max_new_tokens": r.max_new_tokens, "max_context_tokens": r.max_context_tokens,
            "confidence": ev.confidence, "num_resamples": ev.num_resamples}


def evaluate(given: str, overrides: Sequence[str] = (), *, env_id: str | None = None, allow_overlap: bool = False,
             replay_url: str | None = None, progress: Callable[[str], None] | None = None,
             judge: bool = True, on_settings: Callable[[dict[str, Any]], None] | None = None,
             on_episodes: Callable[[int, int], None] | None = None, budget_from: str | None = None) -> EvalResult:
    """Evaluate ``given`` (module docstring); starts (or joins) Ray and stops what it started.
    ``judge=False``: score with the training reward, not the env's judge (``eval_config``).

    Args:
        progress: called with each phase's name (exporting, starting the engines, ...).
        on_settings: called once, before any export or rollout, with the settings the eval
            will use (``EvalResult.settings``: sampling, budget, ``budget_source``, judge).
        on_episodes: called with ``(episodes finished, episodes requested)`` while the
            episodes roll out (``agentrl.cluster.engines.progress``): ``(0, n)`` first,
            ``(n, n)`` last.
        budget_from: ``settings["budget_source"]`` in place of ``budget_source``'s words
            (``agentrl tasks profile``, whose budget is the rollout section's).

    The console log of a command (``agentrl.logs``) goes to ``RUN/eval/console.log`` for a
    run or checkpoint, else ``<run.output_dir>/eval/console.log``.

    Raises:
        ConfigError: a bad target, override, env, split, or an overlapping split.
        CheckpointError: an incomplete checkpoint.
        ClusterError: engines that could not start or were all lost.
    """
    import ray

    say = progress or (lambda _phase: None)
    target = resolve_target(given)
    cfg, train_cfg = eval_config(target, overrides, env_id=env_id, judge=judge)  # overrides checked before any export
    task_ids = held_out_task_ids(cfg, train_cfg, allow_overlap=allow_overlap or cfg.eval.allow_overlap)
    eval_dir = (Path(target.run_dir) if target.run_dir is not None else Path(cfg.run.output_dir)) / "eval"
    attach_log_file(eval_dir / LOG_FILE_NAME)  # a command's console log (agentrl.logs); nothing otherwise
    settings = settings_of(cfg, len(task_ids))
    settings["budget_source"] = budget_from or budget_source(target, cfg, overrides)
    trained_on = train_cfg.env.kwargs if train_cfg is not None and train_cfg.env.id == cfg.env.id else None
    llm = train_cfg.reward.judge if train_cfg is not None else None  # the training reward's LLM judge, if any
    warn_same_judge(llm, cfg.eval.judge)  # allowed, with a warning that names it
    settings["judge"] = (judge_label(cfg.env.id, trained_on, cfg.env.import_modules, llm_judge=judge_name(llm),
                                     eval_judge=eval_llm_judge(cfg, llm))
                         if judge else "judge: the training reward (the env's judge not applied)")  # printed, stored
    if on_settings is not None:
        on_settings(dict(settings))
    announce_sandboxes(cfg)  # which sandboxes, on which daemon; a named silent daemon stops the eval here
    if target.model is None:
        say(f"exporting {target.checkpoint.name}")
        target = materialize(target, progress=say)
        cfg, _ = eval_config(target, overrides, env_id=env_id, judge=judge)
    run_id = eval_run_id(target, cfg)
    model_path = resolve_model_path(cfg.model.path)
    if replay_url is None:
        replay_url = cfg.replay.url or (RunDir(target.run_dir).replay_url() if target.run_dir is not None else None)
    if replay_url is None:
        out = Path(cfg.run.output_dir) / "eval"
        out.mkdir(parents=True, exist_ok=True)
        replay_url = f"sqlite:///{(out / 'replay.db').absolute()}"
    requests = eval_requests(cfg, task_ids, run_id)
    cfg_dict = cfg.model_dump(mode="json")
    identity = eval_identity(target, cfg)
    store = ReplayStore(replay_url)  # opened first: a bad store fails before any rollout
    try:
        check_replaceable(store, run_id, identity)  # before start_run overwrites the stored config
    except BaseException:
        store.close()
        raise
    try:
        store.start_run(run_id, {"kind": "eval", "target": target.given, "target_kind": target.kind,
                                 "policy_version": target.policy_version, "model": target.model,
                                 "eval": settings, "identity": identity, "config": cfg_dict})
        started_ray = connect(cfg)
        pool, hosts, judge_service = None, [], None
        try:
            if cfg.eval.judge is not None:
                say("checking the eval judge")
                judge_service = start_judge_service(cfg, run_id, replay_url, role="eval")  # down: a JudgeError now
            say("starting the engines")
            hosts = start_sandbox_hosts(cfg, run_id)
            pool = EnginePool(cfg, cfg_dict, model_path, run_id, sandbox_hosts=hosts)
            pool.ready()
            say(f"rolling out {len(requests)} episodes")
            t0 = time.perf_counter()
            with EpisodeProgress(lambda: pool.actors, requests, on_episodes) if on_episodes else nullcontext():
                episodes, _, _ = pool.rollout(requests, target.policy_version, eval_budget(cfg, judge=judge))
            rollout_s = time.perf_counter() - t0
        except Exception as exc:
            cluster_error = as_cluster_error(exc)
            if cluster_error is None:
                raise
            raise cluster_error from exc
        finally:
            if pool is not None:
                pool.kill()
            stop_sandbox_hosts(hosts)
            stop_judge_service(judge_service)
            if started_ray:
                ray.shutdown()
            reap_orphans(run_id, include_live_owners=True, docker_host=cfg.sandbox.docker_host)

        report = eval_report(episodes, cfg)
        say("writing the episodes")
        store.rewind(run_id, 0)  # an earlier eval with this identity (check_replaceable): replaced, not doubled
        store_eval_episodes(store, run_id, episodes)
        store.add_metrics(run_id, 0, report.metrics())  # an undefined pass@k (NaN) is stored as NULL
        store.mark_complete(run_id, 0)  # its rows are iteration 0 (before training): no training iteration done
        store.finish_run(run_id, "finished")
    except BaseException as exc:
        try:
            store.finish_run(run_id, "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
        except Exception:
            log.exception("could not record the eval's status")
        raise
    finally:
        store.close()
    return EvalResult(report, target, run_id, replay_url, episodes, settings, rollout_s)


