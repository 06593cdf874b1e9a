"""The one error type of the HTTP API: every 4xx/5xx a client gets, in OpenAI's error shape."""
from __future__ import annotations


class ApiError(Exception):
    """An error answered to the client as {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    @property
    def kind(self) -> str:
        """Label for the errors metric."""
        return self.code or self.type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
