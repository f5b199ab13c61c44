"""`/docs` (Swagger UI) and `/redoc` (ReDoc) from assets installed with the app, not a CDN.

FastAPI's own pages load their JavaScript from jsDelivr and a favicon from its website, so on a
machine that cannot download they are blank. The `fastapi-offline` package ships Swagger UI 5
(which renders OpenAPI 3.1, the version FastAPI writes; `swagger-ui-bundle` 1.1.0 ships 4.15,
which does not) and ReDoc 2 as plain files; only those files are used here, served under
`ASSETS` with FastAPI's page templates pointed at them.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import Response

from deployments.errors import RouteNotFound

ASSETS = "/docs-assets"
_FILES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
# The assets change only with the installed package; let browsers keep them a day.
_CACHE = {"Cache-Control": "public, max-age=86400"}


def install_docs_pages(app: FastAPI) -> None:
    """The app must be built with `docs_url=None, redoc_url=None`."""
    static = resources.files("fastapi_offline").joinpath("static")
    # Read once per replica: a few MB, and every page load would otherwise touch the disk.
    blobs = {name: static.joinpath(name).read_bytes() for name in _FILES}
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            # Swagger UI would otherwise send the document to validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    @app.get(ASSETS + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in _FILES:
            raise RouteNotFound(f"No documentation asset '{name}'.")
        return Response(blobs[name], media_type=_FILES[name], headers=_CACHE)
