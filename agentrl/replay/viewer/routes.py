"""The viewer's pages. Every id arrives as a query parameter (any string a run, group or
episode id may be, slashes included) and only ever reaches the database as a bound value.

    /                                   runs
    /run?id=RUN                         charts (the judge against the rule too) and token accounting of one run
    /episodes?run=RUN&...filters        episodes (filters, sort, keyset pages, text search)
    /episode?id=EP[&tok=N][&heat=F]     one episode: its judgement, turn by turn, its tokens (paged), reruns
    /group?run=RUN&id=GROUP             the rollouts of one task instance side by side
    /diff?a=RUN[&ia=IT]&b=RUN[&ib=IT][&task=T]   two runs or iterations on the same task
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from agentrl.replay import read
from agentrl.replay.diagnose import diagnose
from agentrl.replay.models import EPISODE_KINDS
from agentrl.replay.read import EpisodeFilter, RunInfo, Sort, TokenPage
from agentrl.replay.read.listing import tool_call_share
from agentrl.replay.viewer.run_charts import METRIC_KEYS, SPLIT_KEYS, judge_chart, run_charts, token_table
from agentrl.replay.viewer.state import Viewer
from agentrl.types import TerminationReason

router = APIRouter()
PAGE_SIZES = (25, 50, 100, 200)
HEAT_FIELDS = ("loss_mask",) + read.TOKEN_FIELDS
HEAT_BUCKETS = 10
TOKEN_ROWS = 200
"""Iterations shown in the run page's token accounting table (the last ones)."""
INT_LIMIT = 2**63
"""Integer parameters lie in [-INT_LIMIT, INT_LIMIT) (the 64-bit integers of SQLite and PostgreSQL)."""
RERUNS_SHOWN = 20
"""Reruns listed on the episode page (the newest)."""


def _viewer(request: Request) -> Viewer:
    return request.app.state.viewer


def _param(request: Request, name: str, kind: type = str, default: Any = None) -> Any:
    """Query parameter ``name`` as ``kind`` (str, int, float or bool); empty means absent.

    Raises:
        HTTPException: 400 naming the parameter and what it should be.
    """
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > 2000:
        raise HTTPException(400, f"parameter {name} is {len(raw)} characters long; expected at most 2000")
    if kind is str:
        return raw
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        value = kind(raw)
        if kind is float and not math.isfinite(value):
            raise ValueError(raw)
    except ValueError:
        raise HTTPException(400, f"parameter {name}={raw[:80]!r}; expected {'a number' if kind is float else kind.__name__}") from None
    if kind is int and not -INT_LIMIT <= value < INT_LIMIT:
        # The database's integers are 64-bit: a larger bound is no filter but an overflow.
        raise HTTPException(400, f"parameter {name}={raw[:80]!r}; expected an integer in [-2**63, 2**63)")
    return value


def _need(request: Request, name: str) -> str:
    value = _param(request, name)
    if value is None:
        raise HTTPException(400, f"parameter {name} is required")
    return value


def _run_or_404(v: Viewer, run_id: str) -> RunInfo:
    run = read.get_run(v.db, run_id)
    if run is None:
        raise HTTPException(404, f"run {run_id!r} is not in {v.db.url}")
    return run


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request) -> HTMLResponse:
    v = _viewer(request)
    return v.render("runs.html", runs=read.list_runs(v.db))


@router.get("/run", response_class=HTMLResponse)
def run_page(request: Request) -> HTMLResponse:
    v = _viewer(request)
    run_id = _need(request, "id")
    run = _run_or_404(v, run_id)
    metrics = read.metric_series(v.db, run_id, METRIC_KEYS)
    done = read.completed_iterations(v.db, run_id)

    # A run that evaluates (eval.every) stores its eval episodes at the iteration they follow:
    # train points then link to kind=train, eval points to kind=eval, so neither mixes in the other.
    # So do a difficulty profile's episodes (kind=profile, time/profile_s) and an eval before
    # training's (kind=eval among iteration 1's rows, ids under <run>/eval-before/it0/, time/eval_before_s), stored beside the training rows.
    split = v.db.has_kind and any(k.startswith("eval/") or k in SPLIT_KEYS for k in metrics)

    qs = v.env.globals["qs"]
    prefix, suffix = "/episodes?" + qs(run=run_id) + "&iteration=", {k: "&" + qs(kind=k) for k in ("train", "eval")}

    def link(it: int, kind: str | None = None) -> str:  # = "/episodes?" + qs(run=..., iteration=it, kind=kind)
        return f"{prefix}{it}{suffix[kind] if kind else ''}"

    def train_link(it: int) -> str:
        return link(it, "train" if split else None)

    charts = run_charts(metrics, train_link, run.is_async,
                        eval_link=lambda it: link(it, "eval" if v.db.has_kind else None))
    judged = read.judge_iterations(v.db, run_id)
    if judged:
        charts.append(judge_chart(judged, train_link))
    tokens = token_table(metrics)
    return v.render("run.html", run=run, charts=charts, tokens=tokens[-TOKEN_ROWS:], tokens_total=len(tokens), done=done,
                    in_progress=sorted({it for s in metrics.values() for it, _ in s} - set(done)),
                    tool_share=tool_call_share(v.db, run_id))


