"""API keys for the HTTP API: a key arrives as `X-API-Key: <key>` or `Authorization: Bearer <key>`.

Keys come from the settings (API_SECRET_KEY and/or the comma-separated LLMFRAME_API_KEYS).
Admin keys (LLMFRAME_ADMIN_KEYS; when unset, API_SECRET_KEY) may also reload the index and
read /v1/stats; tenant keys (LLMFRAME_API_KEYS) may not.
A presented key is hashed and compared with every configured key's hash in constant time, so
neither the comparison nor the number of keys tried depends on how much of a key matched.
Keys are never logged. Running without keys is possible only with LLMFRAME_AUTH_DISABLED=true,
and logs a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any, Mapping, Sequence

from llmframe_ray.errors import ConfigError
from llmframe_ray.index.metadata import DEFAULT_NAMESPACE

logger = logging.getLogger(__name__)

NO_KEY_HINT = (
    "no API key is configured: set API_SECRET_KEY (or LLMFRAME_API_KEYS, comma-separated), "
    "or set LLMFRAME_AUTH_DISABLED=true to serve without authentication on a trusted machine"
)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class ApiKeys:
    """The keys that may call the API (or none needed, when disabled)."""

    def __init__(
        self, keys: Sequence[str], *, admin: Sequence[str] = (), disabled: bool = False,
        namespaces: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        namespaces = dict(namespaces or {})
        keys = tuple(dict.fromkeys([*keys, *admin, *namespaces]))  # an admin or tenant key is a key
        if not keys and not disabled:
            raise ConfigError(NO_KEY_HINT)
        self.disabled = disabled
        self._digests = tuple(_digest(k) for k in keys)
        self._admin = tuple(_digest(k) for k in admin)
        self._spaces = {_digest(k): tuple(v) for k, v in namespaces.items()}

    @classmethod
    def configured(
        cls, keys: Sequence[str], *, admin: Sequence[str] = (), disabled: bool = False,
        namespaces: Mapping[str, Sequence[str]] | None = None,
    ) -> ApiKeys:
        """The keys as configured (API_SECRET_KEY, LLMFRAME_API_KEYS, LLMFRAME_ADMIN_KEYS,
        LLMFRAME_AUTH_DISABLED); only their digests are kept, so this object can be handed to a
        replica."""
        if disabled:
            logger.warning(
                "authentication is DISABLED (LLMFRAME_AUTH_DISABLED=true): every request is "
                "accepted; use this only on a trusted local machine"
            )
            return cls((), disabled=True)
        return cls(keys, admin=admin, namespaces=namespaces)

    @classmethod
    def from_settings(cls, settings: Any) -> ApiKeys:
        return cls.configured(
            settings.api_key_list, admin=settings.admin_key_list, disabled=settings.auth_disabled,
            namespaces=settings.tenant_namespaces,
        )

    def allows(self, presented: str | None) -> bool:
        return self.disabled or _matches(presented, self._digests)

    def is_admin(self, presented: str | None) -> bool:
        return self.disabled or _matches(presented, self._admin)

    def namespaces(self, presented: str | None) -> tuple[str, ...] | None:
        """The namespaces an allowed key may see, its default first; None: every one (admin
        keys, or no authentication). A key bound by LLMFRAME_KEY_NAMESPACES sees its own; any
        other key the default namespace."""
        if self.is_admin(presented):
            return None
        return self._spaces.get(_digest(presented or ""), (DEFAULT_NAMESPACE,))


def _matches(presented: str | None, digests: Sequence[bytes]) -> bool:
    if not presented:
        return False
    digest = _digest(presented)
    matched = False
    for known in digests:  # every key is compared, whichever matches
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


def first_headers(scope: Mapping[str, Any]) -> dict[str, str]:
    """An ASGI request's headers by lower-case name, the first of repeated ones (as Starlette's
    `request.headers.get` reads them), for middleware that runs before the app."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or []:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out
