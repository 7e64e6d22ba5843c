"""The data folder (ragcache.storage.data_folder): private to its user (0700, files 0600), refused when another user
owns it or may write it, and held by one process at a time, so that a cache opened on a folder another process
holds fails before any server starts on its files."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ragcache.errors import ConfigError, DataFolderInUseError
from ragcache.settings import Settings
from ragcache.storage.data_folder import LOCK_FILE, hold_data_folder, secure_data_dir
from ragcache.storage.processes import poll_until
from ragcache.storage.stores import Stores
from tests.processes import processes_using

HOLD_IN_ANOTHER_PROCESS = """
import sys
from pathlib import Path
from ragcache.errors import DataFolderInUseError
from ragcache.storage.data_folder import hold_data_folder
try:
    hold_data_folder(Path(sys.argv[1]), role=sys.argv[2])
except DataFolderInUseError as exc:
    print(exc)
    raise SystemExit(3)
print("held")
sys.stdout.flush()
sys.stdin.read()  # held until the test closes our stdin
"""


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_folder_is_made_0700(tmp_path):
    folder = secure_data_dir(tmp_path / "a" / "data")
    assert mode_of(folder) == 0o700


def test_an_open_folder_of_this_user_is_closed_to_0700(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    secure_data_dir(folder)
    assert mode_of(folder) == 0o700


def test_a_folder_others_may_write_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(ConfigError) as caught:
        secure_data_dir(folder)
    assert "writable by other users (mode 0777)" in str(caught.value) and "\n" not in str(caught.value)
    assert mode_of(folder) == 0o777  # refused, not changed


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to uid 65534, not to this user") as caught:
        secure_data_dir(folder)
    assert "\n" not in str(caught.value)


def test_a_folder_of_another_user_is_refused_without_root():
    # / belongs to root; as root this is the owner, and the test above gives the folder away instead.
    if os.geteuid() == 0:
        pytest.skip("root owns /")
    with pytest.raises(ConfigError, match="belongs to uid 0"):
        secure_data_dir(Path("/"))


def test_a_second_process_is_refused_with_the_holders_pid(tmp_path):
    with hold_data_folder(tmp_path / "data", role="serve"):
        second = subprocess.run([sys.executable, "-c", HOLD_IN_ANOTHER_PROCESS, str(tmp_path / "data"), "cache"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 3, second.stderr
        assert second.stdout.strip() == (f"a ragcache (pid {os.getpid()}) already serves {tmp_path / 'data'}: "
                                          "stop it, or use another folder (RAGCACHE_DATA_DIR)")
    # Released: the next process holds it.
    third = subprocess.Popen([sys.executable, "-c", HOLD_IN_ANOTHER_PROCESS, str(tmp_path / "data"), "cache"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert third.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        with pytest.raises(DataFolderInUseError, match=rf"a ragcache process \(pid {third.pid}\) already uses"):
            hold_data_folder(tmp_path / "data")
    finally:
        third.communicate(timeout=60)


def test_a_process_holds_its_folder_once_however_often_it_opens_it(tmp_path):
    first = hold_data_folder(tmp_path / "data", role="serve")
    second = hold_data_folder(tmp_path / "data")  # the service's own stores, inside `ragcache serve`
    assert second is first
    second.release()
    with pytest.raises(subprocess.CalledProcessError):  # still held by the first hold
        subprocess.run([sys.executable, "-c", HOLD_IN_ANOTHER_PROCESS, str(tmp_path / "data"), "cache"],
                       capture_output=True, timeout=120, check=True)
    first.release()
    assert (tmp_path / "data" / LOCK_FILE).exists()  # kept: removing it would let two processes lock two files


def test_stores_on_a_held_folder_start_no_server(tmp_path):
    data_dir = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_IN_ANOTHER_PROCESS, str(data_dir), "serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        with pytest.raises(DataFolderInUseError, match=rf"^a ragcache \(pid {holder.pid}\) already serves"):
            Stores.open(Settings(data_dir=data_dir))
        assert set(processes_using(data_dir)) == {holder.pid}  # no redis-server, no milvus on its files
        assert not (data_dir / "redis").exists() and not (data_dir / "milvus.db").exists()
    finally:
        holder.communicate(timeout=60)


def test_open_cache_on_a_folder_a_service_holds_says_so(tmp_path):
    from ragcache import open_cache

    data_dir = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_IN_ANOTHER_PROCESS, str(data_dir), "serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        with pytest.raises(DataFolderInUseError, match=rf"^a ragcache \(pid {holder.pid}\) already serves {data_dir}"):
            open_cache(Settings(data_dir=data_dir))
        assert set(processes_using(data_dir)) == {holder.pid}
    finally:
        holder.communicate(timeout=60)


def test_the_stores_files_are_private(tmp_path):
    data_dir = tmp_path / "data"
    stores = Stores.open(Settings(data_dir=data_dir))
    try:
        stores.redis.set("k", "v")  # type: ignore[union-attr]
        stores.redis.bgrewriteaof()  # type: ignore[union-attr]
        files = [path for path in data_dir.rglob("*") if path.is_file()]
        assert {path.name for path in files} >= {"appendonly.aof", "milvus.db", LOCK_FILE}
        assert {path.name: mode_of(path) for path in files} == dict.fromkeys((path.name for path in files), 0o600)
        assert mode_of(data_dir) == 0o700 and mode_of(data_dir / "redis") == 0o700
    finally:
        stores.close()


def test_the_stores_count_their_redis_restarts(tmp_path):
    # One worker: the service's own stores start the embedded Redis, supervised, and count its restarts for /stats.
    stores = Stores.open(Settings(data_dir=tmp_path / "data", milvus_uri="off"))
    try:
        assert stores.server_restarts() == {"redis": 0}
        os.kill(stores.embedded_redis.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
        assert poll_until(lambda: stores.server_restarts() == {"redis": 1}, timeout_s=120)
        assert stores.redis.set("written", "after the restart")  # type: ignore[union-attr]
    finally:
        stores.close()
