"""`/docs`: Swagger UI over `/openapi.json`, its assets served by this app from the pinned `swagger-ui-bundle`
package (Swagger UI 4.15.5), so the page works with no network and loads nothing from anywhere else: an
operator who pastes the admin token into it trusts only this server (docs/design.md says why).

ReDoc (`/redoc`) is not served: FastAPI's loads its script from a CDN."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

DOCS_URL = "/docs"
ASSETS_URL = "/docs/assets"
# the page's own inline script and style, and everything else from this server only
DOCS_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def install_docs(app: FastAPI) -> None:
    """Add `/docs` and its assets under `/docs/assets/` to `app` (made with `docs_url=None`)."""
    app.mount(ASSETS_URL, StaticFiles(directory=Path(str(swagger_ui_path))), name="swagger-ui")

    @app.get(DOCS_URL, include_in_schema=False)
    def docs() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters={"validatorUrl": None},  # its default fetches a badge from swagger.io
        )
        return HTMLResponse(bytes(page.body).decode("utf-8"), headers=DOCS_HEADERS)
