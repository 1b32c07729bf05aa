"""Benchmark: GRPO vs GiGPO vs the turn-level critic, resumable across sittings.

For every (suite, estimator, seed) the script trains one run and, when it finishes, writes
``<out>/<suite>/<estimator>-s<seed>/result.json`` (its metrics rows, its held-out eval per task,
wall time, a fingerprint of the settings). A run whose ``result.json`` is there is skipped, so the
comparison goes on across sittings: stop it at any time (the run in progress is lost and starts
again next time; finished ones stay). Runs go seed by seed, each seed's three estimators together,
so every finished seed is a paired comparison.

    .venv/bin/python tests/benchmarks/bench_credit.py --list                      # suites, sizes, why
    .venv/bin/python tests/benchmarks/bench_credit.py --suites shell --max-runs 3  # one seed, ~1 h
    .venv/bin/python tests/benchmarks/bench_credit.py                             # all of it, resumes
    .venv/bin/python tests/benchmarks/bench_credit.py --report                    # table + PNG only
    .venv/bin/python tests/benchmarks/bench_credit.py --report --publish docs/credit --readme README.md  # the README's copies
    .venv/bin/python tests/benchmarks/bench_credit.py --resume-from docs/credit/results  # a fresh checkout goes on
    .venv/bin/python tests/benchmarks/bench_credit.py --report --resume-from docs/credit/results  # its report
    .venv/bin/python tests/benchmarks/bench_credit.py --smoke                     # tiny model, minutes
    .venv/bin/python tests/benchmarks/bench_credit.py --gpu --out runs/bench-credit-gpu   # a GPU machine

Suites (``credit_suites.py``): ``shell`` (examples/shell_lookup_learn.yaml, 6 updates) and
``guess`` (GuessNumber, where anchor states recur; Sokoban and TextWorld give SmolLM2-135M no
success untrained) on 2 CPU cores; ``--gpu`` swaps in a 1.5B model and ALFWorld-like TextWorld
games. What is held equal: start weights, task order and sampling seeds (``run.seed``), episodes
per update, every rollout, trainer and eval setting, the number of updates; the equal
rollout-token budget ``B`` of a seed is the smallest total among its runs (the report measures
training success within ``B`` and flags runs whose after-eval came later).

``--report`` builds ``<out>/report.md`` (per suite and seed: held-out pass@1 before and after with
95 % intervals, the paired difference to GRPO with its interval, training success within ``B``,
and item-2 diagnostics: turns with their own credit, updates without gradient, GiGPO's step groups
and step term with a diagnosis, the critic's explained variance) and ``<out>/curves.png``.
The run directories (metrics, replay store) stay under each run's folder as ``run/``; its final
checkpoint is deleted unless ``--keep-checkpoints`` (about 1.7 GB each with the 135M model).

``<out>`` is git-ignored, so a fresh checkout starts with none of it. ``--publish DIR`` also copies
every finished run's ``result.json`` into ``DIR/results/<suite>/<run>/`` (the repository keeps them
under ``docs/credit/results``), and ``--resume-from DIR/results`` copies those into ``<out>`` first,
so a new sitting on a new checkout skips the runs already published and the report covers them all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from a checkout
sys.path.insert(0, str(HERE))  # the helper modules beside it

from credit_report import (  # noqa: E402
    RESULT_NAME,
    build_report,
    format_behaviours,
    format_report,
    format_summary,
    load_results,
)
from credit_suites import DEFAULT_GPU_SUITES, DEFAULT_SUITES, ESTIMATORS, SMOKE, Suite, suites_for  # noqa: E402

from agentrl.config import load_config  # noqa: E402
from agentrl.eval.passk import episode_success  # noqa: E402
from agentrl.replay import ReplayStore  # noqa: E402

REPO = HERE.parents[1]


def result_path(out: Path, suite: str, estimator: str, seed: int) -> Path:
    """``<out>/<suite>/<estimator>-s<seed>/result.json``."""
    return out / suite / f"{estimator}-s{seed}" / RESULT_NAME


def is_done(path: Path) -> bool:
    """Whether ``path`` is a complete result file (a broken one counts as not done)."""
    try:
        return bool(json.loads(path.read_text()).get("complete"))
    except (OSError, json.JSONDecodeError):
        return False


def copy_results(src: Path, dest: Path, *, overwrite: bool,
                 only: dict[str, str] | None = None) -> tuple[list[Path], list[Path]]:
    """Copy every complete ``<src>/<suite>/<run>/result.json`` to the same place under ``dest``
    (``overwrite=False``: only where ``dest`` has no complete one).

    Args:
        only: ``{"<suite>/<run>": fingerprint}``: copy just these runs, and only a file whose
            ``fingerprint`` is the one given (a result of other settings, e.g. the ``--gpu``
            preset's ``shell`` or another ``--model``, must not pass for a finished run).

    Returns:
        ``(written, mismatched)``: the files written, and the source files left out because their
        fingerprint differs from ``only``'s.

    Raises:
        SystemExit: ``src`` is not a folder, or holds no result file two levels down (naming
            ``src/results`` when that is where they are: ``--publish`` puts them there).
    """
    if not src.is_dir():
        raise SystemExit(f"{src}: no such folder of result files (expected <suite>/<run>/{RESULT_NAME} under it)")
    found = sorted(src.glob(f"*/*/{RESULT_NAME}"))
    if not found:
        hint = f"; --publish puts them in {src / 'results'}" if (src / "results").is_dir() else ""
        raise SystemExit(f"{src}: no <suite>/<run>/{RESULT_NAME} under it{hint}")
    written, mismatched = [], []
    for path in found:
        rel = path.relative_to(src)
        target = dest / rel
        if only is not None and rel.parent.as_posix() not in only:
            continue
        if not is_done(path) or (not overwrite and is_done(target)):
            continue
        if only is not None and json.loads(path.read_text()).get("fingerprint") != only[rel.parent.as_posix()]:
            mismatched.append(path)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        written.append(target)
    return written, mismatched


def turn_action(turn: Any) -> str:
    """One turn's action as short text, whitespace runs as one space: the first ``tool_calls``
    commands of its ``exec_results`` (``bash -c X`` as X), which for the suites here are the agent's
    (ShellLookup runs no setup command; the env's checks come after them and are left out; an env
    whose task setup runs in the sandbox would show its setup on the first turn), else the first
    non-empty line of its reply; at most ``ACTION_CHARS`` characters."""
    cmds = []
    for r in (turn.exec_results or ())[:turn.tool_calls]:
        c = r.command
        cmds.append(c if isinstance(c, str) else c[-1] if list(c[:2]) == ["bash", "-c"] else " ".join(map(str, c)))
    text = "; ".join(cmds) if cmds else next((x for x in (turn.action_text or "").splitlines() if x.strip()), "")
    text = " ".join(text.split())
    return text if len(text) <= ACTION_CHARS else text[:ACTION_CHARS - 3] + "..."


ACTION_CHARS = 40
TOP_BEHAVIOURS = 5
"""``eval_outcomes`` keeps the ``TOP_BEHAVIOURS`` most common action sequences of each eval."""


def eval_outcomes(run_dir: Path, run_id: str) -> tuple[dict[str, dict[str, list[float]]], dict[str, list]]:
    """From the run's replay store, the eval episodes before training (ids under
    ``<run_id>/eval-before``) and those of the last evaluated iteration. Errored samples are left
    out (never failures).

    Returns:
        ``({"before"|"after": {task_id: [1.0 or 0.0 per scored sample]}},
        {"before"|"after": [[actions, episodes, successes], ...]})``: the second holds the
        ``TOP_BEHAVIOURS`` most common action sequences (``turn_action`` per turn, joined by
        `` -> ``), most common first, with how many episodes took each and how many of those
        succeeded: what the policy does, for the report.
    """
    store = ReplayStore(f"sqlite:///{(run_dir / 'replay.db').resolve()}", read_only=True)
    out: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    seqs: dict[str, dict[str, list[int]]] = {"before": {}, "after": {}}
    summaries = store.list_episodes(run_id, limit=1_000_000, kind="eval")
    later = [s.iteration for s in summaries if "/eval-before/" not in s.episode_id]
    last = max(later) if later else None
    for s in summaries:
        when = "before" if "/eval-before/" in s.episode_id else "after" if s.iteration == last else None
        if when is None or s.is_error:
            continue
        episode = store.get_episode(s.episode_id)
        ok = episode_success(episode)
        out[when].setdefault(s.task_id, []).append(1.0 if ok else 0.0)
        count = seqs[when].setdefault(" -> ".join(turn_action(t) for t in episode.turns), [0, 0])
        count[0] += 1
        count[1] += int(ok)
    top = {w: [[k, *v] for k, v in sorted(d.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_BEHAVIOURS]]
           for w, d in seqs.items()}
    return out, top


def run_one(suite: Suite, suite_dir: str, estimator: str, seed: int, args: argparse.Namespace,
            extra: tuple[str, ...]) -> Path:
    """Train one run from scratch and write its ``result.json`` (atomically, last); returns its path."""
    from agentrl.driver.controller import train  # heavy: ray

    folder = result_path(Path(args.out), suite_dir, estimator, seed).parent
    run_dir = folder / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never half of an old one
    folder.mkdir(parents=True, exist_ok=True)
    overrides = suite.run_overrides(estimator, seed, str(run_dir), model=args.model, extra=extra)
    cfg = load_config(REPO / suite.config if suite.config else None, overrides)
    t0 = time.perf_counter()
    summary = train(cfg)
    wall_s = time.perf_counter() - t0
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    tasks, behaviours = eval_outcomes(run_dir, summary.run_id)
    result = {
        "format": 1, "complete": True, "suite": suite_dir, "estimator": estimator, "seed": seed,
        "fingerprint": suite.fingerprint(extra, args.model), "config": suite.config, "overrides": overrides,
        "wall_s": wall_s, "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_id": summary.run_id, "history": history, "eval_tasks": tasks,
        "eval_behaviours": behaviours,
    }
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    path = folder / RESULT_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, path)
    (folder / "failed.txt").unlink(missing_ok=True)
    return path


def plan(args: argparse.Namespace) -> list[tuple[Suite, str, str, int]]:
    """Every (suite, its directory name, estimator, seed) asked for, seed by seed within a suite."""
    table = suites_for(args.gpu)
    names = args.suites.split(",") if args.suites else list(DEFAULT_GPU_SUITES if args.gpu else DEFAULT_SUITES)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"--suites {','.join(unknown)}: not a suite{' of --gpu' if args.gpu else ''}; "
                         f"expected some of {', '.join(table)}")
    ests = args.estimators.split(",")
    bad = [e for e in ests if e not in ESTIMATORS]
    if bad:
        raise SystemExit(f"--estimators {','.join(bad)}: expected some of {', '.join(ESTIMATORS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    return [(table[n], n + ("-smoke" if args.smoke else ""), e, s) for n in names for s in seeds for e in ests]


README_TABLE = ("<!-- credit-table -->", "<!-- /credit-table -->")
"""The markers around the README's copy of the summary table (``--publish`` refreshes it)."""


