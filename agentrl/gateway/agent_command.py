"""An agent that is a command run inside the task's sandbox: a coding CLI, a harness in
another language, any program that speaks OpenAI's Chat Completions API.

The command runs in the episode's sandbox, whose network stays off (``network: none``, on
both backends). The gateway's Unix socket is bound read-only into the sandbox
(``SandboxSpec.ro_mounts``, ``GatewayServer.mount()``), and the command runs under the
forwarder (``agentrl.gateway.forwarder``), which listens on the sandbox's own loopback and
copies each connection to that socket: the command reaches the gateway and no other address.
It sees:

* ``OPENAI_BASE_URL`` (its session's, on the sandbox's loopback) and ``OPENAI_API_KEY`` (the
  session's chat key: it cannot post a reward, which has a key of its own that never
  enters the sandbox, since the model's own tool calls run there too);
* ``AGENTRL_TASK_FILE``: JSON ``{"task_id", "messages", "tools"}`` (what the task env would
  prompt with, and its tools as OpenAI function schemas); ``AGENTRL_AGENT_DIR``: the private
  directory holding it and ``AgentCommand.files``; ``AGENTRL_SESSION_ID``,
  ``AGENTRL_TASK_ID``, ``AGENTRL_MODEL``.

It runs its tools itself, in the sandbox; the task's verifier scores the sandbox when it
exits 0. A non-zero exit, a run past its ``timeout_s`` or a sandbox failure ends the episode
as an infrastructure error (never scored). When the episode ends first (its turn limit, a
cut by the run's token budget), the session closes, its lifeline ends, and the forwarder
kills the command before the sandbox serves anything else; a command that stopped its
forwarder has its sandbox closed or, pooled, replaced (``AgentEnv``).
"""

from __future__ import annotations

import json
import logging
import posixpath
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError, EnvError
from agentrl.gateway.agent_task import AgentTask
from agentrl.gateway.server import FORWARDER_NAME, SANDBOX_GATEWAY_DIR, SOCKET_NAME
from agentrl.gateway.session import AgentSession

log = logging.getLogger(__name__)

_STDERR_TAIL_CHARS = 2000
TASK_FILE_NAME = "task.json"
"""The task's file in ``AGENTRL_AGENT_DIR`` (the forwarder writes it; ``AGENTRL_TASK_FILE``)."""
_RESERVED_ENV = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "AGENTRL_TASK_FILE", "AGENTRL_AGENT_DIR",
                 "AGENTRL_SESSION_ID", "AGENTRL_TASK_ID", "AGENTRL_MODEL")


@dataclass(frozen=True)
class AgentCommand:
    """An agent command (module docstring).

    Attributes:
        command: a shell string (run by ``/bin/sh -c``) or an argv list, run in the task's
            working directory.
        env: extra variables it sees (not the ones the gateway sets).
        files: ``{relative name: text}`` written into ``AGENTRL_AGENT_DIR`` before it starts
            (the agent's own script, for a sandbox image that lacks it); a file starting with
            ``#!`` is made executable.
        python: the sandbox's Python that runs the forwarder.

    Raises:
        ConfigError: an empty command, a reserved variable in ``env``, a file name that is
            not a normalised relative path, is ``task.json``, or is another file's directory,
            or a file whose text is not valid UTF-8.
    """

    command: str | Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    python: str = "python3"

    def __post_init__(self) -> None:
        if isinstance(self.command, str):
            if not self.command.strip():
                raise ConfigError("command='' is empty; expected a shell string or an argv list")
        elif not self.command or not all(isinstance(a, str) for a in self.command):
            raise ConfigError(f"command={self.command!r}; expected a shell string or a non-empty list of str")
        for name in self.env:
            if name in _RESERVED_ENV:
                raise ConfigError(f"env[{name!r}] is set by the gateway for each episode; leave it out")
        names = list(self.files)
        for name, text in self.files.items():
            if not isinstance(name, str) or not name or name.startswith("/") or posixpath.normpath(name) != name \
                    or name == "." or name.split("/")[0] == ".." or "\0" in name:
                raise ConfigError(f"files[{name!r}]: expected a normalised relative name inside the agent directory "
                                  "(e.g. 'agent.py' or 'lib/util.py')")
            if name == TASK_FILE_NAME:
                raise ConfigError(f"files[{name!r}]: that name holds the task (AGENTRL_TASK_FILE); choose another")
            if any(other.startswith(name + "/") for other in names):
                raise ConfigError(f"files[{name!r}] is a file and the directory of another file; rename one")
            try:
                if not isinstance(text, str):
                    raise TypeError(type(text).__name__)
                text.encode("utf-8")
            except (TypeError, UnicodeEncodeError) as exc:
                raise ConfigError(f"files[{name!r}]: expected text that is valid UTF-8 ({exc})") from None

    def argv(self, session_id: str) -> list[str]:
        """What the sandbox runs: the forwarder, then the command."""
        cmd = ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)
        return [self.python, f"{SANDBOX_GATEWAY_DIR}/{FORWARDER_NAME}", "--socket",
                f"{SANDBOX_GATEWAY_DIR}/{SOCKET_NAME}", "--session", session_id, "--", *cmd]


