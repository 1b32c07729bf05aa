"""How an evaluation reads in a terminal: the settings it ran with, and its numbers."""

from __future__ import annotations

from typing import Any, Mapping

from rich.table import Table

from agentrl.eval.passk import Estimate, EvalReport

__all__ = ["format_settings", "report_table"]


def format_settings(settings: Mapping[str, Any], policy_version: int) -> str:
    """One line: what was evaluated with which fixed sampling configuration and budget."""
    s = settings
    return (f"eval of policy version {policy_version} on {s['env']} split {s['split']}: {s['tasks']} tasks x "
            f"{s['samples']} samples, seed {s['seed']}; sampling temperature {s['temperature']:g}, top_p "
            f"{s['top_p']:g}, top_k {s['top_k']}; budget max_turns {s['max_turns']}, max_new_tokens "
            f"{s['max_new_tokens']}, max_context_tokens {s['max_context_tokens']}; intervals: "
            f"{s['confidence']:.0%} bootstrap over tasks ({s['num_resamples']} resamples)")


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
