"""The logic around a slow or failing Milvus, with fake clients passed in through constructors: every call
gets the deadline, a bug is not an outage, and no lock shared by other work is held while Milvus is asked.
The real thing (a paused Milvus Lite server) is in test_milvus_paused.py."""

from __future__ import annotations

import json
import threading

import grpc
import pytest
import torch

from ragcache.errors import TierUnavailableError
from ragcache.retrieval.knowledge import DESCRIPTION_FORMAT, KnowledgeBase
from ragcache.storage.stores import MilvusConnection
from ragcache.tiers.milvus import MilvusTier

WAIT_S = 30  # how long a test waits on a thread that should finish at once: a hang detector, not a timing


class DeadlineExceeded(grpc.RpcError):
    """What grpc raises when a call's ``timeout`` passes."""

    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"


class RecordingClient:
    """Stands in for ``MilvusClient``: records every call with its keyword arguments."""

    def __init__(self, uri: str, **options):
        self.options = options
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.calls.append((name, kwargs))
            return []

        return call


def test_every_call_that_reaches_milvus_gets_the_deadline():
    connection = MilvusConnection("http://127.0.0.1:1", timeout_s=2.5, user="u", password="p", client_factory=RecordingClient)
    client = connection._connected()
    assert client.options == {"timeout": 2.5, "user": "u", "password": "p", "token": ""}
    for name in ("get", "upsert", "search", "query", "delete", "has_collection", "describe_collection",
                 "load_collection", "list_collections", "get_collection_stats", "create_collection", "drop_collection"):
        getattr(connection, name)("c")
    connection.get("c", timeout=9.0)  # a caller's own deadline wins
    assert [kwargs["timeout"] for _, kwargs in client.calls] == [2.5] * 12 + [9.0]


def test_a_local_milvus_lite_is_not_pinged_and_a_server_keeps_the_defaults():
    """pymilvus' idle keepalive pings (every 10 s) can draw a GOAWAY "too_many_pings"; a local socket needs none."""
    local = MilvusConnection("unix:/tmp/rc-milvus-x/milvus.sock", client_factory=RecordingClient)._connected()
    assert local.options["grpc_options"] == {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": False}
    remote = MilvusConnection("http://10.0.0.1:19530", client_factory=RecordingClient)._connected()
    assert "grpc_options" not in remote.options


def test_credentials_and_the_uri_password_never_show_in_the_repr():
    connection = MilvusConnection("http://root:hunter2@10.0.0.1:19530", password="pw-apart", client_factory=RecordingClient)
    assert repr(connection) == "MilvusConnection('http://***@10.0.0.1:19530', timeout_s=5.0)"


class BuggyClient:
    """A client whose ``get`` fails the way a bug does (not the way Milvus does)."""

    def has_collection(self, name, **kwargs):
        return True

    def describe_collection(self, name, **kwargs):
        return {"fields": [{"name": "vector", "params": {"dim": 4}}]}

    def load_collection(self, name, **kwargs):
        return None

    def get(self, *args, **kwargs):
        raise TypeError("a bug, not an outage")


def test_a_bug_in_the_l3_path_propagates_instead_of_becoming_store_unavailable():
    level = MilvusTier(BuggyClient(), space_id="cafecafecafecafe", dim=4, dtype=torch.float32)
    with pytest.raises(TypeError, match="a bug"):
        level.get_many(["rc:cafecafecafecafe:" + "0" * 32])


class HangingClient:
    """``has_collection`` blocks on the first call until released, then fails as a passed deadline does."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.num_has_collection = 0

    def has_collection(self, name, **kwargs):
        self.num_has_collection += 1
        if name.endswith("hung"):
            self.entered.set()
            self.release.wait(WAIT_S)
            raise DeadlineExceeded()
        return True

    def describe_collection(self, name, **kwargs):
        record = {"format": DESCRIPTION_FORMAT, "name": name, "space_id": "s", "model": "m", "dim": 4, "uid": "u"}
        return {"description": json.dumps(record)}

    def load_collection(self, name, **kwargs):
        return None

    def query(self, name, **kwargs):
        return [{"count(*)": 0}]


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_collection_lookup_waiting_on_milvus_holds_no_lock_other_collections_need():
    client = HangingClient()
    kb = KnowledgeBase(client)
    errors: list[Exception] = []
    hung = _in_thread(lambda: _record_error(errors, lambda: kb.collection_info("hung")))
    assert client.entered.wait(WAIT_S)
    other = _in_thread(lambda: kb.collection_info("other"))
    other.join(WAIT_S)
    finished_while_hung = not other.is_alive()
    client.release.set()
    hung.join(WAIT_S)
    assert finished_while_hung  # before: kb._lock was held across has_collection, so "other" waited
    assert len(errors) == 1 and isinstance(errors[0], TierUnavailableError) and "deadline" in str(errors[0])


def _record_error(errors: list[Exception], call) -> None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


class ArrivalLock:
    """A lock that counts the threads that have come to it, so a test knows they wait behind its holder."""

    def __init__(self):
        self._lock, self._guard = threading.Lock(), threading.Condition()
        self.num_arrived = 0

    def __enter__(self):
        with self._guard:
            self.num_arrived += 1
            self._guard.notify_all()
        self._lock.acquire()

    def __exit__(self, *exc_info):
        self._lock.release()

    def wait_for(self, count: int) -> bool:
        with self._guard:
            return self._guard.wait_for(lambda: self.num_arrived >= count, WAIT_S)


def test_threads_waiting_to_prepare_an_l3_collection_fail_with_the_first_instead_of_asking_again():
    client = HangingClient()
    level = MilvusTier(client, space_id="hung", dim=4, dtype=torch.float32)  # collection rc_hung
    level._ready_lock = lock = ArrivalLock()
    errors: list[Exception] = []
    first = _in_thread(lambda: _record_error(errors, lambda: level.get_many(["rc:hung:" + "1" * 32])))
    assert client.entered.wait(WAIT_S)
    waiting = [_in_thread(lambda: _record_error(errors, lambda: level.get_many(["rc:hung:" + "2" * 32]))) for _ in range(3)]
    assert lock.wait_for(4)  # all three wait behind the hung one
    client.release.set()
    for thread in (first, *waiting):
        thread.join(WAIT_S)
    assert len(errors) == 4 and all(isinstance(error, TierUnavailableError) for error in errors)
    assert client.num_has_collection == 1  # before: each waiting caller asked again, one deadline each in turn
