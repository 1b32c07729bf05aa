"""``agentrl replay rerun``: the wiring around ``agentrl.rollout.rerun.rerun_episode``.

Reads one episode and its run's stored config from a replay store, makes a fresh
environment with a fresh sandbox the way the run's rollout made them
(``agentrl.cluster.actors.env_factory.EnvFactory``: the env id through the gymnasium registry, the
run's ``env.kwargs`` and ``env.import_modules``, its ``sandbox`` limits and backend), replays
the recorded actions, and writes the result to the store's ``reruns`` table (what the viewer
shows on the episode page).

What the rerun takes from the run's config, since the episode row does not hold it:
``env.kwargs``, ``env.import_modules``, ``sandbox.*`` and ``rollout.score_truncated``. An eval
episode of a training run (``eval.every``) is rerun with the env's judge kwargs over
``env.kwargs``, as the eval made it (``agentrl.driver.judge``).
Two things differ from the run on purpose: no warm pool (``sandbox.pool_size = 0``: one fresh
sandbox, the state a pooled sandbox would carry between episodes is what a rerun must not
inherit) and no sandbox hosts (``cluster.sandbox_hosts``: the sandbox runs in this process,
on this machine). ``sandbox.backend: auto`` is resolved again here (``choose_backend``), so
the backend is the run's only where this machine offers the same; the report names it.
"""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path

from agentrl.config import config_from_dict
from agentrl.driver.judge import judge_env_kwargs
from agentrl.errors import ConfigError, ContractError
from agentrl.replay import ReplayStore, read
from agentrl.rollout.rerun import RerunReport, rerun_episode

log = logging.getLogger(__name__)

_RUN_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # run ids are f"{run.name}-{uuid4().hex[:8]}"


def default_run_dir(episode_id: str, output_dir: str | Path = "runs") -> Path:
    """The run directory an episode id names by default: ``runs/NAME`` for an id
    ``NAME-1a2b3c4d/it0/...`` (the run id is the run's name plus 8 hex digits)."""
    run_id = episode_id.split("/", 1)[0]
    return Path(output_dir) / _RUN_SUFFIX.sub("", run_id)


def store_url(target: str | Path) -> str:
    """The database URL of ``target``: a URL as given (``sqlite:///...``,
    ``postgresql+psycopg://...``), a run directory (its ``replay.db``) or a SQLite file.

    Raises:
        ConfigError: a path that is neither a run directory with a ``replay.db`` nor a file
            (no new database is created by looking for an episode).
    """
    text = str(target)
    if "://" in text:
        return text
    path = Path(text)
    if path.is_dir():
        db = path / "replay.db"
        if not db.is_file():
            raise ConfigError(f"--db {text!r}: the folder has no replay.db; expected a run directory "
                              "(written by `agentrl train`), a SQLite file or a database URL")
        path = db
    elif not path.is_file():
        raise ConfigError(f"--db {text!r} does not exist; expected a run directory, a SQLite file or a "
                          "database URL such as postgresql+psycopg://user@host/db")
    return f"sqlite:///{path.resolve()}"


def _run_id_of(store: ReplayStore, episode_id: str) -> str:
    found = read.get_episode_summary(store.db, episode_id)
    if found is None:
        raise ContractError(f"episode_id={episode_id!r} is not in {store.url}")
    return found.run_id


def _is_eval_episode(store: ReplayStore, run_id: str, episode_id: str, page: int = 1000) -> bool:
    """Whether ``episode_id`` is stored as one of ``run_id``'s ``kind='eval'`` episodes."""
    offset = 0
    while True:
        rows = store.list_episodes(run_id, limit=page, offset=offset, kind="eval")
        if any(r.episode_id == episode_id for r in rows):
            return True
        if len(rows) < page:
            return False
        offset += page


