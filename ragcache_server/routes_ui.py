"""The dashboard: ``GET /ui`` and its two assets, static files served by the service itself (no build step,
no CDN). The page holds no data: it calls the API from the browser with the key the operator types in, so
every figure it shows passes the same keys and scopes as any client (ragcache_server/auth.py).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import Response

__all__ = ["router", "UI_PATHS", "HEADERS", "ASSETS", "add_static_route"]

ASSETS = Path(__file__).resolve().parent / "ui"
# path -> (file, media type). Exact paths only: these are open (auth.OPEN_PATHS), so nothing else under /ui is.
FILES = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/ui.js": ("ui.js", "text/javascript; charset=utf-8"),
    "/ui/ui.css": ("ui.css", "text/css; charset=utf-8"),
}
UI_PATHS = frozenset(FILES)
# The page may talk only to this service and load only its own files: no inline script, nothing fetched
# from elsewhere, not framed by another site. A key in sessionStorage is then readable by this origin's
# scripts only, and every element the page renders from API data is text (textContent), never markup.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def add_static_route(to: APIRouter, path: str, file: Path, media_type: str) -> None:
    """``GET path`` answers ``file`` with the CSP above (the dashboard's and the API docs' files)."""
    # Read once at start-up: the files are part of the installed packages.
    body = file.read_bytes()

    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    to.add_api_route(path, serve, methods=["GET"], name=f"static:{path}")


for _path, (_file, _media_type) in FILES.items():
    add_static_route(router, _path, ASSETS / _file, _media_type)
