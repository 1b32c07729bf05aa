"""A diagnosis: every check's finding plus the task classes, as JSON (``--json``) and as a
terminal report (rich). Episode links point at the viewer (``agentrl view``):
``/episode?id=EPISODE_ID`` (ids quoted; they may hold ``/``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from rich.console import Group
from rich.table import Table
from rich.text import Text

from agentrl.replay.diagnose.checks import CHECKS, Finding
from agentrl.replay.diagnose.data import MAX_EPISODES, RunData, load_run
from agentrl.replay.diagnose.tasks import TaskVerdict, classify_tasks
from agentrl.replay.store import ReplayStore


MAX_TASK_ROWS = 10
"""Hard and unsolved tasks shown per class in the terminal report (all of them in --json);
likely wrong references are always all shown."""


def episode_link(episode_id: str, base_url: str = "") -> str:
    """The viewer's URL of one episode (``base_url`` e.g. ``http://127.0.0.1:8000``, or ``""``)."""
    return f"{base_url.rstrip('/')}/episode?id={quote(episode_id, safe='')}"


@dataclass
class Diagnosis:
    """``findings``: one per check in ``CHECKS`` order; ``tasks``: every task's class;
    ``episodes``: how many were read (``truncated``: the oldest left out)."""

    run_id: str
    findings: list[Finding]
    tasks: list[TaskVerdict]
    episodes: int
    iterations: int
    truncated: bool

    def fired(self) -> list[str]:
        """Names of the checks that fire."""
        return [f.check for f in self.findings if f.fired]

    def finding(self, check: str) -> Finding:
        return next(f for f in self.findings if f.check == check)

    def to_json(self, base_url: str = "") -> dict[str, Any]:
        return {"run_id": self.run_id, "episodes": self.episodes, "iterations": self.iterations,
                "truncated": self.truncated, "fired": self.fired(),
                "findings": [{**f.to_json(), "links": [episode_link(e, base_url) for e in f.examples]}
                             for f in self.findings],
                "tasks": [{"env_id": t.env_id, "task_id": t.task_id, "class": t.verdict, "samples": t.samples,
                           "successes": t.successes, "answered": t.answered, "agreed_answer": t.agreed_answer,
                           "agree_frac": round(t.agree_frac, 4),
                           "links": [episode_link(e, base_url) for e in t.episode_ids[:3]]} for t in self.tasks]}


def diagnose_data(data: RunData) -> Diagnosis:
    """Run every check on already loaded ``data`` (pure)."""
    return Diagnosis(data.run_id, [check(data) for check in CHECKS], classify_tasks(data.episodes),
                     len(data.episodes), len(data.metrics), data.truncated)


def diagnose(store: ReplayStore, run_id: str, *, max_episodes: int = MAX_EPISODES) -> Diagnosis:
    """Load ``run_id`` from ``store`` and run every check.

    Raises:
        ContractError: ``run_id`` is not in the store.
    """
    return diagnose_data(load_run(store, run_id, max_episodes=max_episodes))


def render(d: Diagnosis, base_url: str = "") -> Group:
    """The terminal report: one row per check (fires or not, its line, example links), then
    the tasks that are not plainly fine (likely wrong references apart from hard ones)."""
    t = Table(title=f"diagnosis of {d.run_id} ({d.episodes} episodes, {d.iterations} iterations"
                    f"{', oldest left out' if d.truncated else ''})", show_lines=True)
    for col in ("symptom", "check", "fires", "what it measured", "examples"):
        t.add_column(col, overflow="fold")
    for f in d.findings:
        t.add_row(f.symptom, f.check, Text("FIRES", style="bold red") if f.fired else Text("no", style="green"),
                  f.summary, "\n".join(episode_link(e, base_url) for e in f.examples[:3]))
    parts: list[Any] = [t]
    odd = [x for x in d.tasks if x.verdict in ("wrong_reference", "hard", "unsolved")]
    if odd:
        tt = Table(title="tasks: likely wrong references, then hard (rare successes), then unsolved")
        for col in ("class", "env", "task", "samples", "successes", "agreed answer", "example"):
            tt.add_column(col, overflow="fold")
        shown = 0
        for verdict, most in (("wrong_reference", None), ("hard", MAX_TASK_ROWS), ("unsolved", MAX_TASK_ROWS)):
            rows = sorted((x for x in odd if x.verdict == verdict), key=lambda x: x.task_id)
            for x in rows[:most]:
                answer = x.agreed_answer if len(x.agreed_answer) <= 40 else x.agreed_answer[:37] + "..."
                tt.add_row(verdict, x.env_id, x.task_id, str(x.samples), str(x.successes),
                           f"{answer!r} ({x.agree_frac:.0%})", episode_link(x.episode_ids[0], base_url))
                shown += 1
            if most is not None and len(rows) > most:
                tt.add_row(verdict, "", f"... {len(rows) - most} more (--json lists all)", "", "", "", "")
        parts.append(tt)
    fired = d.fired()
    parts.append(Text(f"fires: {', '.join(fired)}" if fired else "no check fires", style="bold"))
    return Group(*parts)


__all__ = ["Diagnosis", "diagnose", "diagnose_data", "episode_link", "render"]
