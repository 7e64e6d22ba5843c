"""``GET /docs``: the API's interactive docs (Swagger UI), every file served by the service itself under the
dashboard's strict Content-Security-Policy (ragcache_server/routes_ui.py).

FastAPI's own /docs loads Swagger UI's scripts from a CDN and starts them with an inline script, on the same
origin as /ui, whose API key sits in sessionStorage: a script from elsewhere could read it. Here the page is
a static file, its start-up a file of ours (no inline script), and Swagger UI's files come from the
``fastapi-offline`` package (pinned in pyproject.toml), so the page loads nothing from any other origin. ReDoc
is not served: it needs inline styles and blob: workers, which the CSP refuses; one docs page is enough.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter

from ragcache_server.routes_ui import ASSETS, add_static_route

__all__ = ["router", "DOCS_PATHS"]

SWAGGER = Path(fastapi_offline.__file__).resolve().parent / "static"
# path -> (file, media type). Exact paths only: these are open (auth.OPEN_PATHS).
FILES = {
    "/docs": (ASSETS / "docs.html", "text/html; charset=utf-8"),
    "/docs/docs.js": (ASSETS / "docs.js", "text/javascript; charset=utf-8"),
    "/docs/swagger-ui-bundle.js": (SWAGGER / "swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "/docs/swagger-ui.css": (SWAGGER / "swagger-ui.css", "text/css; charset=utf-8"),
}
DOCS_PATHS = frozenset(FILES)

router = APIRouter(include_in_schema=False)
for _path, (_file, _media_type) in FILES.items():
    add_static_route(router, _path, _file, _media_type)
