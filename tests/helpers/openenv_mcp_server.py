"""A small OpenEnv MCP environment (``MCPEnvironment``, tools through FastMCP) served by
``openenv`` itself, for the OpenEnv adapter's MCP tests.

Run by the hub venv's python (``scripts/hub_venvs.sh``), never imported by agentrl or its
test process (openenv is not installed in ``.venv``)::

    <hub venv>/bin/python tests/helpers/openenv_mcp_server.py --port 8123 [--max-sessions 1]

VaultEnvironment: a vault of four drawers (``a`` to ``d``), one of which holds the code, a
word drawn from ``random.Random(seed)`` of the reset's ``seed``. Tools: ``open_drawer(name)``
shows a drawer's content (reward 0.1 the first time the drawer with the code is opened),
``enter_code(code)`` ends the episode (reward 1.0 for the right code, else 0.0). A drawer that
does not exist is a tool error (the tool raises). The reset observation tells the task.
"""

from __future__ import annotations

import argparse
import random
from typing import Any, Optional

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

DRAWERS = ("a", "b", "c", "d")
WORDS = ("amber", "birch", "cedar", "delta", "ember", "flint")


class VaultObservation(Observation):
    task: str = Field(default="", description="what to do")


class VaultEnvironment(MCPEnvironment):
    """See the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("vault")
        self._code, self._where, self._opened = "", "a", set()

        @mcp.tool()
        def open_drawer(name: str) -> str:
            """Open a drawer of the vault (a, b, c or d) and read what is inside."""
            if name not in DRAWERS:
                raise ValueError(f"there is no drawer {name!r}; the drawers are a, b, c and d")
            self._opened.add(name)
            return f"The code is {self._code}." if name == self._where else "The drawer is empty."

        @mcp.tool()
        def enter_code(code: str) -> str:
            """Enter the vault's code; this ends the attempt."""
            return "The vault opens." if code.strip().lower() == self._code else "Wrong code. The vault stays shut."

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        rng = random.Random(seed)
        self._code, self._where, self._opened = rng.choice(WORDS), rng.choice(DRAWERS), set()
        self._state = State(episode_id=episode_id, step_count=0)
        return VaultObservation(task="Find the vault's code in one of its drawers (a, b, c, d), then enter it.",
                                done=False, reward=None)

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        found_before = self._where in self._opened
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and isinstance(obs, CallToolObservation):
            self._state.step_count += 1
            if action.tool_name == "enter_code" and obs.error is None:
                right = str(action.arguments.get("code", "")).strip().lower() == self._code
                obs.done, obs.reward = True, 1.0 if right else 0.0
            elif action.tool_name == "open_drawer":
                obs.reward = 0.1 if (not found_before and self._where in self._opened) else 0.0
        return obs

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


def make_app(max_sessions: int = 8) -> Any:
    return create_app(VaultEnvironment, CallToolAction, CallToolObservation, env_name="vault",
                      max_concurrent_envs=max_sessions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-sessions", type=int, default=8)
    args = ap.parse_args()
    uvicorn.run(make_app(args.max_sessions), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