def _filters(request: Request) -> EpisodeFilter:
    termination = _param(request, "termination")
    valid = {r.value for r in TerminationReason} | {"none"}
    if termination is not None and termination not in valid:
        raise HTTPException(400, f"parameter termination={termination[:80]!r}; expected one of {sorted(valid)}")
    return EpisodeFilter(
        env=_param(request, "env"), task=_param(request, "task"), iteration=_param(request, "iteration", int),
        reward_min=_param(request, "reward_min", float), reward_max=_param(request, "reward_max", float),
        termination=termination, success=_param(request, "success", bool), group=_param(request, "group"),
        policy_version=_param(request, "policy_version", int), length_min=_param(request, "length_min", int),
        length_max=_param(request, "length_max", int), kind=_param(request, "kind"), q=_param(request, "q"))


@router.get("/episodes", response_class=HTMLResponse)
def episodes_page(request: Request) -> HTMLResponse:
    v = _viewer(request)
    run_id = _need(request, "run")
    run = _run_or_404(v, run_id)
    f = _filters(request)
    sort_key = _param(request, "sort", default="default")
    if sort_key not in read.SORTS:
        raise HTTPException(400, f"parameter sort={sort_key[:80]!r}; expected one of {sorted(read.SORTS)}")
    sort = Sort(sort_key, desc=_param(request, "desc", bool, False))
    limit = _param(request, "limit", int, 50)
    if limit not in PAGE_SIZES:
        raise HTTPException(400, f"parameter limit={limit}; expected one of {list(PAGE_SIZES)}")
    cursor = _param(request, "cursor")
    page = read.episode_page(v.db, run_id, f, sort, cursor, limit)
    params = {k: val for k, val in request.query_params.items() if k != "cursor" and val != ""}
    return v.render("episodes.html", run=run, page=page, f=f, sort=sort, limit=limit, params=params,
                    sorts=list(read.SORTS), page_sizes=PAGE_SIZES, has_kind=v.db.has_kind,
                    tool_share=tool_call_share(v.db, run_id, f.kind) if f.kind in (None, *EPISODE_KINDS) else None,
                    terminations=sorted(r.value for r in TerminationReason) + ["none"], first_page=cursor is None)


def _heat_classes(page: TokenPage, field: str) -> list[str]:
    """CSS class per token: ``m0``/``m1`` by loss_mask, or ``h0..h9`` by ``field``'s value
    on this page (``hn``: no value)."""
    if field == "loss_mask":
        return [f"m{int(m)}" for m in page.loss_mask]
    vals = page.values[field]
    ok = np.isfinite(vals)
    if not ok.any():
        return ["hn"] * len(vals)
    lo, hi = float(vals[ok].min()), float(vals[ok].max())
    span = hi - lo or 1.0
    return [f"h{min(HEAT_BUCKETS - 1, int((x - lo) / span * HEAT_BUCKETS))}" if np.isfinite(x) else "hn"
            for x in vals]


def _f(x: float, digits: int = 4) -> str:
    return "" if not np.isfinite(x) else f"{x:.{digits}g}"


def _token_rows(v: Viewer, page: TokenPage, heat: str, model_path: str | None) -> list[dict[str, Any]]:
    """One dict of display strings per token of ``page`` (the template escapes them)."""
    ids = [int(i) for i in page.ids]
    texts = v.token_text(model_path, ids) if v.token_text is not None and model_path and ids else None
    if texts is None or len(texts) != len(ids):
        texts = [f"[{i}]" for i in ids]
    classes = _heat_classes(page, heat)
    val = page.values
    return [{"i": page.start + k, "id": ids[k], "text": texts[k], "cls": classes[k], "mask": int(page.loss_mask[k]),
             "turn": int(page.turn[k]), "lp": _f(val["behavior_log_prob"][k]), "tlp": _f(val["trainer_log_prob"][k]),
             "gap": _f(val["gap"][k], 3), "ent": _f(val["entropy"][k]), "adv": _f(val["advantage"][k]),
             "v": _f(val["policy_version"][k], 12)} for k in range(len(ids))]


def _judge_messages(prompt: Any) -> list[tuple[str, str]]:
    """The judge's prompt (``judgements.prompt``: OpenAI chat messages) as ``[(role, text)]``
    for display: a content given as parts shows their text, anything else its JSON."""
    out = []
    for m in prompt if isinstance(prompt, list) else [prompt]:
        if not isinstance(m, dict):
            out.append(("?", json.dumps(m)))
            continue
        content = m.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            content = "\n".join(p["text"] for p in content)
        text = "" if content is None else content if isinstance(content, str) else json.dumps(content)
        out.append((str(m.get("role", "?")), text))
    return out


