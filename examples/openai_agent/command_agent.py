"""The agent of ``sandbox_agent.py`` as a command run inside each task's sandbox, registered
as ``examples/ShellLookupCommandAgent-v0`` over ``agentrl/ShellLookup-v1``.

The command reaches the gateway through a read-only Unix socket and no network; the script
is shipped into the sandbox with the command (``AgentCommand.files``), so any image with
``python3`` and ``bash`` runs it. Train it like the function agent: ``env.id:
examples/ShellLookupCommandAgent-v0``, ``env.import_modules: [command_agent]``.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.gateway import register_agent_env
from agentrl.gateway.agent_command import AgentCommand

ENV_ID = "examples/ShellLookupCommandAgent-v0"

register_agent_env(ENV_ID, agent=AgentCommand(
    'python3 "$AGENTRL_AGENT_DIR/sandbox_agent.py"',
    files={"sandbox_agent.py": (Path(__file__).parent / "sandbox_agent.py").read_text(encoding="utf-8")},
), task_env="agentrl/ShellLookup-v1")
