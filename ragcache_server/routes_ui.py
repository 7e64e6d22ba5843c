"""The dashboard: ``GET /ui`` and its two assets, static files served by the service itself (no build step,
no CDN). The page holds no data: it calls the API from the browser with the key the operator types in, so
every figure it shows passes the same keys and scopes as any client (ragcache_server/auth.py).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import Response

__all__ = ["router", "UI_PATHS"]

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


def _route(path: str, file_name: str, media_type: str) -> None:
    # Read once at start-up: the files are part of the package and small.
    body = (ASSETS / file_name).read_bytes()

    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    router.add_api_route(path, serve, methods=["GET"], name=f"ui:{file_name}")


for _path, (_file, _media_type) in FILES.items():
    _route(_path, _file, _media_type)
