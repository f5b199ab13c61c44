"""The Batch API's routes: /v1/files and /v1/batches, as OpenAI's client calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile
from starlette.responses import FileResponse, Response

from deployments.errors import InvalidRequest, PayloadTooLarge
from deployments.http.common import ingress_of, json_response, read_body
from deployments.http.openapi import REF_TEMPLATE, error_responses
from deployments.ingress.batches.schemas import parse_limit

if TYPE_CHECKING:
    from deployments.core.access.access import Tenant
    from deployments.ingress.batches.service import BatchService

# Room for the multipart envelope around the largest file.
ENVELOPE_BYTES = 64 * 1024

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}
BATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"$ref": REF_TEMPLATE.format(model="CreateBatchRequest")}
            }
        },
    }
}
NOT_FOUND = "No such file or batch for this API key's tenant (another tenant's answers alike)."


def _errors(extra: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    return error_responses({404: NOT_FOUND, **(extra or {})})


def _caller(request: Request) -> tuple[BatchService, Tenant | None]:
    ingress = ingress_of(request)
    tenant = ingress.gate.authenticate(request.headers.get("authorization"))
    service: BatchService = request.app.state.batches
    service.start()  # where no lifespan ran (tests with the ASGI app alone)
    return service, tenant


def install_batch_routes(app: FastAPI, service: BatchService) -> None:
    app.state.batches = service
    limits = service.config
    too_large = (
        f"The file is over {limits.max_file_bytes} bytes or one of its lines over "
        f"{limits.max_line_bytes}."
    )

    @app.post("/v1/files", openapi_extra=UPLOAD_BODY, responses=_errors({413: too_large}))
    async def upload_file(request: Request) -> Response:
        service, tenant = _caller(request)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_file_bytes + ENVELOPE_BYTES:
            raise PayloadTooLarge(too_large, param="file", code="file_too_large")
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise InvalidRequest("Upload the file as multipart/form-data (fields file, purpose).")
        async with request.form(max_files=1, max_fields=4) as form:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise InvalidRequest("Missing required parameter 'file'.", param="file")
            if not isinstance(purpose, str):
                raise InvalidRequest("Missing required parameter 'purpose'.", param="purpose")
            body = await service.upload(tenant, upload.filename or "", purpose, upload.file)
        return json_response(body)

    @app.get("/v1/files/{file_id}", responses=_errors())
    async def get_file(request: Request, file_id: str) -> Response:
        service, tenant = _caller(request)
        return json_response((await service.file(tenant, file_id)).to_openai())

    @app.get("/v1/files/{file_id}/content", responses=_errors())
    async def file_content(request: Request, file_id: str) -> Response:
        service, tenant = _caller(request)
        record = await service.file(tenant, file_id)
        path = service.store.files.path(record.id)
        return FileResponse(path, media_type="application/jsonl", filename=record.filename)

    @app.delete("/v1/files/{file_id}", responses=_errors())
    async def delete_file(request: Request, file_id: str) -> Response:
        service, tenant = _caller(request)
        return json_response(await service.delete_file(tenant, file_id))

    @app.post("/v1/batches", openapi_extra=BATCH_BODY, responses=_errors())
    async def create_batch(request: Request) -> Response:
        service, tenant = _caller(request)
        body = await read_body(request, ingress_of(request).config.ingress.max_body_bytes)
        return json_response(await service.create(tenant, body))

    @app.get("/v1/batches", responses=_errors())
    async def list_batches(request: Request) -> Response:
        service, tenant = _caller(request)
        after = request.query_params.get("after")
        limit = parse_limit(request.query_params.get("limit"))
        return json_response(await service.list(tenant, after, limit))

    @app.get("/v1/batches/{batch_id}", responses=_errors())
    async def get_batch(request: Request, batch_id: str) -> Response:
        service, tenant = _caller(request)
        return json_response((await service.batch(tenant, batch_id)).to_openai())

    @app.post(
        "/v1/batches/{batch_id}/cancel",
        responses=_errors({409: "The batch has finished: there is nothing to cancel."}),
    )
    async def cancel_batch(request: Request, batch_id: str) -> Response:
        service, tenant = _caller(request)
        return json_response(await service.cancel(tenant, batch_id))


async def batch_summary(request: Request) -> dict[str, Any] | None:
    service: BatchService | None = getattr(request.app.state, "batches", None)
    return None if service is None else await service.summary()
