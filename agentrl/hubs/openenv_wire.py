"""OpenEnv's wire protocol, spoken without ``openenv``: ``GET /schema`` and ``GET /health``
(``httpx``), and one session over ``/ws`` (``websockets``' synchronous client).

A ``/ws`` connection is one server-side environment instance: the server makes it when the
socket opens (or refuses with an ``error`` frame of code ``CAPACITY_REACHED`` when it holds
its ``max_concurrent_envs`` sessions already) and closes it when the socket ends, for
whatever reason: a ``{"type": "close"}`` message, a closed socket, or a client process that
died (its kernel closes the TCP connection). Messages (openenv 0.10.0,
``openenv.core.env_server.types``): ``{"type": "reset", "data": {...reset kwargs}}``,
``{"type": "step", "data": {...action}}``, ``{"type": "state"}``, ``{"type": "close"}``;
answers ``{"type": "observation", "data": {"observation": {...}, "reward", "done",
"metadata"?}}``, ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data":
{"message", "code", ...}}``.

Every failure here is the hub's (an ``agentrl.errors.InfraError``), except a step the server
refused as an invalid action (``VALIDATION_ERROR``), which ``Session.step`` returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

import httpx

from agentrl.errors import InfraError

try:  # the `openenv` extra
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import ClientConnection, connect
except ImportError:  # pragma: no cover - checked by require_websockets()
    connect = None  # type: ignore[assignment]
    ClientConnection = Any  # type: ignore[assignment,misc]
    WebSocketException = OSError  # type: ignore[assignment,misc]

__all__ = ["OpenEnvError", "CapacityError", "StepResult", "Rejected", "Session", "read_schema", "server_healthy",
           "accepts_concurrent_sessions", "require_websockets", "MAX_MESSAGE_BYTES"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest ``/ws`` message read (openenv's own client allows 100 MiB)."""


