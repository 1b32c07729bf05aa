"""The typer application of the ``agentrl`` command line: its command groups, the one-line
error output every command uses, and ``main`` (the console-script entry point)."""

from __future__ import annotations

import signal
import sys
from typing import Any

import typer
import typer.core
from rich.console import Console

from agentrl.errors import AgentRLError



class _OneLineUsageErrors(typer.core.TyperGroup):
    """typer's command group whose usage errors (a bad option value, an unknown option or
    command, a missing argument) are this CLI's one ``error:`` line, exit 2: the message, the
    value given where typer's message leaves it out, and the command's ``--help``. typer would
    draw them in a box broken at the console's width. ``--help`` is typer's own."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except typer.TyperException as exc:
            _usage_error(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # a subcommand's arguments are parsed in here
        except typer.TyperException as exc:
            _usage_error(exc)


def _usage_error(exc: typer.TyperException) -> None:
    """Print a usage error as one ``error:`` line and exit 2; typer's ``NoArgsIsHelpError``
    (the help of a command given no arguments) goes on to typer."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        raise exc
    message = exc.format_message().rstrip(".")
    errors = getattr(exc.__cause__, "errors", None)  # typer checks option values with pydantic
    given = errors()[0].get("input") if callable(errors) and errors() else None
    if given is not None and repr(given) not in message:
        message += f" (got {given!r})"
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f"; see '{ctx.command_path} --help'"
    say("error:", message)
    raise typer.Exit(2) from None


app = typer.Typer(help="agentrl: multi-turn agentic RL with vLLM, sandboxes, GRPO/GiGPO and FSDP2 on Ray.",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=_OneLineUsageErrors)


models_app = typer.Typer(help="Prepare models that need no hub.", no_args_is_help=True)


envs_app = typer.Typer(help="Registered environments.", no_args_is_help=True)


app.add_typer(models_app, name="models")


sandbox_app = typer.Typer(help="Sandbox maintenance.", no_args_is_help=True)


app.add_typer(envs_app, name="envs")


app.add_typer(sandbox_app, name="sandbox")


replay_app = typer.Typer(help="The replay store of a run: rerun recorded episodes.", no_args_is_help=True)


app.add_typer(replay_app, name="replay")


tasks_app = typer.Typer(help="Task difficulty: per-task pass rates under a policy.", no_args_is_help=True)


app.add_typer(tasks_app, name="tasks")


console = Console(stderr=True)


DEBUG_HELP = "Show tracebacks (and debug logs) instead of one error line."


def say(label: str, message: str, style: str = "bold red", *, message_style: str = "") -> None:
    """One message line on stderr, ``label`` (may be ``""``) in ``style``: printed with soft
    wrap, so it is never broken at the console's width (a terminal folds it on screen, a
    pipe or a log file gets it whole, whatever COLUMNS says), and as plain text, so brackets
    in a path, a value or a tool's output are not read as rich markup."""
    from rich.text import Text

    text = Text.assemble((label, style), " ") if label else Text()
    text.append(message, style=message_style)
    console.print(text, soft_wrap=True, highlight=False)


def fail(exc: BaseException, debug: bool) -> None:
    if debug:
        raise exc
    say("error:", str(exc))
    raise typer.Exit(2)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> None:  # console-script entry point
    # The CLI owns signals, sandboxes/ installs none. SIGTERM becomes SystemExit(143) so the
    # sandboxes' finalizers run (e.g. `envs check --backend docker` removes its container);
    # by default SIGTERM ends the process at once and leaves them to the next reap.
    # `train` installs its own handler while it runs (the controller's clean-up path).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app()
    except AgentRLError as exc:  # pragma: no cover - commands catch their own
        say("error:", str(exc))
        sys.exit(2)

