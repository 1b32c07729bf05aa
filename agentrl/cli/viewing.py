"""``agentrl view`` and ``agentrl diagnose``: the replay viewer and the symptom checks of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
from rich.console import Console

from agentrl.errors import AgentRLError

from agentrl.cli.app import app, console, DEBUG_HELP, say, fail


@app.command()
def view(
    target: str = typer.Argument(..., help="A run directory, its replay.db, or a database URL (sqlite:///..., postgresql+psycopg://...)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind. Anything but loopback exposes the runs' data to the network and prints a warning."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Browse runs, episodes, turns, sandbox commands and tokens in a read-only web viewer."""
    from agentrl.replay.viewer import LOOPBACK, open_db, serve

    try:
        db = open_db(target, run_dir_replay_url(Path(target)))
    except AgentRLError as exc:
        fail(exc, debug)
        return
    if host not in LOOPBACK:
        say("warning:", f"--host {host} serves every run's episodes, sandbox output and config to the network "
                         "without authentication; use 127.0.0.1 unless that is intended", "bold yellow")
    say("", f"agentrl view: {db.url} on http://{'[' + host + ']' if ':' in host else host}:{port}/  (Ctrl-C stops)")
    try:
        serve(db, host=host, port=port, token_text=token_text())
    finally:
        db.close()


@app.command()
def diagnose(
    target: str = typer.Argument(..., help="A run directory, its replay.db, or a database URL (sqlite:///..., postgresql+psycopg://...)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id in that store (default: its only run, else its newest training run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as one JSON object on stdout instead of the report."),
    base_url: str = typer.Option("", "--base-url", help="Viewer address the example links start with, e.g. http://127.0.0.1:8765 (default: bare /episode?id=... paths)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Check each row of the symptom table (reward flat, reward up but eval flat, answers
    converging, responses growing, loss or ratio spikes, async faster but worse) against a
    run's own metrics and episodes: which checks fire, the numbers behind each, and example
    episodes to open in `agentrl view`; tasks whose samples agree on an answer the judge
    rejects are listed as likely wrong references, apart from hard ones. Exit 0 when no check
    fires, 1 when one does, 2 on an error."""
    import json

    from agentrl.replay.diagnose import diagnose as run_diagnosis
    from agentrl.replay.diagnose import print_report
    from agentrl.replay.read import ReadOnlyDB
    from agentrl.replay.viewer import resolve_db_url

    try:
        url = resolve_db_url(target, run_dir_replay_url(Path(target)))
        # read-only and without migrating, as the viewer: a database of an older schema
        # (one a trainer of that version may still be writing) is read as it is
        db = ReadOnlyDB(url)
        try:
            run_id = run if run is not None else default_run(db)
            with console.status(f"reading {run_id}"):
                d = run_diagnosis(db, run_id)
        finally:
            db.close()
    except AgentRLError as exc:
        fail(exc, debug)
        return
    if as_json:
        typer.echo(json.dumps(d.to_json(base_url), default=str))
    else:
        print_report(d, Console(), base_url)
    raise typer.Exit(1 if d.fired() else 0)


def default_run(db: Any) -> str:
    """The database's only run, else its newest run that is not an eval run."""
    from agentrl.errors import ConfigError
    from agentrl.replay.read import list_runs

    runs = list_runs(db)
    if len(runs) == 1:
        return runs[0].run_id
    train = [r for r in runs if (r.config or {}).get("kind") != "eval"] or runs
    if not train:
        raise ConfigError(f"{db.url} holds no runs")
    return max(train, key=lambda r: r.created_at).run_id


def run_dir_replay_url(path: Path) -> Optional[str]:
    """``replay.url`` of a run directory's config.yaml, when the run did not use its replay.db."""
    import yaml

    try:
        cfg = yaml.safe_load((path / "config.yaml").read_text()) if path.is_dir() else None
    except (OSError, yaml.YAMLError):
        return None
    url = ((cfg or {}).get("replay") or {}).get("url") if isinstance(cfg, dict) else None
    return str(url) if url else None


def token_text() -> Any:
    """``(model_path, ids) -> texts | None`` for the viewer's token view: the run's tokenizer
    (``agentrl.model_zoo.token_text``: loaded once per model; the viewer preloads the runs'
    ones when it starts), None when it cannot be loaded (the viewer shows ids)."""
    from agentrl.model_zoo.token_text import TokenTexts

    return TokenTexts()

