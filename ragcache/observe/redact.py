"""Credentials out of everything shown: the one helper that every URI passes through before it is printed,
logged, returned by ``/info`` or put in an error message.

A Redis or Milvus URI may carry a user and password (``redis://:secret@host:6379``,
``http://root:Milvus@host:19530``) or a token in its query (``?token=...``); a seed list joins several
URIs with commas. ``redact_url`` keeps what an operator needs to recognise the store (scheme, host, port,
path) and replaces every credential by ``***``; ``redact_text`` does the same to each of the given URIs
wherever it appears in a longer text (a foreign exception's message, for example).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_url", "redact_text"]

HIDDEN = "***"
# Query parameters that hold a credential in the URIs ragcache accepts (redis-py reads ``password``, pymilvus
# ``token``); matched case-insensitively, by substring so that ``access_token`` or ``db_password`` count too.
_SECRET_PARAMS = ("password", "token", "secret", "key", "auth")


def redact_url(url: str) -> str:
    """``url`` with its user info and secret query values replaced by ``***``; a file path is unchanged."""
    return ",".join(_redact_one(part) for part in url.split(","))


def redact_text(text: str, *urls: str | None) -> str:
    """``text`` with every occurrence of each URI (and of the password inside it) replaced by its redacted form."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, redact_url(url))
        for part in url.split(","):
            password = urlsplit(part.strip()).password if "://" in part else None
            if password:
                text = text.replace(password, HIDDEN)
    return text


def _redact_one(part: str) -> str:
    if "://" not in part:
        return part  # a path (Milvus Lite's .db file) carries no credential
    try:
        split = urlsplit(part)
        hostinfo = split.netloc.rpartition("@")[2]
        netloc = f"{HIDDEN}@{hostinfo}" if "@" in split.netloc else split.netloc
        query = split.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(name, HIDDEN if _is_secret(name) else value) for name, value in pairs], safe="*")
        return urlunsplit((split.scheme, netloc, split.path, query, split.fragment))
    except ValueError:  # not parseable (a bad port, say): show nothing of it rather than risk a secret
        return f"{part.split('://', 1)[0]}://{HIDDEN}"


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_PARAMS)
