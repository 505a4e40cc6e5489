"""Typed errors. Each one names what was wrong and, where there is one, the fix."""

from __future__ import annotations

from pathlib import Path


class LLMFrameError(Exception):
    """Base class of every error this package raises on purpose.

    Errors cross process boundaries (a Ray replica raises, the caller handles): they pickle as
    their message and attributes, whatever their constructor's arguments.
    """

    def __reduce__(self):
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


def _rebuild_error(cls: type, args: tuple, state: dict) -> LLMFrameError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(LLMFrameError):
    """A setting is missing or invalid."""


class DocumentReadError(LLMFrameError):
    """A source file could not be read or parsed."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot read {self.path}: {reason}")


class QueryError(LLMFrameError, ValueError):
    """A query that cannot be answered as given."""


class EmptyQueryError(QueryError):
    def __init__(self) -> None:
        super().__init__("query is empty or whitespace only")


class QueryTooLongError(QueryError):
    def __init__(self, n_tokens: int, limit: int) -> None:
        self.n_tokens = n_tokens
        self.limit = limit
        super().__init__(
            f"query is {n_tokens} tokens long; the embedding model accepts at most {limit}"
        )


class IndexLoadError(LLMFrameError):
    """An index is missing, incomplete or of an unsupported format."""


class DatasetError(LLMFrameError):
    """A BEIR-style dataset folder is missing a file or holds malformed lines."""


class ModelError(LLMFrameError):
    """A model cannot be found, exported or loaded."""


class MissingDependencyError(LLMFrameError, ImportError):
    """An optional dependency is needed for the feature that was asked for."""

    def __init__(self, package: str, feature: str, fix: str | None = None) -> None:
        fix = fix if fix is not None else f"pip install {package}"
        super().__init__(f"{feature} needs the package {package!r}: {fix}")
