"""A diagnosis: every check's finding plus the task classes, as JSON (``--json``) and as a
terminal report (rich). Episode links point at the viewer (``agentrl view``):
``/episode?id=EPISODE_ID`` (ids quoted; they may hold ``/``).

Task classes count training episodes only (kind ``train``): eval and difficulty-profile
episodes are sampled with other settings (eval at its own temperature, where samples agree
more easily) and are left out, not counted separately; ``Diagnosis.other_episodes`` says how
many. A run without training episodes (an eval run) is classed on the episodes it has.

The judge section (``agentrl.replay.diagnose.judge``) follows the symptom table: its checks
of the stored judgements, or one line saying the run has none."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentrl.replay.diagnose.checks import CHECKS, Finding, training_episodes
from agentrl.replay.diagnose.data import MAX_EPISODES, RunData, RunSource, load_run
from agentrl.replay.diagnose.judge import judge_findings
from agentrl.replay.diagnose.tasks import TaskVerdict, classify_tasks

MAX_TASK_ROWS = 10
"""Hard and unsolved tasks shown per class in the terminal report (all of them in --json);
likely wrong references are always all shown."""


def episode_link(episode_id: str, base_url: str = "") -> str:
    """The viewer's URL of one episode (``base_url`` e.g. ``http://127.0.0.1:8000``, or ``""``)."""
    return f"{base_url.rstrip('/')}/episode?id={quote(episode_id, safe='')}"


@dataclass
class Diagnosis:
    """``findings``: one per check in ``CHECKS`` order; ``tasks``: every task's class, from
    the training episodes; ``episodes``: how many were read (``truncated``: the oldest left
    out); ``other_episodes``: those of them left out of the task classes and the per-task
    checks (eval and profile episodes of a training run); ``judge``: the judge checks'
    findings (``agentrl.replay.diagnose.judge``), empty when ``judgements`` (judged training
    episodes) is 0."""

    run_id: str
    findings: list[Finding]
    tasks: list[TaskVerdict]
    episodes: int
    iterations: int
    truncated: bool
    other_episodes: int = 0
    judge: list[Finding] = field(default_factory=list)
    judgements: int = 0

    def fired(self) -> list[str]:
        """Names of the checks that fire, the judge's included."""
        return [f.check for f in (*self.findings, *self.judge) if f.fired]

    def finding(self, check: str) -> Finding:
        """The finding of ``check`` (a judge check's too); raises StopIteration for an unknown name."""
        return next(f for f in (*self.findings, *self.judge) if f.check == check)

    def to_json(self, base_url: str = "") -> dict[str, Any]:
        return {"run_id": self.run_id, "episodes": self.episodes, "iterations": self.iterations,
                "truncated": self.truncated, "other_episodes": self.other_episodes, "fired": self.fired(),
                "skipped": [f.check for f in (*self.findings, *self.judge) if f.skipped is not None],
                "findings": [{**f.to_json(), "links": [episode_link(e, base_url) for e in f.examples]}
                             for f in self.findings],
                "judge": {"judgements": self.judgements,
                          "findings": [{**f.to_json(), "links": [episode_link(e, base_url) for e in f.examples]}
                                       for f in self.judge]},
                "tasks": [{"env_id": t.env_id, "task_id": t.task_id, "class": t.verdict, "samples": t.samples,
                           "successes": t.successes, "answered": t.answered, "agreed_answer": t.agreed_answer,
                           "agree_frac": round(t.agree_frac, 4),
                           "links": [episode_link(e, base_url) for e in t.episode_ids[:3]]} for t in self.tasks]}


def diagnose_data(data: RunData) -> Diagnosis:
    """Run every check on already loaded ``data`` (pure)."""
    train = training_episodes(data)
    judged, judge = judge_findings(data)
    return Diagnosis(data.run_id, [check(data) for check in CHECKS], classify_tasks(train),
                     len(data.episodes), len(data.metrics), data.truncated, len(data.episodes) - len(train),
                     judge, judged)


def diagnose(source: RunSource, run_id: str, *, max_episodes: int = MAX_EPISODES) -> Diagnosis:
    """Load ``run_id`` from ``source`` (a ``ReplayDB`` or a ``ReplayStore``; see ``load_run``)
    and run every check.

    Raises:
        ContractError: ``run_id`` is not in the database.
    """
    return diagnose_data(load_run(source, run_id, max_episodes=max_episodes))


