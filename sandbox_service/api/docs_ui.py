"""`GET /docs` and `/redoc`: the OpenAPI documentation pages, their scripts and styles served by
this process (FastAPI's documented self-hosting), so that they work on a host without internet.

The assets (Swagger UI 5's bundle and CSS, ReDoc 2's standalone script) come from the
`fastapi-offline` package, which ships exactly the files FastAPI's pages load from a CDN.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"


def serve_docs(app: FastAPI) -> None:
    """Add /docs, /redoc and their assets to an app made with docs_url and redoc_url None."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    def urls(request: Request) -> tuple[str, str]:
        root = request.scope.get("root_path", "").rstrip("/")
        return f"{root}{app.openapi_url}", f"{root}{ASSETS_PATH}"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        openapi, assets = urls(request)
        return get_swagger_ui_html(
            openapi_url=openapi,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        openapi, assets = urls(request)
        return get_redoc_html(
            openapi_url=openapi,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets}/redoc.standalone.js",
            redoc_favicon_url=f"{assets}/favicon.png",
            with_google_fonts=False,
        )
