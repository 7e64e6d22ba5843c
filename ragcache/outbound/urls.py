"""The rule every base URL the service calls out to passes: a plain http(s) URL in one canonical form.

A URL with credentials, a query or a fragment is refused: a ``?x=`` would turn the path a caller appends into a
query, and userinfo would carry credentials nobody configured. URLs are compared in canonical form (scheme and host
lower case, no trailing slash), so ``HTTP://VLLM:8000/`` on an allow-list allows ``http://vllm:8000``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ragcache.errors import InvalidInputError

__all__ = ["canonical_url"]


def canonical_url(url: object, field: str) -> str:
    """``url`` in canonical form when it is a plain http(s) base URL; :class:`InvalidInputError` naming ``field``
    otherwise (no credentials, query, fragment, whitespace or backslash)."""
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or c == "\\" for c in url):
        raise InvalidInputError("must be an http(s) base URL without spaces or control characters", field=field)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidInputError("must be an http(s) base URL (its port is not a number)", field=field) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidInputError("must be an http(s) base URL with a host", field=field)
    if parts.username is not None or parts.password is not None:
        raise InvalidInputError("must not carry credentials (user:password@)", field=field)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise InvalidInputError("must not carry a query or a fragment (the service appends its own paths)", field=field)
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme.lower()}://{netloc}{parts.path.rstrip('/')}"
