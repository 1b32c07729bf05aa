"""A small OpenEnv environment served by ``openenv`` itself, for the OpenEnv adapter's tests.

Run by the hub venv's python (``scripts/hub_venvs.sh``), never imported by agentrl or its
test process (openenv is not installed in ``.venv``)::

    <hub venv>/bin/python tests/helpers/openenv_guess_server.py --port 8123 [--max-sessions 1]
        [--action text|int]

GuessServer: find a secret whole number from 1 to 16 in at most 4 guesses. The secret is drawn
from ``random.Random(seed)`` of the reset's ``seed``. Per-step rewards: 1.0 for the right
guess, 0.1 for a guess inside the interval still consistent with the feedback (a useful guess),
0.0 otherwise. The observation has ``feedback`` (text), ``low``, ``high`` (that interval), and
in ``metadata`` the guesses made so far.

``--action text``: the action is ``{"guess": str}`` (one text field: the adapter sends the
raw reply; the first number in it is the guess); ``int``: ``{"guess": int}`` (a JSON reply).
``--max-sessions 1`` (default) serves one WebSocket session at a time and refuses a second
(``CAPACITY_REACHED``); more than 1 marks the environment ``SUPPORTS_CONCURRENT_SESSIONS``.

``GET /debug/sessions`` answers ``{"open": n}``: the environments created for WebSocket
sessions and not yet closed (openenv closes a session's environment when its socket ends).
"""

from __future__ import annotations

import argparse
import random
import re
import threading
from typing import Any, Optional

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

LOW, HIGH, MAX_GUESSES = 1, 16, 4
_open_lock = threading.Lock()
_open = {"n": 0}  # environments of live sessions (this server process's own count)


class GuessText(Action):
    guess: str = Field(description="your guess: a whole number from 1 to 16")


class GuessInt(Action):
    guess: int = Field(description="your guess, from 1 to 16")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="what the last guess told")
    low: int = Field(default=LOW, description="the secret is at least this")
    high: int = Field(default=HIGH, description="the secret is at most this")


class GuessEnvironment(Environment):
    """One game per reset; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = False

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._secret = LOW
        self._low, self._high, self._guesses = LOW, HIGH, []
        self._closed = False
        with _open_lock:
            _open["n"] += 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._secret = random.Random(seed).randint(LOW, HIGH)
        self._low, self._high, self._guesses = LOW, HIGH, []
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback=f"Guess the secret number from {LOW} to {HIGH}.", low=LOW, high=HIGH,
                                done=False, reward=None, metadata={"guesses": []})

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        raw = action.guess
        m = re.search(r"-?[0-9]+", raw) if isinstance(raw, str) else None
        guess = raw if isinstance(raw, int) else int(m.group()) if m else None
        reward = 0.0
        if guess is None:
            feedback = "No number in your guess."
        elif guess == self._secret:
            feedback, reward = f"{guess} is correct!", 1.0
        else:
            if self._low <= guess <= self._high:
                reward = 0.1
            if guess < self._secret:
                self._low = max(self._low, guess + 1)
                feedback = f"{guess} is too low."
            else:
                self._high = min(self._high, guess - 1)
                feedback = f"{guess} is too high."
        self._guesses.append(guess)
        done = reward == 1.0 or len(self._guesses) >= MAX_GUESSES
        return GuessObservation(feedback=feedback, low=self._low, high=self._high, done=done, reward=reward,
                                metadata={"guesses": list(self._guesses)})

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with _open_lock:
                _open["n"] -= 1


class ConcurrentGuessEnvironment(GuessEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True


def make_app(max_sessions: int = 1, action: str = "text") -> Any:
    """The FastAPI app: ``create_app`` of the game, plus ``GET /debug/sessions``."""
    env_cls = ConcurrentGuessEnvironment if max_sessions > 1 else GuessEnvironment
    action_cls = GuessText if action == "text" else GuessInt
    app = create_app(env_cls, action_cls, GuessObservation, env_name="guess", max_concurrent_envs=max_sessions)

    @app.get("/debug/sessions")
    def debug_sessions() -> dict[str, int]:
        with _open_lock:
            return {"open": _open["n"]}

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-sessions", type=int, default=1)
    ap.add_argument("--action", choices=("text", "int"), default="text")
    args = ap.parse_args()
    uvicorn.run(make_app(args.max_sessions, args.action), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
