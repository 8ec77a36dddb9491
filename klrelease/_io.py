"""One message for a file that cannot be read: its path and a reason that quotes nothing of
its content (an exception's own text may hold the bytes or values it choked on)."""

from __future__ import annotations

__all__ = ["read_failure"]

_REASONS = (
    (FileNotFoundError, "no such file"),
    (IsADirectoryError, "a directory, not a file"),
    (PermissionError, "permission denied"),
    (UnicodeDecodeError, "not UTF-8 text"),
)


def read_failure(path, exc: BaseException) -> str:
    """``cannot read PATH: REASON`` for ``exc`` raised while reading ``path``."""
    reason = next((text for kind, text in _REASONS if isinstance(exc, kind)),
                  exc.__class__.__name__)
    return f"cannot read {path}: {reason}"
