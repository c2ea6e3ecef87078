"""One error base; each subclass is a business condition with a status and a stable code."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

logger = logging.getLogger(__name__)


class AppError(Exception):
    """Rendered as {"error": code, "detail": message} with `status_code`."""

    status_code = 400
    code = "bad_request"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(AppError):
    status_code = 404
    code = "not_found"


class Conflict(AppError):
    status_code = 409
    code = "conflict"


class QuotaExceeded(AppError):
    status_code = 403
    code = "quota_exceeded"


class InvalidSpec(AppError):
    status_code = 422
    code = "invalid_spec"


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AppError)
    async def _app_error(_: Request, exc: AppError) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.code, "detail": exc.detail}
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        # One line per problem, each naming the field, so a CLI can print them as they are.
        problems = [
            {"field": _location(tuple(e["loc"])), "message": e["msg"]} for e in exc.errors()
        ]
        summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        return JSONResponse(
            status_code=422,
            content={"error": "invalid_request", "detail": summary, "problems": problems},
        )


def render_unavailable(app: FastAPI, error: type[Exception], code: str, advice: str) -> None:
    """A backend the request needed did not answer: a 503 with a stable `code`; `advice`
    holds `{}` for the backend's message. The composition root (app.py) names the backends,
    so this module depends on none of them."""

    @app.exception_handler(error)
    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        # The request was valid; the backend could not be asked. Nothing changed on our side
        # (its transaction rolled back). One line for the client and one for the operator:
        # an outage is expected weather, not a stack trace per request.
        detail = advice.format(first_line(exc))
        logger.warning("%s %s: %s: %s", request.method, request.url.path, code, detail)
        return JSONResponse(status_code=503, content={"error": code, "detail": detail})


def first_line(exc: BaseException) -> str:
    """A backend's message up to its first line break (drivers append background links)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else exc.__class__.__name__


class Problem(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """Every error the API returns, whatever its status."""

    error: str = Field(description="A stable code, e.g. not_found, invalid_spec.")
    detail: str = Field(description="What is wrong and what to do, for people.")
    problems: list[Problem] | None = Field(default=None, description="Per-field, on 422.")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in [
        (401, "No valid token"),
        (403, "Not allowed"),
        (404, "No such object"),
        (409, "Conflicts with the current state"),
        (413, "Body too large"),
        (429, "Too many requests"),
        (503, "Slurm or the database did not answer; try again"),
    ]
}


def document_errors(app: FastAPI) -> None:
    """Make the OpenAPI document say what the handlers above really send, 422 included."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = default_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components["HTTPValidationError"] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# Ids are 32-bit in Postgres: bound them at the door, so a huge id is a 422, not a 500.
DbId = Annotated[int, Path(ge=1, le=2**31 - 1, description="An id (1 to 2^31-1).")]