def rerun_stored_episode(target: str | Path, episode_id: str, *, record: bool = True) -> RerunReport:
    """Rerun episode ``episode_id`` of the replay store ``target`` (module docstring) and,
    with ``record``, store the result in its ``reruns`` table.

    Returns:
        The ``RerunReport``; its outcome ``error`` covers what failed once the environment
        was being made (a sandbox that does not start, an env that raises).

    Raises:
        ConfigError: ``target`` names no database; the env id is not registered (after the
            run's ``env.import_modules``); the run's stored config is not valid any more.
        ContractError: the episode is not in the store, or has no turns.
        InfraError: the database cannot be opened.
    """
    from agentrl.cluster.actors.env_factory import EnvFactory  # heavy: ray

    store = ReplayStore(store_url(target))
    try:
        run_id = _run_id_of(store, episode_id)
        episode = store.get_episode(episode_id)
        run = store.get_run(run_id)
        raw = dict(run.config)
        eval_run = raw.get("kind") == "eval" and isinstance(raw.get("config"), dict)
        if eval_run:
            raw = raw["config"]  # `agentrl eval` stores its settings around the config it rolled out with
        cfg = config_from_dict(raw)
        if cfg.env.id != episode.env_id:
            # an episode of another env than the run's (e.g. an eval env): its kwargs are not the run's
            cfg.env.id = episode.env_id
            cfg.env.kwargs = {}
        elif not eval_run and _is_eval_episode(store, run_id, episode_id):
            # an eval episode of a training run (eval.every): its env had the judge's kwargs (agentrl.driver.judge);
            # an eval run's config is already the one its envs were made with (a profile's: no judge)
            cfg.env.kwargs = judge_env_kwargs(cfg.env.id, cfg.env.kwargs, cfg.env.import_modules)
        cfg.sandbox.pool_size = 0
        cfg.sandbox.max_sandboxes = None
        factory = EnvFactory(cfg, f"rerun-{uuid.uuid4().hex[:8]}", None)
        report = rerun_episode(episode, factory, score_truncated=cfg.rollout.score_truncated)
        report.backend = getattr(factory, "backend", None)
        if record:
            store.add_rerun(episode_id, same=report.same, first_divergent_turn=report.first_divergent_turn,
                            report=report.to_json())
        return report
    finally:
        store.close()


def report_renderables(report: RerunReport) -> list:
    """What ``agentrl replay rerun`` prints (rich renderables): a table of the turns, then
    the first divergent turn's unified diffs, or the error."""
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.table import Table

    style = {"same": "green", "different": "bold red", "error": "bold red", "reproduced": "yellow",
             "error_not_reproduced": "yellow", "not_executed": "dim", "not_reached": "dim"}
    t = Table("turn", "status", "recorded reward", "rerun reward", "differs", "note",
              title=f"rerun of {report.episode_id}",
              caption=f"{report.env_id}, task {report.task_id!r}, seed {report.seed}; sandbox backend "
                      f"{report.backend or 'none'}; {report.duration_s:.1f} s")
    fmt = lambda r: "-" if r is None else f"{r:g}"  # noqa: E731
    for tc in report.turns:
        t.add_row(str(tc.turn_index), f"[{style.get(tc.status, '')}]{tc.status}[/]", fmt(tc.recorded_reward),
                  fmt(tc.rerun_reward), ", ".join(f.field for f in tc.fields), tc.note)
    out: list = [t]
    if report.outcome == "different":
        first = next(tc for tc in report.turns if tc.turn_index == report.first_divergent_turn)
        for f in first.fields:
            out.append(Panel(Syntax(f.diff, "diff", word_wrap=True),
                             title=f"turn {first.turn_index}: {f.field} differs", title_align="left"))
        out.append(f"[bold red]different[/]: first divergence at turn {report.first_divergent_turn} "
                   "(0-based, as stored)")
    elif report.outcome == "error":
        e = report.error or {}
        where = "making the environment" if e.get("turn_index") is None else f"turn {e['turn_index']}"
        out.append(f"[bold red]error[/] ({e.get('kind')} fault at {where}, not a divergence): "
                   f"{e.get('type')}: {e.get('message')}")
    elif all(tc.status == "same" for tc in report.turns):
        out.append(f"[green]same[/]: all {len(report.turns)} turns give the recorded observation and reward")
    else:
        from collections import Counter

        counts = ", ".join(f"{n} {status}" for status, n in Counter(tc.status for tc in report.turns).items())
        out.append(f"[green]same[/]: no turn differs ({counts}; see the notes)")
    return out
