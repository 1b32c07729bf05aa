"""How an evaluation reads in a terminal: the settings it ran with, and its numbers."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from agentrl.eval.passk import Estimate, EvalReport

__all__ = ["EpisodeBar", "episode_progress", "format_budget", "format_settings", "report_table",
           "training_eval_lines"]


def format_settings(settings: Mapping[str, Any], policy_version: int) -> str:
    """One line: what was evaluated with which fixed sampling configuration and budget, and
    which judge scored it (``settings["judge"]``, ``agentrl.driver.judge.judge_label``)."""
    s = settings
    judge = f"; {s['judge']}" if s.get("judge") else ""
    return (f"eval of policy version {policy_version} on {s['env']} split {s['split']}: {s['tasks']} tasks x "
            f"{s['samples']} samples, seed {s['seed']}; sampling temperature {s['temperature']:g}, top_p "
            f"{s['top_p']:g}, top_k {s['top_k']}; budget max_turns {s['max_turns']}, max_new_tokens "
            f"{s['max_new_tokens']}, max_context_tokens {s['max_context_tokens']}; intervals: "
            f"{s['confidence']:.0%} bootstrap over tasks ({s['num_resamples']} resamples){judge}")


def format_budget(settings: Mapping[str, Any]) -> str:
    """One line, printed before an evaluation rolls out: its sampling budget and where it
    comes from (``settings["budget_source"]``, ``agentrl.commands.evaluate.budget_source``),
    with the tasks and samples it will roll out."""
    s = settings
    top_k = "off" if s["top_k"] in (-1, 0, None) else s["top_k"]
    source = f"; from {s['budget_source']}" if s.get("budget_source") else ""
    return (f"budget: temperature {s['temperature']:g} (top_p {s['top_p']:g}, top_k {top_k}), max_turns "
            f"{s['max_turns']}, max_new_tokens {s['max_new_tokens']}, max_context_tokens {s['max_context_tokens']}"
            f"{source}; {s['tasks']} tasks x {s['samples']} samples of {s['env']} split {s['split']}, seed {s['seed']}")


def _cell(e: Estimate, fmt: str = "{:.3f}") -> tuple[str, str, str]:
    if e.value is None:
        return "undefined", "-", str(e.num_tasks)
    return fmt.format(e.value), f"[{fmt.format(e.low)}, {fmt.format(e.high)}]", str(e.num_tasks)


def report_table(report: EvalReport) -> Table:
    """pass@1..n, mean reward (each with its interval and the tasks it is over), then tokens
    and sample counts in the caption."""
    t = Table(title="held-out evaluation", caption=(
        f"{report.samples_scored} samples scored, {report.samples_errored} errored (left out of n, never failures); "
        f"{report.tokens_generated} tokens generated ({report.tokens_per_sample:.1f} per sample); "
        "pass@k undefined where fewer than k samples of a task were scored"))
    for name in ("metric", "value", f"{report.confidence:.0%} interval", "tasks"):
        t.add_column(name, justify="right")
    for k, est in report.pass_at.items():
        t.add_row(f"pass@{k}", *_cell(est))
    t.add_row("reward mean", *_cell(report.reward_mean))
    return t


def _eval_line(row: Mapping[str, Any], prefix: str, when: str) -> str:
    def num(key: str) -> float | None:
        v = row.get(f"{prefix}/{key}")
        return None if v is None or v != v else float(v)  # NaN (undefined) and None alike

    p, lo, hi = num("pass@1"), num("pass@1_low"), num("pass@1_high")
    version, tasks = num("policy_version"), num("tasks")
    scored, errored = num("samples_scored"), num("samples_errored")
    value = "undefined" if p is None else f"{p:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")
    per_task = f" x {scored / tasks:g} samples" if tasks and scored is not None else ""
    return (f"held-out eval {when} (policy version {version:.0f}): pass@1 {value} over {tasks or 0:.0f} tasks"
            f"{per_task} ({scored or 0:.0f} scored, {errored or 0:.0f} errored)")


def training_eval_lines(history: list[Mapping[str, Any]], judge: str | None = None) -> list[str]:
    """The end of ``agentrl train``'s summary: held-out pass@1 with its interval (the
    bootstrap over tasks, ``eval.confidence``) before training (``eval_before/*``, from
    ``eval.before_training``) and after the last evaluated iteration (``eval/*``, from
    ``eval.after_training`` or ``eval.every``), each with its policy version, tasks and
    samples; the lines of evaluations the run did not make are left out. Samples per task is
    the scored count over tasks (errored samples are left out of n). ``judge``
    (``agentrl.driver.judge.judge_label``) ends each line: which judge scored the evals."""
    lines = []
    before = next((row for row in history if row.get("eval_before/policy_version") is not None), None)
    if before is not None:
        lines.append(_eval_line(before, "eval_before", "before training"))
    after = next((row for row in reversed(history) if row.get("eval/policy_version") is not None), None)
    if after is not None:
        last = history[-1] is after
        it = after.get("eval/iteration", after.get("iteration"))  # async: the iteration it measured, not its line's
        when = "after training" if last else f"after iteration {it:.0f}" if it is not None else "during training"
        lines.append(_eval_line(after, "eval", when))
    return [f"{line}; {judge}" for line in lines] if judge else lines


class EpisodeBar:
    """``agentrl eval`` / ``agentrl tasks profile``'s progress bar: the phase (exporting,
    starting the engines, ...), the budget line (``format_budget``) when the settings are
    known, then episodes finished / requested with the time left (rich's estimate from the
    rate so far). Its methods are ``agentrl.commands.evaluate.evaluate``'s ``progress``,
    ``on_settings`` and ``on_episodes``. The bar is started by the first phase or episode
    count: a command that fails before (a missing target, a bad override) prints its error
    alone, without an empty bar before it."""

    def __init__(self, progress: Progress, what: str) -> None:
        self.p = progress
        self.what = what
        self.task: Any = None

    @property
    def started(self) -> bool:
        return self.task is not None

    def _task(self) -> Any:
        if self.task is None:
            self.p.start()
            self.task = self.p.add_task(self.what, total=None)
        return self.task

    def phase(self, name: str) -> None:
        self.p.update(self._task(), description=name)

    def settings(self, settings: Mapping[str, Any]) -> None:
        self.p.console.print(Text(format_budget(settings)), soft_wrap=True, highlight=False)

    def episodes(self, done: int, total: int) -> None:
        self.p.update(self._task(), description="episodes", total=total, completed=done)


@contextmanager
def episode_progress(console: Console, what: str) -> Iterator[EpisodeBar]:
    """An ``EpisodeBar`` on ``console`` (kept on screen when done, once started), ``what`` its
    description until the first phase names itself."""
    p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                 TimeRemainingColumn(), TimeElapsedColumn(), console=console, transient=False)
    bar = EpisodeBar(p, what)
    try:
        yield bar
    finally:
        if bar.started:
            p.stop()
