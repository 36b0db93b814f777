"""The dashboard and the API's documentation pages, served from files inside the package.

    GET /         the dashboard: one HTML page; its script (web/app.js) signs in with a token
                  and talks only to the public API, with that token, as any client would
    GET /ui/...   its script, styles and vendored libraries (web/, web/vendor/)
    GET /docs     Swagger UI, GET /redoc ReDoc, over /openapi.json

Nothing here is fetched from the internet at run time: the charting library (uPlot), the YAML
parser (js-yaml), Swagger UI and ReDoc are vendored with their licences under web/vendor/
(web/vendor/README.md says where each came from; scripts/vendor_web.sh fetches them again).
These paths need no token: they hold no job's data, and the page asks for the token before
it reads any. /openapi.json is open too (the API's shape, as published in the source), so the
documentation pages load before anyone signs in; "Authorize" there takes the token.
"""

from __future__ import annotations

import functools
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

WEB = Path(__file__).with_name("web")
ASSETS = "/ui/"
REDOC_JS = "/redoc.js"  # the vendored ReDoc, served with one URL changed (below)
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
PAGES = frozenset({"/", "/docs", "/redoc", REDOC_JS, "/openapi.json"})
# The dashboard loads only what it ships, and talks only to this service.
DASHBOARD_POLICY = ("default-src 'self'; img-src 'self' data:; style-src 'self' "
                    "'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; "
                    "base-uri 'none'; form-action 'self'")
# The documentation pages start their libraries with inline scripts, and ReDoc searches in a
# worker; neither may reach another host (ReDoc would fetch its maker's logo from a CDN).
DOCS_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' "
               "'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
               "connect-src 'self'; frame-ancestors 'none'")


def add_pages(api: FastAPI) -> None:
    """Add the dashboard, its assets, /docs and /redoc to `api` (out of its API document)."""
    api.mount(ASSETS.rstrip("/"), StaticFiles(directory=WEB), name="ui")
    vendor = f"{ASSETS}vendor"

    @api.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={
            "Content-Security-Policy": DASHBOARD_POLICY, "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    @api.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return _with_policy(get_swagger_ui_html(
            openapi_url=api.openapi_url or "/openapi.json", title=f"{api.title} API",
            swagger_js_url=f"{vendor}/swagger-ui-bundle.js",
            swagger_css_url=f"{vendor}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}favicon.svg"))

    @api.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _with_policy(get_redoc_html(
            openapi_url=api.openapi_url or "/openapi.json", title=f"{api.title} API",
            redoc_js_url=REDOC_JS, redoc_favicon_url=f"{ASSETS}favicon.svg",
            with_google_fonts=False))

    @api.get(REDOC_JS, include_in_schema=False)
    async def redoc_js() -> Response:
        return Response(_redoc_without_cdn(), media_type="text/javascript",
                        headers={"Cache-Control": "max-age=3600"})


@functools.lru_cache(maxsize=1)
def _redoc_without_cdn() -> bytes:
    """The vendored ReDoc, its footer's logo (hard-coded to its maker's CDN, which the page's
    policy blocks with a console error) pointed at this service's own icon."""
    code = (WEB / "vendor" / "redoc.standalone.js").read_bytes()
    return code.replace(REDOC_CDN_LOGO, f"{ASSETS}favicon.svg".encode())


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = DOCS_POLICY
    return page