def _fires(f: Finding) -> Text:
    if f.fired:
        return Text("FIRES", style="bold red")
    if f.skipped is not None:
        return Text("skipped", style="yellow")  # the reason is its summary, in the next column
    return Text("no", style="green")


def _links(title: str, rows: list[tuple[str, str]], console: Console) -> None:
    """``title``, then one ``label  link`` line per row, printed with soft wrap: never
    wrapped or cut at the console's width, so a link stays whole and clickable in a
    terminal, a pipe and a log file alike."""
    if not rows:
        return
    console.print(Text(title, style="bold"), soft_wrap=True)
    width = max(len(label) for label, _ in rows)
    for label, link in rows:
        console.print(Text(f"  {label.ljust(width)}  {link}"), soft_wrap=True)


def print_report(d: Diagnosis, console: Console, base_url: str = "") -> None:
    """Print the terminal report on ``console``: one row per check (fires, no, or skipped,
    and its line: for a skipped check, why it could not run), the example episodes of each check,
    the judge section (its checks, or "no judgements"), then the training tasks that are not
    plainly fine (likely wrong references apart from hard ones) and an example of each. The tables wrap to the console's width; links are
    printed below them, one per line, never wrapped (``_links``)."""
    other = f"; {d.other_episodes} eval/profile episodes not counted" if d.other_episodes else ""
    t = Table(title=f"diagnosis of {d.run_id} ({d.episodes} episodes, {d.iterations} iterations"
                    f"{', oldest left out' if d.truncated else ''}{other})", show_lines=True)
    for col in ("symptom", "check", "fires", "what it measured"):
        t.add_column(col, overflow="fold")
    for f in d.findings:
        t.add_row(f.symptom, f.check, _fires(f), f.summary)
    console.print(t)
    _links("examples (open in `agentrl view`):",
           [(f.check, episode_link(e, base_url)) for f in d.findings for e in f.examples[:3]], console)
    if d.judge:
        jt = Table(title=f"judge ({d.judgements} judged training episodes)", show_lines=True)
        for col in ("check", "fires", "what it measured"):
            jt.add_column(col, overflow="fold")
        for f in d.judge:
            jt.add_row(f.check, _fires(f), f.summary)
        console.print(jt)
        _links("judge examples (open in `agentrl view`):",
               [(f.check, episode_link(e, base_url)) for f in d.judge for e in f.examples[:3]], console)
    else:
        console.print(Text("judge: no judgements in this run (no judge, or a database of schema 9 or older)"),
                      soft_wrap=True)
    odd = [x for x in d.tasks if x.verdict in ("wrong_reference", "hard", "unsolved")]
    if odd:
        tt = Table(title="training tasks: likely wrong references, then hard (rare successes), then unsolved")
        for col in ("class", "env", "task", "samples", "successes", "agreed answer"):
            tt.add_column(col, overflow="fold")
        examples: list[tuple[str, str]] = []
        for verdict, most in (("wrong_reference", None), ("hard", MAX_TASK_ROWS), ("unsolved", MAX_TASK_ROWS)):
            rows = sorted((x for x in odd if x.verdict == verdict), key=lambda x: x.task_id)
            for x in rows[:most]:
                answer = x.agreed_answer if len(x.agreed_answer) <= 40 else x.agreed_answer[:37] + "..."
                tt.add_row(verdict, x.env_id, x.task_id, str(x.samples), str(x.successes),
                           f"{answer!r} ({x.agree_frac:.0%})")
                examples.append((x.task_id, episode_link(x.episode_ids[0], base_url)))
            if most is not None and len(rows) > most:
                tt.add_row(verdict, "", f"... {len(rows) - most} more (--json lists all)", "", "", "")
        console.print(tt)
        _links("an example episode of each task:", examples, console)
    fired = d.fired()
    skipped = [f.check for f in (*d.findings, *d.judge) if f.skipped is not None]
    line = f"fires: {', '.join(fired)}" if fired else "no check fires"
    if skipped:
        line += f" ({len(skipped)} skipped: {', '.join(skipped)})"
    console.print(Text(line, style="bold"), soft_wrap=True)


__all__ = ["Diagnosis", "diagnose", "diagnose_data", "episode_link", "print_report"]