def refresh_readme(readme: Path, summary: str | None) -> bool:
    """Put ``summary`` between the ``README_TABLE`` markers of ``readme`` (``None``: only check
    that it has them); False when it has none."""
    text = readme.read_text() if readme.is_file() else ""
    start, end = README_TABLE
    if start not in text or end not in text.split(start, 1)[1]:
        return False
    if summary is None:
        return True
    head, rest = text.split(start, 1)
    readme.write_text(f"{head}{start}\n{summary}\n{end}{rest.split(end, 1)[1]}")
    return True


def report(out: Path, publish: Path | None = None, readme: Path | None = None) -> None:
    """Print the tables, write ``report.md`` (the short table, then the full one with the
    diagnostics) and ``curves.png`` under ``out``; with ``publish``, copy both there too, and every
    finished run's result file into ``publish/results/<suite>/<run>/``; with
    ``readme``, refresh its copy of the short table (``README_TABLE``; the README shows
    ``docs/credit/``'s picture).

    Raises:
        SystemExit: no complete result yet, or ``readme`` lacks the markers.
    """
    from credit_plot import plot_curves  # matplotlib: the report path only

    by_suite = load_results(out)
    if not by_suite:
        raise SystemExit(f"no complete {RESULT_NAME} under {out}/<suite>/<run>/; run the comparison first")
    if readme is not None and not refresh_readme(readme, None):
        raise SystemExit(f"--readme {readme}: no lines {' and '.join(README_TABLE)} to put the table between")
    rep = build_report(by_suite)
    summary = format_summary(rep)
    text = f"## Summary\n\n{summary}\n\n## Every run, with its diagnostics\n\n{format_report(rep)}\n"
    behaviours = format_behaviours(by_suite)
    if behaviours:
        text += ("\n## What the policies do on the held-out tasks\n\nThe most common action sequences of "
                 f"the held-out episodes (actions joined by ->; xN: episodes, then how many of them solved "
                 f"the task).\n\n{behaviours}\n")
    (out / "report.md").write_text(text)
    png = plot_curves(by_suite, out / "curves.png")
    print(text)
    print(f"wrote {out / 'report.md'} and {png}")
    if publish is not None:
        publish.mkdir(parents=True, exist_ok=True)
        for f in (out / "report.md", Path(png)):
            shutil.copyfile(f, publish / f.name)
        copied, _ = copy_results(out, publish / "results", overwrite=True)
        print(f"copied both and {len(copied)} result file(s) into {publish}")
    if readme is not None:
        refresh_readme(readme, summary)
        print(f"refreshed the summary table in {readme}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None,
                   help="results folder (default runs/bench-credit, with -gpu and/or -smoke appended for those flags)")
    p.add_argument("--suites", default=None, help="comma list (default shell,guess; --gpu: shell,textworld)")
    p.add_argument("--estimators", default=",".join(ESTIMATORS), help="comma list (default all three)")
    p.add_argument("--seeds", default=None, help="comma list of run.seed values (default 0,1,2; --smoke: 0)")
    p.add_argument("--gpu", action="store_true", help="the GPU presets: larger model, ALFWorld-like TextWorld games")
    p.add_argument("--model", default=None, help="model.path for every run (a local folder on an offline machine)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every run (after the suite's; repeatable; enters the fingerprint)")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs in this sitting")
    p.add_argument("--smoke", action="store_true",
                   help="tiny random model, 1 iteration, 2 tasks, into <suite>-smoke: proves the pipeline, measures nothing")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's final checkpoint")
    p.add_argument("--list", action="store_true", help="print the suites, their settings and sizes, train nothing")
    p.add_argument("--report", action="store_true", help="only build the table and the PNG from the results so far")
    p.add_argument("--publish", type=Path, default=None, metavar="DIR",
                   help="with --report: copy report.md and curves.png into DIR too (docs/credit for the README), "
                        "and every finished run's result file into DIR/results (replacing those there)")
    p.add_argument("--resume-from", type=Path, default=None, metavar="DIR",
                   help="first copy DIR's finished result files (a --publish DIR/results) into --out, "
                        "so those runs are skipped (with --report: reported; only the runs of these "
                        "--suites/--seeds/--estimators, run with these settings)")
    p.add_argument("--readme", type=Path, default=None, metavar="FILE",
                   help="with --report: put the summary table between FILE's <!-- credit-table --> markers")
    args = p.parse_args(argv)
    if (args.publish or args.readme) and not args.report:
        p.error("--publish and --readme go with --report (they copy a report; they train nothing)")
    args.out = args.out or ("runs/bench-credit" + ("-gpu" if args.gpu else "") + ("-smoke" if args.smoke else ""))
    args.seeds = args.seeds or ("0" if args.smoke else "0,1,2")
    out = Path(args.out)
    extra = (*(SMOKE if args.smoke else ()), *args.extra)
    todo = plan(args)
    if args.resume_from is not None and not args.list:
        fingerprint = {f"{t[1]}/{t[2]}-s{t[3]}": t[0].fingerprint(extra, args.model) for t in todo}
        got, other = copy_results(args.resume_from, out, overwrite=False, only=fingerprint)
        print(f"{len(got)} finished run(s) copied from {args.resume_from} into {out}"
              + (f"; {len(other)} left out, run with other settings: {', '.join(map(str, other))}" if other else ""),
              flush=True)
    if args.report:
        report(out, args.publish, args.readme)
        return 0
    if args.list:
        for s in dict.fromkeys(t[0] for t in todo):
            print(f"{s.name}: {s.iterations} updates, about {s.minutes_per_run:.0f} min per run; config "
                  f"{s.config or 'code defaults'} + {' '.join(s.overrides) or '(no overrides)'}\n  {s.why}\n")
        return 0
    pending = [t for t in todo if not is_done(result_path(out, *t[1:]))]
    already = len(todo) - len(pending)
    if args.max_runs is not None:
        pending = pending[:args.max_runs]
    eta = 0.0 if args.smoke else sum(t[0].minutes_per_run for t in pending)
    print(f"{already} of {len(todo)} runs already done; {len(pending)} to run now"
          + (f", about {eta / 60:.1f} h" if eta else ""), flush=True)
    failed = 0
    for suite, suite_dir, est, seed in pending:
        t0 = time.perf_counter()
        size = "" if args.smoke else f" (about {suite.minutes_per_run:.0f} min)"
        print(f"== {suite_dir} {est} seed {seed}{size}", flush=True)
        try:
            path = run_one(suite, suite_dir, est, seed, args, extra)
        except Exception:  # one failed run must not stop the sitting; it is retried next time
            failed += 1
            folder = result_path(out, suite_dir, est, seed).parent
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "failed.txt").write_text(traceback.format_exc())
            print(f"   FAILED after {time.perf_counter() - t0:.0f} s: {folder / 'failed.txt'}", flush=True)
            continue
        print(f"   done in {(time.perf_counter() - t0) / 60:.1f} min: {path}", flush=True)
    done = sum(is_done(result_path(out, *t[1:])) for t in todo)
    print(f"{done} of {len(todo)} runs done{f', {failed} failed this sitting' if failed else ''}; "
          f"table and picture: {Path(sys.argv[0]).name} --report --out {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
