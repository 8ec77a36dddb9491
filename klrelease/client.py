"""A Python client of the release service (``klrelease serve``).

::

    from klrelease.client import Client

    with Client("http://127.0.0.1:8000", token) as c:
        c.budget("iris")["remaining"]["fraction"]
        rel = c.release("iris", epsilon=1.0, delta=1e-6)   # a verified, signed Release
        rel.gmm.means

Every artifact the client returns has had its signature checked against the service's public
key: the one given as ``public_key=`` (pin it: a PEM file the data owner published), or else
the key the service announced at ``GET /v1/key`` the first time it was needed (trust on first
use). A release request carries a ``request_id`` (a fresh UUID unless given); the client
retries a request whose answer was lost in transit with the same id, which the service never
charges twice.

Errors are :class:`ServiceError` (``status``, ``code``, ``detail``), with
:class:`BudgetExceededError` for a request the budget cannot pay and :class:`NotReleasedError`
for a request id that was charged but did not release (lost or failed after its charge).
The token is sent in the ``Authorization`` header only; it is in no message or ``repr``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ._io import read_failure
from .artifact import FailDocument, Release

__all__ = ["Client", "ServiceError", "BudgetExceededError", "NotReleasedError",
           "fetch_public_key", "public_key_from", "DEFAULT_URL"]

DEFAULT_URL = "http://127.0.0.1:8000"


class ServiceError(RuntimeError):
    """An error answer of the service: HTTP ``status``, ``code`` and one-line ``detail``."""

    def __init__(self, status: int, code: str, detail: str, body: dict | None = None):
        super().__init__(f"{detail} (HTTP {status}, {code})")
        self.status, self.code, self.detail, self.body = status, code, detail, body or {}


class BudgetExceededError(ServiceError):
    """409: the dataset's budget cannot pay for the request (``body["budget"]`` says what
    remains, ``body["largest_epsilon"]`` the largest request at that delta that fits)."""


class NotReleasedError(ServiceError):
    """The request id was charged and did not release (``lost``, ``failed_after_charge``, or
    still ``charged``); the charge stands and the request will not run again."""


def _http():
    try:
        import httpx
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("the client needs httpx: pip install 'klrelease[service]'") from None
    return httpx


def fetch_public_key(url: str, *, timeout: float = 30.0) -> str:
    """The public key (PEM) a service announces: ``url`` is the service's address or its
    ``/v1/key``."""
    httpx = _http()
    target = url if url.rstrip("/").endswith("/v1/key") else url.rstrip("/") + "/v1/key"
    try:
        r = httpx.get(target, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ServiceError(0, "unreachable", f"cannot reach {target} "
                           f"({type(exc).__name__})") from None
    if r.status_code != 200:
        raise ServiceError(r.status_code, "no_key", f"{target} did not give a key")
    try:
        return r.json()["public_key_pem"]
    except (ValueError, KeyError, TypeError):
        raise ServiceError(r.status_code, "no_key", f"{target} did not give a key") from None


def public_key_from(source: str) -> str:
    """A public key (PEM) from a PEM file or, for an ``http(s)://`` URL, from the service."""
    if str(source).startswith(("http://", "https://")):
        return fetch_public_key(str(source))
    from pathlib import Path

    try:
        return Path(source).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(read_failure(source, exc)) from None


class Client:
    """A session with one release service.

    Parameters
    ----------
    url : str
        The service's address (default ``http://127.0.0.1:8000``).
    token : str
        An analyst's (or the owner's) token.
    public_key : optional
        The service's public key (PEM text or bytes) to check artifacts with; default: the
        key at ``GET /v1/key``, fetched once.
    timeout : float
        Seconds to wait for an answer (a release reads the whole dataset).
    retries : int
        How many times a release request whose answer was lost in transit is sent again
        (with the same request id).
    """

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, *, public_key=None,
                 timeout: float = 300.0, retries: int = 3):
        httpx = _http()
        self.url = url.rstrip("/")
        self.retries = int(retries)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._key = public_key

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------ calls
    def _call(self, method: str, path: str, **kw):
        httpx = _http()
        try:
            return self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ServiceError(0, "unreachable", f"cannot reach {self.url} "
                               f"({type(exc).__name__})") from None

    def _json(self, method: str, path: str, **kw) -> dict:
        r = self._call(method, path, **kw)
        if r.status_code >= 400:
            raise _error(r)
        return r.json()

    def public_key(self) -> str:
        """The key artifacts are checked with (fetched from the service once if not given)."""
        if self._key is None:
            self._key = fetch_public_key(self.url)
        return self._key

    def me(self) -> dict:
        return self._json("GET", "/v1/me")

    def datasets(self) -> list[dict]:
        """The datasets this token may see (public description and budget)."""
        return self._json("GET", "/v1/datasets")["datasets"]

    def dataset(self, name: str) -> dict:
        """One dataset, with the mechanisms the service serves for it."""
        return self._json("GET", f"/v1/datasets/{name}")

    def budget(self, name: str) -> dict:
        """The dataset's total, spent and remaining budget."""
        return self._json("GET", f"/v1/datasets/{name}/budget")

    def releases(self, name: str) -> list[dict]:
        """Every request charged on the dataset, newest first (no artifacts)."""
        return self._json("GET", f"/v1/datasets/{name}/releases")["releases"]

    def artifact(self, name: str, request_id: str) -> Release | FailDocument:
        """The verified artifact of a released request."""
        r = self._call("GET", f"/v1/datasets/{name}/releases/{request_id}")
        if r.status_code != 200:
            raise _error(r)
        return self._verified(r.text)

    def release(self, name: str, *, epsilon: float, delta: float,
                mechanism: str = "kl-certified", options: dict[str, Any] | None = None,
                request_id: str | None = None) -> Release | FailDocument:
        """Ask for a release; returns its artifact, signature checked.

        A repeated ``request_id`` returns the stored artifact (not charged again).

        Raises
        ------
        BudgetExceededError, NotReleasedError, ServiceError
        """
        httpx = _http()
        body = {"mechanism": mechanism, "epsilon": epsilon, "delta": delta,
                "options": dict(options or {}),
                "request_id": request_id or uuid.uuid4().hex}
        for attempt in range(self.retries + 1):
            try:
                r = self._http.post(f"/v1/datasets/{name}/releases", json=body)
                break
            except httpx.TransportError as exc:  # the answer may be lost: same request id
                if attempt == self.retries:
                    raise ServiceError(0, "unreachable", f"cannot reach {self.url} "
                                       f"({type(exc).__name__}); request_id "
                                       f"{body['request_id']} may have been charged") from None
                time.sleep(min(0.5 * 2 ** attempt, 5.0))
        if r.status_code not in (200, 201):
            raise _error(r)
        return self._verified(r.text)

    def _verified(self, text: str) -> Release | FailDocument:
        doc = json.loads(text)
        if isinstance(doc, dict) and doc.get("status") == "FAIL":
            from .service.signing import verify_document

            verify_document(doc, self.public_key())
            return FailDocument.model_validate(doc)
        return Release.from_json(text, public_key=self.public_key())


def _error(r) -> ServiceError:
    try:
        body = r.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("code", "error"))
    detail = str(body.get("detail", f"HTTP {r.status_code}"))
    kind = ServiceError
    if code == "budget_exceeded":
        kind = BudgetExceededError
    elif code in ("failed_after_charge", "request_lost", "request_failed",
                  "request_in_progress"):
        kind = NotReleasedError
    return kind(r.status_code, code, detail, body)