@router.get("/episode", response_class=HTMLResponse)
def episode_page(request: Request) -> HTMLResponse:
    v = _viewer(request)
    episode_id = _need(request, "id")
    ep = read.episode_view(v.db, episode_id)
    if ep is None:
        raise HTTPException(404, f"episode {episode_id!r} is not in {v.db.url}")
    heat = _param(request, "heat", default="loss_mask")
    if heat not in HEAT_FIELDS:
        raise HTTPException(400, f"parameter heat={heat[:80]!r}; expected one of {list(HEAT_FIELDS)}")
    start = _param(request, "tok", int, 0)
    if start < 0:
        raise HTTPException(400, f"parameter tok={start}; expected a token offset >= 0")
    tokens = read.token_page(v.db, episode_id, start, read.TOKEN_PAGE_SIZE)
    return v.render("episode.html", ep=ep, s=ep.summary, tokens=tokens, heat=heat, heat_fields=HEAT_FIELDS,
                    token_rows=_token_rows(v, tokens, heat, read.model_path(v.db, ep.summary.run_id)) if tokens else [],
                    page_size=read.TOKEN_PAGE_SIZE, reruns=read.reruns(v.db, episode_id, limit=RERUNS_SHOWN),
                    has_reruns_table=v.db.table("reruns") is not None,
                    judge_messages=_judge_messages(ep.judgement.prompt) if ep.judgement is not None else [])


@router.get("/group", response_class=HTMLResponse)
def group_page(request: Request) -> HTMLResponse:
    v = _viewer(request)
    run_id, group_id = _need(request, "run"), _need(request, "id")
    run = _run_or_404(v, run_id)
    group = read.get_group(v.db, run_id, group_id)
    if not group.episodes:
        raise HTTPException(404, f"group {group_id!r} has no episodes in run {run_id!r}")
    anchor_index = {a: k for k, a in enumerate(group.anchor_groups)}
    step_group = {step: anchor_index[a] for a, steps in group.anchor_groups.items() for step in steps}
    depth = max((len(t) for t in group.turns.values()), default=0)
    return v.render("group.html", run=run, group_id=group_id, g=group, step_group=step_group, depth=depth,
                    anchors=list(group.anchor_groups.items()))


@router.get("/diff", response_class=HTMLResponse)
def diff_page(request: Request) -> HTMLResponse:
    v = _viewer(request)
    runs = read.list_runs(v.db)
    a, b = _param(request, "a"), _param(request, "b")
    ia, ib = _param(request, "ia", int), _param(request, "ib", int)
    ctx: dict[str, Any] = dict(runs=runs, a=a, b=b, ia=ia, ib=ib, tasks=[], task=None, rows=[], ea=None, eb=None)
    if a is None or b is None:
        return v.render("diff.html", **ctx)
    for rid in (a, b):
        _run_or_404(v, rid)
    if a == b and ia == ib:
        raise HTTPException(400, "the two sides are the same; choose two runs, or two iterations (ia, ib) of one run")
    tasks = read.common_tasks(v.db, (a, ia), (b, ib))
    task = _param(request, "task") or (tasks[0] if tasks else None)
    ctx.update(tasks=tasks, task=task)
    if task is not None:
        ida, idb = read.first_episode(v.db, a, ia, task), read.first_episode(v.db, b, ib, task)
        if ida is None or idb is None:
            raise HTTPException(404, f"task {task!r} was not run on both sides")
        ea, eb = read.episode_view(v.db, ida), read.episode_view(v.db, idb)
        ctx.update(ea=ea, eb=eb, rows=read.align_turns(ea, eb))
    return v.render("diff.html", **ctx)


DIAGNOSE_EPISODES = 2000
"""Episodes a diagnosis reads by default on the page (``agentrl diagnose`` reads up to 20,000)."""


@router.get("/diagnose", response_class=HTMLResponse)
def diagnose_page(request: Request) -> HTMLResponse:
    """``agentrl diagnose``'s checks of one run (``agentrl.replay.diagnose``), with links to
    the episodes they name. Reads the newest ``max`` episodes (one query each: seconds)."""
    v = _viewer(request)
    run_id = _need(request, "run")
    run = _run_or_404(v, run_id)
    limit = _param(request, "max", int, DIAGNOSE_EPISODES)
    if not 1 <= limit <= 20_000:
        raise HTTPException(400, f"parameter max={limit}; expected 1..20000 episodes")
    report = diagnose(v.db, run_id, max_episodes=limit).to_json()
    return v.render("diagnose.html", run=run, d=report, limit=limit)