class OpenEnvError(InfraError):
    """An OpenEnv server failed, refused, answered off-protocol or did not answer in time.
    Never the model's fault: the episode ends with ``infra_error``. ``base_url`` names the
    server, ``code`` openenv's error code when it sent one."""

    def __init__(self, message: str, *, base_url: str = "", code: str | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.base_url = base_url
        self.code = code
        self.detail = detail


class CapacityError(OpenEnvError):
    """The server holds as many sessions as it serves (``CAPACITY_REACHED``)."""


def require_websockets() -> None:
    """Raises ``ImportError`` naming the fix when the ``websockets`` package (the ``openenv``
    extra) is missing."""
    if connect is None:
        raise ImportError("the OpenEnv adapter needs the websockets package: pip install 'agentrl[openenv]'")


@dataclass(frozen=True)
class StepResult:
    """One ``observation`` answer of ``/ws``.

    Attributes:
        observation: the observation's own fields (``done`` and ``reward`` not among them).
        reward: the reward as sent (a number, a bool, or None when the server gave none).
        done: whether the episode is over.
        metadata: the observation's metadata (``{}`` when none).
    """

    observation: dict[str, Any]
    reward: float | int | bool | None
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejected:
    """A step the server refused as an invalid action (``VALIDATION_ERROR``): the model's fault."""

    message: str


def ws_url(base_url: str) -> str:
    """``http://h:p`` -> ``ws://h:p/ws`` (``https`` -> ``wss``)."""
    url = base_url.rstrip("/")
    if url.startswith("http://"):
        url = "ws://" + url[len("http://"):]
    elif url.startswith("https://"):
        url = "wss://" + url[len("https://"):]
    return url + "/ws"


def read_schema(base_url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """``GET /schema``: ``{"action": ..., "observation": ..., "state": ...}``.

    Raises:
        OpenEnvError: no answer, a non-200 status, or a body without an ``action`` object.
    """
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            resp = client.get(base_url.rstrip("/") + "/schema")
    except httpx.HTTPError as exc:
        raise OpenEnvError(f"GET {base_url}/schema failed: {type(exc).__name__}: {exc}", base_url=base_url) from exc
    if resp.status_code != 200:
        raise OpenEnvError(f"GET {base_url}/schema answered {resp.status_code}: {resp.text[:300]}", base_url=base_url)
    try:
        body = resp.json()
    except ValueError as exc:
        raise OpenEnvError(f"GET {base_url}/schema answered no JSON: {resp.text[:300]!r}", base_url=base_url) from exc
    if not isinstance(body, dict) or not isinstance(body.get("action"), dict):
        raise OpenEnvError(f"GET {base_url}/schema has no 'action' schema: {str(body)[:300]}", base_url=base_url)
    return body


def server_healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET /health`` answers 200 within ``timeout_s``."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            return client.get(base_url.rstrip("/") + "/health").status_code == 200
    except httpx.HTTPError:
        return False


class Session:
    """One ``/ws`` session: one environment instance on the server, from ``open`` to ``close``.

    Args:
        base_url: the server, ``http://host:port``.
        timeout_s: the longest wait for one answer (and for the socket to open).

    Thread safety: one caller at a time, except ``close``, which may be called from any
    thread (it ends a wait in progress, which then raises ``OpenEnvError``).
    """

    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        require_websockets()
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._ws: ClientConnection | None = None

    @property
    def is_open(self) -> bool:
        return self._ws is not None

    def open(self) -> None:
        """Open the socket and make sure the server made the session (a ``state`` round trip:
        a refused session answers ``CAPACITY_REACHED``).

        Raises:
            CapacityError: the server serves no more sessions now.
            OpenEnvError: it cannot be reached or refused otherwise.
        """
        if self._ws is not None:
            return
        try:
            self._ws = connect(ws_url(self.base_url), open_timeout=self.timeout_s, max_size=MAX_MESSAGE_BYTES,
                               proxy=None, ping_interval=None, close_timeout=2.0)
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise OpenEnvError(f"could not open {ws_url(self.base_url)}: {type(exc).__name__}: {exc}",
                               base_url=self.base_url) from exc
        try:
            self._call({"type": "state"}, expect="state", execution_errors_ok=True)
        except BaseException:
            self.close(notify=False)
            raise

    def reset(self, data: Mapping[str, Any]) -> StepResult:
        """Send ``reset`` with ``data`` (the server passes on the keys its ``reset`` takes).

        Raises:
            OpenEnvError: any failure (the session should then be closed).
        """
        return self._observation(self._call({"type": "reset", "data": dict(data)}, expect="observation"))

    def step(self, action: Mapping[str, Any]) -> StepResult | Rejected:
        """Send ``step`` with ``action``; ``Rejected`` when the server refused the action itself.

        Raises:
            OpenEnvError: any other failure, the environment's own step raising included.
        """
        try:
            answer = self._call({"type": "step", "data": dict(action)}, expect="observation")
        except OpenEnvError as exc:
            if exc.code == "VALIDATION_ERROR":
                return Rejected(exc.detail)
            raise
        return self._observation(answer)

    def close(self, notify: bool = True) -> None:
        """Send ``close`` (when ``notify``) and close the socket; the server then closes the
        session's environment. Idempotent; never raises."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        if notify:
            try:
                ws.send(json.dumps({"type": "close"}))
            except Exception:  # noqa: BLE001 - the socket may be gone already
                pass
        try:
            ws.close()
        except Exception:  # noqa: BLE001
            pass

    def _call(self, message: dict[str, Any], *, expect: str, execution_errors_ok: bool = False) -> dict[str, Any]:
        ws = self._ws
        if ws is None:
            raise OpenEnvError(f"the session with {self.base_url} is closed", base_url=self.base_url)
        kind = message["type"]
        try:
            ws.send(json.dumps(message))
        except (OSError, WebSocketException):
            pass  # a refused session sends its error frame, then closes: read that frame below
        try:
            raw = ws.recv(timeout=self.timeout_s)
        except TimeoutError as exc:
            self.close(notify=False)
            raise OpenEnvError(f"{self.base_url} did not answer {kind!r} within {self.timeout_s} s",
                               base_url=self.base_url) from exc
        except (OSError, WebSocketException, EOFError, RuntimeError) as exc:
            self.close(notify=False)
            raise OpenEnvError(f"the session with {self.base_url} ended during {kind!r}: {type(exc).__name__}: {exc}",
                               base_url=self.base_url) from exc
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise OpenEnvError(f"{self.base_url} answered {kind!r} with no JSON: {str(raw)[:300]!r}",
                               base_url=self.base_url) from exc
        if not isinstance(answer, dict):
            raise OpenEnvError(f"{self.base_url} answered {kind!r} with {str(raw)[:300]}", base_url=self.base_url)
        if answer.get("type") == "error":
            data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
            code = str(data.get("code", "UNKNOWN"))
            if execution_errors_ok and code == "EXECUTION_ERROR":
                return answer
            detail = str(data.get("message", ""))[:500]
            if code == "VALIDATION_ERROR" and data.get("errors"):
                detail = "; ".join(f"{'/'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                                   for e in data["errors"][:3] if isinstance(e, dict)) or detail
            cls = CapacityError if code == "CAPACITY_REACHED" else OpenEnvError
            raise cls(f"{self.base_url} refused {kind!r} ({code}): {detail}", base_url=self.base_url, code=code,
                      detail=detail)
        if answer.get("type") != expect or not isinstance(answer.get("data"), dict):
            raise OpenEnvError(f"{self.base_url} answered {kind!r} with type {answer.get('type')!r}; expected "
                               f"{expect!r} with a data object", base_url=self.base_url)
        return answer["data"]

    def _observation(self, data: dict[str, Any]) -> StepResult:
        obs = data.get("observation")
        reward = data.get("reward")
        done = data.get("done", False)
        meta = data.get("metadata")
        if meta is None and isinstance(obs, dict):
            meta = obs.get("metadata")
        if not isinstance(obs, dict) or not isinstance(done, bool) or (
                reward is not None and not isinstance(reward, (int, float))):
            raise OpenEnvError(f"{self.base_url} sent an observation off the protocol: {str(data)[:300]}; expected "
                               "{'observation': {...}, 'reward': number or null, 'done': bool}", base_url=self.base_url)
        obs = {k: v for k, v in obs.items() if k not in ("metadata", "done", "reward")}
        return StepResult(obs, reward, done, dict(meta) if isinstance(meta, dict) else {})


def accepts_concurrent_sessions(base_url: str, timeout_s: float = 30.0) -> bool:
    """Whether the server serves two sessions at once: open one, then a second; True when the
    second is made too. Both are closed before this returns.

    Raises:
        OpenEnvError: the first session cannot be made.
    """
    first, second = Session(base_url, timeout_s), Session(base_url, timeout_s)
    try:
        first.open()
        try:
            second.open()
        except CapacityError:
            return False
        return True
    finally:
        second.close()
        first.close()

