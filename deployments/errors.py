"""Every error Tributary answers with: an HTTP status and an OpenAI-style body.

`{"error": {"message", "type", "param", "code"}}` is the only error shape on the wire. A
5xx never carries an exception's text: the message is fixed here, the detail goes to logs.
"""

from __future__ import annotations

import math

import orjson
from starlette.responses import Response

from deployments.core.protocol import Rejection


class TributaryError(Exception):
    status: int = 500
    error_type: str = "server_error"
    default_code: str | None = None
    # A refusal the client should retry carries Retry-After even where the raiser gave none.
    default_retry_after_s: float | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.retry_after_s = (
            retry_after_s if retry_after_s is not None else self.default_retry_after_s
        )

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class InvalidRequest(TributaryError):
    status = 400
    error_type = "invalid_request_error"


class ModelNotFound(TributaryError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"


class RouteNotFound(TributaryError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ObjectNotFound(TributaryError):
    """A file or batch that does not exist, or belongs to another tenant: the two answer
    alike, so a tenant cannot learn which ids others hold."""

    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class Conflict(TributaryError):
    status = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class MethodNotAllowed(TributaryError):
    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class PayloadTooLarge(TributaryError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class Unauthorized(TributaryError):
    status = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "WWW-Authenticate": "Bearer"}


class Forbidden(TributaryError):
    status = 403
    error_type = "permission_error"
    default_code = "model_not_allowed"


class RateLimited(TributaryError):
    """The tenant is over its own rate; it alone has to slow down."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class DeadlineExceeded(TributaryError):
    status = 504
    error_type = "timeout_error"
    default_code = "deadline_exceeded"


class Overloaded(TributaryError):
    """The server sheds this request's class or its queue is full: status 429 for
    normal/batch (come back later), 503 for realtime and for Serve's own back-pressure."""

    status = 503
    error_type = "overloaded_error"
    default_code = "server_overloaded"
    default_retry_after_s = 1


class NotReady(TributaryError):
    status = 503
    error_type = "server_error"
    default_code = "not_ready"
    default_retry_after_s = 2


class InternalError(TributaryError):
    status = 500
    error_type = "server_error"
    default_code = "internal_error"

    def __init__(self) -> None:
        super().__init__("The server failed to process the request.")


MODEL_FAILED_MESSAGE = "The model failed on a batch containing this request."


class ModelFailed(TributaryError):
    status = 500
    error_type = "server_error"
    default_code = "model_error"

    def __init__(self) -> None:
        super().__init__(MODEL_FAILED_MESSAGE)


def error_response(error: TributaryError) -> Response:
    return Response(
        orjson.dumps(error.body()),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers(),
    )


# Said by the ingress on its estimate and by the rerank replica on the exact count.
def too_many_passes(
    passes: int, model: str, limit: int, param: str, *, estimated: bool
) -> PayloadTooLarge:
    how = "about " if estimated else ""
    return PayloadTooLarge(
        f"This request needs {how}{passes} chunk passes (query-document chunk pairs the model "
        f"scores; a long document is several); model '{model}' scores at most {limit} per "
        f"request (max_chunk_passes). Send fewer or shorter documents, lower "
        f"max_tokens_per_doc, or score only each document's start (TEI: truncate).",
        param=param,
    )


# What a model replica's refusal answers over HTTP, for every task.
def rejection_error(rejection: Rejection) -> TributaryError:
    if rejection.status == 504:
        return DeadlineExceeded(rejection.message)
    if rejection.status in (429, 503):
        return Overloaded(
            rejection.message,
            retry_after_s=rejection.retry_after_s,
            status=rejection.status,
            code=rejection.code,
        )
    if rejection.status >= 500:
        return ModelFailed()
    return InvalidRequest(
        rejection.message, param=rejection.param, code=rejection.code, status=rejection.status
    )
