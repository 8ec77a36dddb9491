"""Ed25519 signatures of release artifacts.

The service signs every artifact it issues: the signature covers the canonical JSON of the
document without its ``signature`` block (keys sorted, no whitespace, UTF-8), prefixed by
:data:`CONTEXT` so that a signature can never be replayed as another kind of message. Anyone
holding the service's public key (``GET /v1/key``) checks an artifact with
``Release.from_json(text, public_key=...)`` or ``klrelease inspect --verify --key``: an edit of
any field (the claim's epsilon, delta or certified flag, a mean, a class name) breaks it.

The private key is made at the service's first start in its data directory
(:data:`KEY_FILE`, readable by its owner only) and never leaves it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CONTEXT", "KEY_FILE", "SignatureError", "Signer", "canonical", "key_id",
           "load_public_key", "public_pem", "verify_document"]

#: Prefix of every signed message (domain separation).
CONTEXT = b"klrelease artifact signature v1\n"
#: The private key's file name in a service's data directory.
KEY_FILE = "signing-key.pem"
ALGORITHM = "Ed25519"


class SignatureError(ValueError):
    """An artifact is not signed, or its signature does not verify with the given key."""


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("artifact signatures need the 'cryptography' package: "
                          "pip install 'klrelease[service]'") from None
    return serialization, ed25519


def canonical(doc: dict) -> bytes:
    """The signed bytes of ``doc``: :data:`CONTEXT` and its canonical JSON without
    ``signature``."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    return CONTEXT + text.encode("utf-8")


def _raw(public_key) -> bytes:
    serialization, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key) -> str:
    """A short fingerprint of a public key: the first 16 hex digits of SHA-256 of its raw
    bytes."""
    return hashlib.sha256(_raw(public_key)).hexdigest()[:16]


def public_pem(public_key) -> str:
    """The public key as PEM (SubjectPublicKeyInfo)."""
    serialization, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public_key(key):
    """An Ed25519 public key from a key object, PEM text or bytes, or the JSON of
    ``GET /v1/key``.

    Raises
    ------
    SignatureError
        If ``key`` is not an Ed25519 public key.
    """
    serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.public_key()
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    if text.lstrip().startswith("{"):
        try:
            text = json.loads(text)["public_key_pem"]
        except (ValueError, KeyError, TypeError):
            raise SignatureError("not a service key document (no public_key_pem)") from None
    try:
        loaded = serialization.load_pem_public_key(text.encode())
    except ValueError:
        raise SignatureError("not a PEM public key") from None
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise SignatureError(f"not an {ALGORITHM} public key")
    return loaded


def verify_document(doc: Any, public_key) -> str:
    """Check the signature of an artifact (a parsed JSON document) with ``public_key``;
    returns the key id.

    Raises
    ------
    SignatureError
        One line: not signed, signed by another key, or modified after it was signed.
    """
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(public_key)
    if not isinstance(doc, dict):
        raise SignatureError("not a klrelease artifact (not a JSON object)")
    sig = doc.get("signature")
    if sig is None:
        raise SignatureError("the artifact is not signed; a signed artifact was expected")
    if not isinstance(sig, dict) or sig.get("algorithm") != ALGORITHM or not isinstance(
            sig.get("value"), str):
        raise SignatureError(f"the artifact's signature block is not an {ALGORITHM} signature")
    expected = key_id(key)
    if sig.get("key_id") != expected:
        raise SignatureError(f"the artifact was signed by key {sig.get('key_id')!r}, not by the "
                             f"given key {expected!r}")
    try:
        value = base64.b64decode(sig["value"], validate=True)
        key.verify(value, canonical(doc))
    except (InvalidSignature, ValueError):
        raise SignatureError("signature check failed: the artifact was modified after it was "
                             f"signed by key {expected!r}") from None
    return expected


class Signer:
    """The service's signing key (Ed25519), kept in ``directory/signing-key.pem``."""

    def __init__(self, private_key):
        self._key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    @classmethod
    def load_or_create(cls, directory) -> tuple[Signer, bool]:
        """The key of ``directory``, made (owner-readable only) if there is none; returns
        ``(signer, created)``."""
        serialization, ed25519 = _crypto()
        path = Path(directory) / KEY_FILE
        if path.exists():
            try:
                key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            except ValueError:
                raise ValueError(f"{path} is not a PEM private key") from None
            if not isinstance(key, ed25519.Ed25519PrivateKey):
                raise ValueError(f"{path} is not an {ALGORITHM} private key")
            return cls(key), False
        key = ed25519.Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic: a process starting at the same time keeps its key
        except FileExistsError:
            return cls.load_or_create(directory)[0], False
        finally:
            tmp.unlink()
        return cls(key), True

    @property
    def public_pem(self) -> str:
        return public_pem(self.public_key)

    def sign(self, doc: dict) -> dict:
        """``doc`` with its ``signature`` block (a new dict; ``doc`` is not changed)."""
        value = self._key.sign(canonical(doc))
        body = {k: v for k, v in doc.items() if k != "signature"}
        body["signature"] = {"algorithm": ALGORITHM, "key_id": self.key_id,
                             "value": base64.b64encode(value).decode("ascii")}
        return body
