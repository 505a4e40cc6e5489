"""API keys for the HTTP API: a key arrives as `X-API-Key: <key>` or `Authorization: Bearer <key>`.

Keys come from the settings (API_SECRET_KEY and/or the comma-separated LLMFRAME_API_KEYS).
A presented key is hashed and compared with every configured key's hash in constant time, so
neither the comparison nor the number of keys tried depends on how much of a key matched.
Keys are never logged. Running without keys is possible only with LLMFRAME_AUTH_DISABLED=true,
and logs a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Mapping, Sequence

from llmframe_ray.errors import ConfigError

logger = logging.getLogger(__name__)

NO_KEY_HINT = (
    "no API key is configured: set API_SECRET_KEY (or LLMFRAME_API_KEYS, comma-separated), "
    "or set LLMFRAME_AUTH_DISABLED=true to serve without authentication on a trusted machine"
)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class ApiKeys:
    """The keys that may call the API (or none needed, when disabled)."""

    def __init__(self, keys: Sequence[str], *, disabled: bool = False) -> None:
        if not keys and not disabled:
            raise ConfigError(NO_KEY_HINT)
        self.disabled = disabled
        self._digests = tuple(_digest(k) for k in keys)

    @classmethod
    def configured(cls, keys: Sequence[str], *, disabled: bool = False) -> ApiKeys:
        """The keys as configured (API_SECRET_KEY, LLMFRAME_API_KEYS, LLMFRAME_AUTH_DISABLED);
        only their digests are kept, so this object can be handed to a replica."""
        if disabled:
            logger.warning(
                "authentication is DISABLED (LLMFRAME_AUTH_DISABLED=true): every request is "
                "accepted; use this only on a trusted local machine"
            )
            return cls((), disabled=True)
        return cls(keys)

    def allows(self, presented: str | None) -> bool:
        if self.disabled:
            return True
        if not presented:
            return False
        digest = _digest(presented)
        matched = False
        for known in self._digests:  # every key is compared, whichever matches
            matched |= hmac.compare_digest(digest, known)
        return matched


def key_owner(presented: str | None) -> str:
    """A stable, non-reversible name for the caller's key (sessions are kept per key)."""
    return hashlib.sha256((presented or "").encode("utf-8")).hexdigest()[:16]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: X-API-Key, else an `Authorization: Bearer` token."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None
