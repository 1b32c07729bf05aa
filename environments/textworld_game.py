"""The child process that plays ``agentrl/TextWorld-v0``'s games (``textworld_env``).

Run as a script, ``python textworld_game.py FD``, with FD one end of a socket pair. Once
``textworld`` is imported it sends ``("ready",)``, then serves ``multiprocessing.connection``
messages until the other end closes or ``("close",)`` arrives. It also ends when its parent
process does, even by SIGKILL and even while the interpreter is looping inside a step (a
watchdog thread; jericho's C calls release the GIL):

- ``("start", path, show_admissible_commands)`` -> ``("ok", view)``: the game at ``path``
  (a compiled ``.z8``) started and reset; any earlier game closed;
- ``("step", command)`` -> ``("ok", (view, game_over))``;
- an exception inside TextWorld -> ``("error", "Type: message")``.

A view is the ``GameState`` as plain values (``state_view``). It imports only the standard
library and ``textworld``, so it starts in well under a second, and not from the env's own
package: the user's ``__main__`` and environment modules are never run again. Once
``textworld`` is imported, its stdout and stderr go to /dev/null: jericho's interpreter
writes there, gigabytes when it loops (``DUMB-FROTZ: unknown command``, again and again).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any


def state_view(state: Any) -> dict[str, Any]:
    """What ``TextWorldEnv`` reads of a TextWorld ``GameState``: feedback, objective, score,
    max_score, won, lost, the sorted admissible commands, and ``digest``, the first 16 hex
    digits of the SHA-256 of the sorted world-state facts (the env's exact-state anchor)."""
    facts = "\n".join(sorted(str(f) for f in state.facts))
    return {"feedback": str(state.feedback or ""), "objective": str(state.objective or ""),
            "score": int(state.score), "max_score": int(state.max_score), "won": bool(state.won),
            "lost": bool(state.lost), "digest": hashlib.sha256(facts.encode()).hexdigest()[:16],
            "admissible_commands": sorted(str(c) for c in (state.admissible_commands or ()))}


def serve(fd: int) -> None:
    """Answer the messages on the connection ``fd`` (module docstring) until it closes."""
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True, name="watch-parent").start()
    import textworld  # an error here still reaches the env's stderr

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    conn = Connection(fd)
    conn.send(("ready",))
    game = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "close":
            return
        try:
            with warnings.catch_warnings():  # jericho: "unsupported game" (TextWorld lists commands itself)
                warnings.filterwarnings("ignore", message="Unable to find valid actions")
                if msg[0] == "start":
                    if game is not None:
                        game.close()
                        game = None
                    infos = textworld.EnvInfos(facts=True, won=True, lost=True, score=True, max_score=True,
                                               objective=True, admissible_commands=bool(msg[2]))
                    game = textworld.start(msg[1], request_infos=infos)
                    reply: Any = state_view(game.reset())
                elif msg[0] == "step" and game is not None:
                    state, _, game_over = game.step(msg[1])
                    reply = (state_view(state), bool(game_over))
                else:
                    raise ValueError(f"unknown message {msg[0]!r} (or a step before any start)")
        except Exception as exc:  # noqa: BLE001 - the env raises it as EnvError
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ok", reply))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
