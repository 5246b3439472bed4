"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} with the right status.

Messages name the field ("max_tokens: ..."); nothing internal (exception text, tracebacks) reaches a
client: an unexpected failure answers 500 with an id that the server log carries next to the
traceback.
"""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 429: "rate_limit_error", 499: "client_closed_request",
          500: "internal_server_error", 503: "server_overloaded"}
RETRY_AFTER_S = 1  # what a 503 asks the client to wait before retrying


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @classmethod
    def from_value_error(cls, exc: ValueError) -> APIError:
        """Engine and SamplingParams messages start with the field name: "field: what is wrong"."""
        msg = str(exc)
        return cls(400, msg, param=field_of(msg))


def field_of(message: str) -> str | None:
    """The field a "field: message" text names (dotted paths and header names allowed)."""
    head, sep, _ = message.partition(":")
    ok = sep and head and all(part.replace("-", "_").isidentifier() or part.isdigit()
                              for part in head.split("."))
    return head if ok else None


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if status == 503:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    return JSONResponse(error_body(status, message, param, code), status_code=status,
                        headers=headers or None)


def internal_error(where: str) -> tuple[str, str]:
    """Log the current exception with a fresh id; return (id, the client's message)."""
    err_id = uuid.uuid4().hex[:12]
    log.exception("internal error %s on %s", err_id, where)
    return err_id, f"internal server error (id {err_id}; the server log has the details)"


ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat",
             "/generate": "generate", "/tokenize": "tokenize", "/v1/tokenize": "tokenize",
             "/detokenize": "tokenize", "/v1/detokenize": "tokenize"}


def endpoint_of(path: str) -> str:
    """The metrics label of a route: completions, chat, generate, tokenize, models, or other."""
    if path in ENDPOINTS:
        return ENDPOINTS[path]
    return "models" if path.startswith("/v1/models") else "other"


def _count(request: Request, status: int) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.observe_response(endpoint_of(request.url.path), status)


def _common_prefix(locs: list[tuple]) -> tuple:
    out = []
    for parts in zip(*locs):
        if any(p != parts[0] for p in parts):
            break
        out.append(parts[0])
    return tuple(out)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        _count(request, exc.status)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, exc.message, exc.param, exc.code, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        _count(request, 400)
        errors = exc.errors()
        err = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request"}
        if len(errors) > 1:  # a union field: one error per member; name the field itself
            common = _common_prefix([tuple(e.get("loc", ())) for e in errors])
            if len(common) > 1:
                err["loc"] = common
        if err.get("type") == "json_invalid":
            return error_response(400, f"malformed JSON body: {err.get('ctx', {}).get('error', '')}"
                                  .rstrip(": "), None, "json_invalid")
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param, own = ".".join(loc), field_of(msg)
        if own and (not param or own.startswith(f"{param}.")):  # a model check naming a field
            param = own
        if param and not msg.startswith(f"{param}:"):
            msg = f"{param}: {msg}"
        return error_response(400, msg if param else f"body: {msg}", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        _count(request, exc.status_code)
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        _count(request, 500)
        _, message = internal_error(request.url.path)
        return error_response(500, message, code="internal_error")
