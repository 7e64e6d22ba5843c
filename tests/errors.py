"""ragcache's error object ``{"type", "message", "field"}`` read from any of the service's three error shapes
(ragcache_server/error_shapes.py): its own, OpenAI's on ``/v1/*`` (ragcache's type is OpenAI's ``code``, except the
codes OpenAI names itself) and TEI's on TEI's routes (a string ``error``, ragcache's ``type`` and ``field`` beside it).
Tests that check what an error says, whichever route answered it, read it through this."""

from __future__ import annotations

from typing import Any

import httpx

# OpenAI's own codes for three of ragcache's types.
_OPENAI_CODES = {"invalid_api_key": "unauthorized", "rate_limit_exceeded": "rate_limited", "model_not_found": "not_found"}


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    error = body["error"]
    if isinstance(error, str):
        return {"type": body.get("type"), "message": error, "field": body.get("field")}
    if "code" in error and "param" in error:
        return {"type": _OPENAI_CODES.get(error["code"], error["code"]), "message": error["message"], "field": error.get("field")}
    return error
