"""The settings of document writes over HTTP and of tenants (part of config.Settings), and the
helpers every setting is declared with."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings

from llmframe_ray.index.metadata import FilterError, check_namespace

ENV_PREFIX = "LLMFRAME_"


def _key_list(keys: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k.strip() for k in keys if k.strip()))


def _default_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmframe-ray"


def _env(name: str, *seed_names: str) -> Any:
    """Field options reading `LLMFRAME_<NAME>` first, then the seed's unprefixed names."""
    return AliasChoices(f"{ENV_PREFIX}{name}", *seed_names)


class WriteSettings(BaseSettings):
    # Tenants: JSON {"<api key>": ["namespace", ...]}; each such key may call the API and sees
    # only its namespaces (the first is its default). Other non-admin keys see "default" only;
    # admin keys see every namespace.
    key_namespaces: str | None = Field(None, repr=False, validation_alias=_env("KEY_NAMESPACES"))
    # POST /v1/documents: the body (JSON or multipart), documents per request, and the bytes
    # accepted but not yet applied, over which new writes get a 429
    upload_max_bytes: int = Field(32 * 2**20, ge=1024, le=2**34, validation_alias=_env("UPLOAD_MAX_BYTES"))
    documents_max_per_request: int = Field(1000, ge=1, le=1_000_000, validation_alias=_env("DOCUMENTS_MAX_PER_REQUEST"))
    documents_max_queued_bytes: int = Field(2**30, ge=1024, le=2**40, validation_alias=_env("DOCUMENTS_MAX_QUEUED_BYTES"))
    # the writer waits this long after a write arrives for more to apply in the same run
    writer_batch_wait_s: float = Field(1.0, ge=0, le=86400, validation_alias=_env("WRITER_BATCH_WAIT_S"))
    # share of each logical CPU request that the write job's Ray tasks and actors make inside a
    # serving cluster (its replicas hold the CPUs; the job's threads still use the cores)
    writer_cpu_scale: float = Field(0.05, gt=0, le=1, validation_alias=_env("WRITER_CPU_SCALE"))

    @field_validator("key_namespaces")
    @classmethod
    def _tenants(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            bound = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"must be a JSON object of API key -> list of namespaces ({exc.msg})") from None
        if not isinstance(bound, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, list) and v for k, v in bound.items()
        ):
            raise ValueError("must be a JSON object of API key -> non-empty list of namespaces")
        try:
            for spaces in bound.values():
                for name in spaces:
                    check_namespace(name)
        except FilterError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def tenant_namespaces(self) -> dict[str, tuple[str, ...]]:
        """API key -> the namespaces it is bound to (LLMFRAME_KEY_NAMESPACES)."""
        if self.key_namespaces is None:
            return {}
        return {k.strip(): tuple(dict.fromkeys(v)) for k, v in json.loads(self.key_namespaces).items()}
