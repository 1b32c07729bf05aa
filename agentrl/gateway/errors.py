"""The gateway's one error: an HTTP status and OpenAI's error body.

OpenAI's API answers a refused request with a status and
``{"error": {"message", "type", "param", "code"}}``; the ``openai`` SDK reads that body into
its ``APIStatusError`` subclasses (``BadRequestError`` for 400, ...), so a client sees the
message and the field (``param``) it got wrong.
"""

from __future__ import annotations

from typing import Any

from agentrl.errors import AgentRLError

ERROR_TYPES = ("invalid_request_error", "authentication_error", "not_found_error", "server_error")
"""The ``type`` values the gateway answers with."""

_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}


class GatewayError(AgentRLError):
    """A request the gateway refuses or could not serve, as OpenAI's API reports it.

    Args:
        status: the HTTP status, e.g. ``400``.
        message: what was wrong and what was expected, e.g.
            ``"n=2: the gateway samples one choice per request; send n=1"``.
        type: one of :data:`ERROR_TYPES`; default from ``status`` (400
            ``invalid_request_error``, 401 ``authentication_error``, 404 ``not_found_error``,
            anything else ``server_error``).
        param: the request field at fault (``"n"``, ``"messages[2].role"``), or ``None``.
        code: a short machine-readable code, or ``None``.

    Raises:
        ValueError: ``type`` is not one of :data:`ERROR_TYPES`, or ``status`` is not an
            HTTP error status (400-599).
    """

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None) -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"status={status} is not an HTTP error status (400-599)")
        err_type = type or _TYPE_BY_STATUS.get(status, "server_error")
        if err_type not in ERROR_TYPES:
            raise ValueError(f"type={err_type!r} is not one of {list(ERROR_TYPES)}")
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = err_type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The response body in OpenAI's error schema:
        ``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __repr__(self) -> str:
        return f"GatewayError(status={self.status}, type={self.type!r}, param={self.param!r}, message={self.message!r})"