class CommandRunner:
    """Runs one episode's agent command in its sandbox, in a thread, and reports its end to
    the session (``agent_finished(None)`` on exit 0, else ``agent_failed``). Same interface
    as ``AgentRunner``; ``cancel()`` only marks it (closing the session ends the command
    through the forwarder's lifeline); ``join`` waits for the exec to return.

    Args:
        command: the agent command.
        task: the episode's task (its id, messages and tools go into ``AGENTRL_TASK_FILE``).
        session: the episode's session (opened with a separate reward key).
        sandbox: the episode's sandbox (a ``sandboxes.Sandbox``; ``exec`` is all it uses).
        timeout_s: the exec's limit in seconds.
    """

    def __init__(self, command: AgentCommand, task: AgentTask, session: AgentSession, sandbox: Any,
                 timeout_s: float) -> None:
        self.command, self.task, self.session, self.sandbox = command, task, session, sandbox
        self.timeout_s = float(timeout_s)
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"agentrl-agent-cmd-{session.session_id[:8]}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled = True

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the command's exec to return; True if it has."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        sid = self.session.session_id
        payload = {"task": {"task_id": self.task.task_id, "messages": self.task.messages, "tools": self.task.tools},
                   "files": dict(self.command.files)}
        env = {**self.command.env, "OPENAI_API_KEY": self.session.key, "AGENTRL_SESSION_ID": sid,
               "AGENTRL_TASK_ID": self.task.task_id, "AGENTRL_MODEL": self.session.settings.model_name}
        try:
            res = self.sandbox.exec(self.command.argv(sid), stdin=json.dumps(payload), env=env,
                                    timeout_s=self.timeout_s)
        except BaseException as exc:  # the sandbox failed: an infrastructure error
            if not self._cancelled:
                self.session.agent_failed(exc)
            return
        if self._cancelled:  # its episode had ended: the forwarder stopped it
            log.debug("the agent command of task %r stopped with its episode: exit %s, stderr %r",
                      self.task.task_id, res.exit_code, (res.stderr or "")[-_STDERR_TAIL_CHARS:])
            return
        what = f"the agent command {_show(self.command.command)} of task {self.task.task_id!r}"
        tail = (res.stderr or "")[-_STDERR_TAIL_CHARS:].strip()
        if res.timed_out:
            self.session.agent_failed(EnvError(f"{what} ran past its {self.timeout_s:g} s; stderr: {tail!r}"))
        elif res.exit_code == 0:
            self.session.agent_finished(None)
        elif res.exit_code == 127 and not tail.startswith("agentrl-forward"):
            self.session.agent_failed(EnvError(
                f"{what} could not start (exit 127): the sandbox needs {self.command.python!r} for the gateway's "
                f"forwarder, and the command itself; stderr: {tail!r}"))
        else:
            self.session.agent_failed(EnvError(f"{what} exited {res.exit_code}; stderr: {tail!r}"))


def _show(command: str | Sequence[str]) -> str:
    text = command if isinstance(command, str) else shlex.join(command)
    return repr(text if len(text) <= 120 else text[:117] + "...")
