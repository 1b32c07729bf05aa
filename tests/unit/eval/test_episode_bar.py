"""``agentrl eval`` / ``tasks profile``'s progress bar (``agentrl.eval.report.EpisodeBar``): the
phase, the budget line above the bar, then episodes finished / requested with the time left,
on a real rich console recording what it drew."""

from __future__ import annotations

import io

from rich.console import Console

from agentrl.eval.report import episode_progress

SETTINGS = {"env": "agentrl/GuessNumber-v0", "split": "test", "tasks": 2, "samples": 3, "seed": 0, "temperature": 1.0,
            "top_p": 1.0, "top_k": -1, "max_turns": 3, "max_new_tokens": 256, "max_context_tokens": 2048,
            "budget_source": "the built-in eval defaults (agentrl.config)"}


def test_the_bar_shows_the_budget_then_episodes_of_the_total():
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with episode_progress(console, "evaluating") as bar:
        bar.phase("starting the engines")
        bar.settings(SETTINGS)
        bar.episodes(0, 6)
        bar.episodes(4, 6)
        task = bar.p.tasks[0]
        assert (task.total, task.completed, task.description) == (6, 4, "episodes")
        bar.episodes(6, 6)
        assert bar.p.tasks[0].finished
    text = out.getvalue()
    assert "budget: temperature 1 (top_p 1, top_k off), max_turns 3, max_new_tokens 256" in text
    assert "from the built-in eval defaults (agentrl.config); 2 tasks x 3 samples" in text
    assert "6/6" in text and "ETA" in text


def test_nothing_is_drawn_before_the_first_phase():
    """A command that fails before its first phase (a missing target) prints its error alone:
    no empty ``evaluating 0/? ETA`` line is left on a pipe before it."""
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    try:
        with episode_progress(console, "evaluating") as bar:
            raise ValueError("the target does not exist")
    except ValueError:
        pass
    assert out.getvalue() == "" and not bar.started
    with episode_progress(console, "evaluating") as bar:
        bar.phase("starting the engines")
    assert "starting the engines" in out.getvalue()
