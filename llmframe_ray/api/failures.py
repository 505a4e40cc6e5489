"""The errors of the request service that the HTTP layer maps to status codes."""

from __future__ import annotations

from llmframe_ray.errors import LLMFrameError


class FieldError(LLMFrameError, ValueError):
    """A request field whose value this server cannot serve (HTTP 422)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class StageUnavailableError(LLMFrameError):
    """A stage of the app could not answer (HTTP 503)."""


class StageTimeoutError(StageUnavailableError):
    """A stage of the app did not answer in time (HTTP 504)."""


class BudgetExceededError(LLMFrameError):
    """The caller's key has spent its generation tokens for today (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotFoundError(LLMFrameError):
    """What a request names does not exist for its caller (HTTP 404): the same answer whether it
    belongs to another tenant or to no one."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
