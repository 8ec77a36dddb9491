"""The HTTP application (FastAPI): analyst and owner endpoints, and the page at ``/``.

Every endpoint but ``/``, its static files, ``/v1/key`` and ``/v1/health`` needs
``Authorization: Bearer TOKEN``. Answers are JSON ``{"detail": one line, "code": ...}`` on
error: 401 without a valid token, 403 for a dataset the token is not granted, 404 for what does
not exist, 409 when the budget would be exceeded (with what remains) or a request id was
settled otherwise, 422 for a bad request, 500 when a release failed after its charge. No
answer and no log line carries a token, a data value, a path, a count, a statistic or a stack
trace: an unexpected error is logged by its type only.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from .datadir import ledger_url
from .ledger import DatasetRecord, Ledger, Principal
from .releases import Outcome, handle_release, served_mechanisms
from .signing import Signer
from .tokens import bearer

__all__ = ["ServiceConfig", "Service", "create_app"]

log = logging.getLogger("klrelease.service")

PAGE = Path(__file__).resolve().parent / "page"

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass
class ServiceConfig:
    """Where a service keeps its state: the data directory (signing key; SQLite ledger unless
    ``database`` names a PostgreSQL one) and its lease settings."""

    data_dir: Path
    database: str | None = None
    lease: float = 30.0
    heartbeat: float = 5.0


class ApiError(Exception):
    """An error answer: status, code and one line."""

    def __init__(self, status: int, code: str, detail: str, headers=None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


class Service:
    """The running service: its ledger, signing key, instance lease and heartbeat."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.ledger = Ledger(ledger_url(config.data_dir, config.database),
                             lease=config.lease, heartbeat=config.heartbeat)
        self.signer: Signer | None = None
        self.instance = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def prepare(self) -> bool:
        """The schema and the signing key (made at the first start; one key per ledger);
        whether the key was made now.

        Raises
        ------
        ValueError
            If the ledger's artifacts are signed with another key.
        """
        if self.signer is not None:
            return False
        self.ledger.create_schema()
        signer, created = Signer.load_or_create(self.config.data_dir)
        if created:
            log.info("made the signing key %s", signer.key_id)
        self.ledger.register_key(signer.key_id, signer.public_pem)
        self.signer = signer
        return created

    def start(self) -> None:
        """Schema and key, instance, recovery of lost requests, heartbeat."""
        self.prepare()
        self.instance = self.ledger.register_instance()
        lost = self.ledger.sweep(self.instance)
        if lost:
            log.warning("%d request(s) of stopped service processes marked lost (charged, "
                        "not released, not refunded)", lost)
        self._thread = threading.Thread(target=self._beat, name="klrelease-heartbeat",
                                        daemon=True)
        self._thread.start()
        log.info("ledger %s, signing key %s, instance %s", self.ledger.dialect,
                 self.signer.key_id, self.instance.id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.instance is not None:
            self.ledger.stop_instance(self.instance)
        self.ledger.close()

    def _beat(self) -> None:
        while not self._stop.wait(self.ledger.heartbeat):
            try:
                if not self.ledger.renew(self.instance):
                    log.warning("this process was declared stopped (its lease expired); its "
                                "open requests are lost; continuing as a new instance")
                lost = self.ledger.sweep(self.instance)
                if lost:
                    log.warning("%d request(s) of stopped service processes marked lost", lost)
            except Exception as exc:  # noqa: BLE001 - a failed heartbeat is retried
                log.warning("ledger heartbeat failed (%s)", type(exc).__name__)


def create_app(config: ServiceConfig | None = None, *, service: Service | None = None
               ) -> FastAPI:
    """The application of one service process (started and stopped with the app)."""
    svc = service if service is not None else Service(config)

    @asynccontextmanager
    async def lifespan(app):
        svc.start()
        try:
            yield
        finally:
            svc.stop()

    app = FastAPI(title="klrelease release service", version=_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.service = svc
    app.add_middleware(_Guard)
    app.mount("/static", StaticFiles(directory=PAGE), name="static")

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return JSONResponse({"detail": exc.detail, "code": exc.code}, status_code=exc.status,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return JSONResponse({"detail": f"invalid request ({where}: {msg})",
                             "code": "invalid_request"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else "error"
        return JSONResponse({"detail": detail, "code": code}, status_code=exc.status_code)

    def granted(p: Principal, name: str) -> DatasetRecord:
        ds = svc.ledger.dataset(name)
        if ds is None and p.owner:
            raise ApiError(404, "not_found", f"no dataset named {name!r}")
        if ds is None or not p.may_see(ds):  # an analyst cannot tell the two apart
            raise ApiError(403, "forbidden", f"this token is not granted dataset {name!r}")
        return ds

    def described(ds: DatasetRecord, *, mechanisms: bool = False) -> dict[str, Any]:
        out = {**ds.public(), "budget": svc.ledger.budget(ds).as_dict()}
        if mechanisms:
            out["mechanisms"] = served_mechanisms(ds)
        return out

    # ------------------------------------------------------------------ public
    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(PAGE / "index.html", media_type="text/html")

    @app.get("/v1/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/key")
    def key():
        return {"algorithm": "Ed25519", "key_id": svc.signer.key_id,
                "public_key_pem": svc.signer.public_pem}

    # ----------------------------------------------------------------- analysts
    @app.get("/v1/me")
    def me(p: Analyst):
        return {"name": p.name, "role": p.role,
                "datasets": [d.name for d in svc.ledger.datasets(p)]}

    @app.get("/v1/datasets")
    def list_datasets(p: Analyst):
        return {"datasets": [described(d) for d in svc.ledger.datasets(p)]}

    @app.get("/v1/datasets/{name}")
    def one_dataset(name: str, p: Analyst):
        return described(granted(p, name), mechanisms=True)

    @app.get("/v1/datasets/{name}/budget")
    def budget(name: str, p: Analyst):
        ds = granted(p, name)
        return {"dataset": ds.name, "adjacency": ds.adjacency,
                **svc.ledger.budget(ds).as_dict()}

    @app.get("/v1/datasets/{name}/releases")
    def releases(name: str, p: Analyst):
        ds = granted(p, name)
        return {"dataset": ds.name, "releases": svc.ledger.releases(ds, owner=p.owner)}

    @app.get("/v1/datasets/{name}/releases/{request_id}")
    def artifact(name: str, request_id: str, p: Analyst):
        ds = granted(p, name)
        rec = svc.ledger.release(ds, request_id)
        if rec is None:
            raise ApiError(404, "not_found", f"no request {request_id!r} on dataset {name!r}")
        if rec["state"] != "released":
            return JSONResponse({"detail": f"request {request_id!r} has no artifact: it is "
                                 f"{rec['state'].replace('_', ' ')}", "code": "no_artifact",
                                 "state": rec["state"]}, status_code=404)
        return Response(rec["artifact"], media_type="application/json")

    @app.post("/v1/datasets/{name}/releases", status_code=201)
    async def make_release(name: str, p: Analyst, request: Request):
        body = await _json_body(request)
        ds = await run_in_threadpool(granted, p, name)
        return _respond(await run_in_threadpool(handle_release, svc.ledger, svc.signer,
                                                svc.instance, p, ds, body))

    # -------------------------------------------------------------------- owner
    @app.post("/v1/datasets", status_code=201)
    async def add_dataset(p: Owner, request: Request):
        return await run_in_threadpool(register, p, await _json_body(request))

    def register(p: Principal, body: dict):
        from .datasets import registration

        fields = {"name", "csv", "parquet", "bundled", "label_column", "classes", "bounds",
                  "norm_bound", "adjacency", "budget_epsilon", "budget_delta",
                  "max_epsilon_per_request", "dask"}
        unknown = sorted(set(body) - fields)
        if unknown:
            raise ApiError(422, "invalid_request", f"unknown field(s) {', '.join(unknown)}")
        try:
            values = registration(**body)
            ds = svc.ledger.add_dataset(values, by=p)
        except (TypeError, ValueError) as exc:
            raise ApiError(422, "invalid_request", " ".join(str(exc).split())) from None
        log.info("dataset %s registered by token %d (%s)", ds.name, p.id, p.name)
        return described(ds)

    @app.post("/v1/tokens", status_code=201)
    async def create_token(p: Owner, request: Request):
        return await run_in_threadpool(new_token, p, await _json_body(request))

    def new_token(p: Principal, body: dict):
        role, datasets = body.get("role"), body.get("datasets") or []
        name = body.get("name") or f"{role}"
        if not isinstance(datasets, list) or not isinstance(name, str) or len(name) > 64:
            raise ApiError(422, "invalid_request", "a token request has role, name (at most "
                           "64 characters) and datasets (a list of names)")
        try:
            tid, token = svc.ledger.create_token(role, name, datasets, by=p)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        log.info("token %d (%s, %s) created by token %d", tid, name, role, p.id)
        return {"id": tid, "name": name, "role": role, "datasets": datasets, "token": token}

    @app.get("/v1/tokens")
    def list_tokens(p: Owner):
        return {"tokens": svc.ledger.tokens()}

    @app.post("/v1/tokens/{token_id}/revoke")
    def revoke(token_id: int, p: Owner):
        try:
            svc.ledger.revoke_token(token_id, by=p)
        except ValueError as exc:
            raise ApiError(404, "not_found", str(exc)) from None
        log.info("token %d revoked by token %d", token_id, p.id)
        return {"id": token_id, "revoked": True}

    @app.get("/v1/audit")
    def audit(p: Owner, dataset: str | None = None):
        return {"audit": svc.ledger.audit(dataset)}

    return app


async def _json_body(request: Request) -> dict:
    """The request's body as a JSON object (read only after the token was checked)."""
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise ApiError(422, "invalid_request", "invalid request (the body is not JSON)"
                       ) from None
    if not isinstance(body, dict):
        raise ApiError(422, "invalid_request", "invalid request (the body must be a JSON "
                       "object)")
    return body


def _principal(request: Request) -> Principal:
    """The holder of the request's token (401 without a valid one)."""
    p = request.app.state.service.ledger.authenticate(
        bearer(request.headers.get("authorization")))
    if p is None:
        raise ApiError(401, "unauthorized", "a valid token is required "
                       "(Authorization: Bearer TOKEN)", {"WWW-Authenticate": "Bearer"})
    return p


def _owner(p: Annotated[Principal, Depends(_principal)]) -> Principal:
    if not p.owner:
        raise ApiError(403, "forbidden", "this endpoint needs an owner token")
    return p


# dependencies: the token is checked before the body is read (a 401 comes before a 422)
Analyst = Annotated[Principal, Depends(_principal)]
Owner = Annotated[Principal, Depends(_owner)]


def _respond(out: Outcome):
    if out.text is not None:
        return Response(out.text, status_code=out.status, media_type="application/json",
                        headers=out.headers)
    return JSONResponse(out.body, status_code=out.status, headers=out.headers)


def _version() -> str:
    from .._version import __version__

    return __version__


#: The largest request body read (a release request is a few hundred bytes).
MAX_BODY = 1 << 20


class _TooLarge(Exception):
    pass


class _Guard:
    """ASGI middleware: security headers on every answer, request bodies of at most
    :data:`MAX_BODY` bytes (413), and any unexpected error becomes a 500 ``internal error``
    answer logged by its type only (no stack trace, no message)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        size = 0

        async def limited_receive():
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > MAX_BODY:
                    raise _TooLarge
            return message

        async def guarded_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                for k, v in SECURITY_HEADERS.items():
                    if k.lower().encode() not in names:
                        headers.append((k.lower().encode(), v.encode()))
                if scope.get("path", "").startswith("/v1/"):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        async def answer(status: int, detail: str, code: str) -> None:
            body = json.dumps({"detail": detail, "code": code}).encode()
            await guarded_send({"type": "http.response.start", "status": status,
                                "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})

        length = dict(scope.get("headers", [])).get(b"content-length", b"0")
        if length.isdigit() and int(length) > MAX_BODY:
            await answer(413, "the request body is too large", "too_large")
            return
        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not started:
                await answer(413, "the request body is too large", "too_large")
        except Exception as exc:  # noqa: BLE001 - answered without details
            log.error("internal error in %s %s (%s)", scope.get("method"), scope.get("path"),
                      type(exc).__name__)
            if not started:
                await answer(500, "internal error", "internal")
