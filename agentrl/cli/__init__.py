"""The ``agentrl`` command line: one entry point, thin. User mistakes are reported as one
clear line (no traceback); ``--debug`` shows tracebacks. ``app`` (``agentrl.cli.app``) holds
the command groups; each module here adds its commands to it when imported."""

from __future__ import annotations

# Each module adds its commands to `app` when imported, in the order --help lists them.
from agentrl.cli import train, evaluation, maintenance, viewing  # noqa: F401, I001
from agentrl.cli.app import app, main

__all__ = ["app", "main"]
