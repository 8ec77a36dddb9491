"""Bearer tokens: 256 random bits, shown once, stored only as their SHA-256 hash.

A token is ``klr_`` followed by 43 URL-safe base64 characters (32 bytes from the operating
system's CSPRNG). The ledger keeps ``sha256(token)``: a stolen ledger gives no usable token,
and with 256 bits of entropy a fast hash is enough (there is nothing to guess). Tokens are never
logged: the service logs a token's id and name, never the token or its hash.
"""

from __future__ import annotations

import hashlib
import re
import secrets

__all__ = ["PREFIX", "new_token", "hash_token", "well_formed", "bearer"]

PREFIX = "klr_"
_FORM = re.compile(r"^klr_[A-Za-z0-9_-]{43}$")


def new_token() -> str:
    """A new token with 256 random bits."""
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of ``token`` (hex SHA-256)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def well_formed(token: str) -> bool:
    """Whether ``token`` has the form of a token (checked before any lookup)."""
    return bool(_FORM.match(token))


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, else ``None``."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
