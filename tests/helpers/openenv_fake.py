"""A fake OpenEnv server in the test process (``websockets``' own server, no ``openenv``): the
``/schema``, ``/health`` and ``/ws`` of openenv 0.10's wire protocol, for the adapter's unit
tests.

The game: a counter. ``reset`` (seed s) answers ``{"text": "count <s>", "n": 0}``; each step's
action ``{"message": str}`` (or the ``action_schema`` given) adds one: reward 0.5 per step,
``done`` at ``steps`` steps (reward 1.0 then), metadata ``{"n": n}``. A message ``"boom"`` makes
the step raise on the server (``EXECUTION_ERROR``), ``"refuse"`` is refused as invalid
(``VALIDATION_ERROR``), ``"hang"`` is never answered, ``"drop"`` closes the socket.

``FakeOpenEnv(max_sessions=1)`` refuses a session beyond ``max_sessions`` with
``CAPACITY_REACHED``, as openenv does; ``open_sessions`` counts the live ones, ``resets`` the
reset messages (their data).
"""

from __future__ import annotations

import http
import json
import threading
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

TEXT_ACTION = {"title": "Msg", "type": "object", "additionalProperties": False,
               "properties": {"metadata": {"type": "object", "additionalProperties": True},
                              "message": {"type": "string", "description": "what you say"}},
               "required": ["message"]}
INT_ACTION = {"title": "Move", "type": "object", "additionalProperties": False,
              "properties": {"metadata": {"type": "object"}, "x": {"type": "integer", "minimum": 0},
                             "y": {"type": "integer"}},
              "required": ["x", "y"]}


class FakeOpenEnv:
    """See the module docstring. ``base_url`` is its address; ``shutdown()`` stops it."""

    def __init__(self, *, max_sessions: int = 8, steps: int = 3, action_schema: dict | None = None,
                 schema_status: int = 200, port: int = 0) -> None:
        self.max_sessions = max_sessions
        self.steps = steps
        self.action_schema = action_schema or TEXT_ACTION
        self.schema_status = schema_status
        self.lock = threading.Lock()
        self.open_sessions = 0
        self.sessions_made = 0
        self.resets: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self._server = serve(self._handle, "127.0.0.1", port, process_request=self._http, ping_interval=None)
        self.port = self._server.socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)

    def _http(self, connection: ServerConnection, request: Any) -> Any:
        if request.path == "/ws":
            return None
        if request.path == "/health":
            return connection.respond(http.HTTPStatus.OK, '{"status": "healthy"}')
        if request.path == "/schema":
            body = {"action": self.action_schema, "observation": {"type": "object", "properties": {}},
                    "state": {"type": "object", "properties": {}}}
            return connection.respond(self.schema_status, json.dumps(body))
        return connection.respond(http.HTTPStatus.NOT_FOUND, "not found")

    def _handle(self, ws: ServerConnection) -> None:
        with self.lock:
            if self.open_sessions >= self.max_sessions:
                refuse = True
            else:
                refuse = False
                self.open_sessions += 1
                self.sessions_made += 1
        if refuse:
            ws.send(json.dumps({"type": "error", "data": {"message": "Server at capacity", "code": "CAPACITY_REACHED",
                                                          "active_sessions": self.max_sessions,
                                                          "max_sessions": self.max_sessions}}))
            ws.close()
            return
        n = 0
        try:
            while True:
                msg = json.loads(ws.recv())
                kind = msg.get("type")
                if kind == "close":
                    break
                if kind == "state":
                    ws.send(json.dumps({"type": "state", "data": {"step_count": n}}))
                elif kind == "reset":
                    with self.lock:
                        self.resets.append(msg.get("data", {}))
                    n = 0
                    seed = msg.get("data", {}).get("seed")
                    ws.send(json.dumps(_obs({"text": f"count {seed}", "n": 0}, None, False, {"n": 0})))
                elif kind == "step":
                    action = msg.get("data", {})
                    with self.lock:
                        self.actions.append(action)
                    word = action.get("message")
                    if word == "boom":
                        ws.send(json.dumps(_error("step raised: boom", "EXECUTION_ERROR")))
                    elif word == "refuse":
                        ws.send(json.dumps({"type": "error", "data": {
                            "message": "Invalid message", "code": "VALIDATION_ERROR",
                            "errors": [{"loc": ["message"], "msg": "String should have at most 3 characters"}]}}))
                    elif word == "hang":
                        continue
                    elif word == "drop":
                        break
                    else:
                        n += 1
                        done = n >= self.steps
                        ws.send(json.dumps(_obs({"text": f"count {n}", "n": n}, 1.0 if done else 0.5, done, {"n": n})))
                else:
                    ws.send(json.dumps(_error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")))
        except ConnectionClosed:
            pass
        finally:
            with self.lock:
                self.open_sessions -= 1


def _obs(observation: dict, reward: Any, done: bool, metadata: dict) -> dict:
    return {"type": "observation", "data": {"observation": {**observation, "metadata": metadata}, "reward": reward,
                                            "done": done, "metadata": metadata}}


def _error(message: str, code: str) -> dict:
    return {"type": "error", "data": {"message": message, "code": code}}


def main() -> None:
    """``python tests/helpers/openenv_fake.py --port N [--max-sessions K]``: serve until killed
    (a local-process server for the adapter's launch tests, without the hub venv)."""
    import argparse
    import time

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-sessions", type=int, default=1)
    args = ap.parse_args()
    fake = FakeOpenEnv(max_sessions=args.max_sessions, port=args.port)
    try:
        while True:
            time.sleep(3600)
    finally:
        fake.shutdown()


if __name__ == "__main__":
    main()
