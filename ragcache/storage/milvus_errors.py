"""What a failing Milvus raises, told apart from a bug, and said in one line: shared by the L3 level, the
knowledge base, the fingerprint store and the service's start-up checks, so each converts Milvus failures alike."""

from __future__ import annotations

import grpc
from pymilvus.exceptions import ConnectError, MilvusException, MilvusUnavailableException

__all__ = ["is_milvus_outage", "milvus_error_message", "milvus_failures"]

# What a failing Milvus raises through pymilvus, and nothing else: MilvusException (a status from the server,
# a connection pymilvus gave up on, its retry deadline passed) and grpc's errors, which pymilvus lets escape
# unconverted (DEADLINE_EXCEEDED when a call's ``timeout`` passes, UNAVAILABLE on a dropped connection;
# FutureTimeoutError while a channel waits to be ready). A bug in ragcache (a TypeError, a KeyError) is
# not one of them: it propagates, rather than showing as "store unavailable".
milvus_failures: tuple[type[BaseException], ...] = (MilvusException, grpc.RpcError, grpc.FutureTimeoutError)


def is_milvus_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means Milvus did not answer (timed out, unreachable, connection lost), as opposed to an
    answer that is an error (a status from the server: it is up, and only this request failed)."""
    if isinstance(exc, (grpc.RpcError, grpc.FutureTimeoutError, MilvusUnavailableException, ConnectError)):
        return True
    # pymilvus' retry loop wraps the grpc error it gave up on, keeping grpc's status code as the code.
    return isinstance(exc, MilvusException) and isinstance(exc.code, grpc.StatusCode)


def milvus_error_message(exc: BaseException) -> str:
    """One line for a Milvus failure: grpc's own text spans several lines and names its internal classes."""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "no answer within the deadline (milvus_timeout_s)"
        return f"{code.name}: {exc.details()}" if callable(getattr(exc, "details", None)) else code.name
    if isinstance(exc, grpc.FutureTimeoutError):
        return "no connection within the deadline (milvus_timeout_s)"
    return str(getattr(exc, "message", None) or exc).strip()
