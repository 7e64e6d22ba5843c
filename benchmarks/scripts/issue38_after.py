"""Issue 38's reproductions of items 4 and 6, after the fix, in one process (the service in-process on its embedded
defaults, L2 and L3 off):

- item 4: 20 connections that ask for ~8 MB answers (2,048 vectors as JSON) and read nothing, at the default send
  deadline (``RAGCACHE_SEND_TIMEOUT_S``, 30 s): the connections held and the process's RSS each second for 45 s;
- item 6: a member whose 32 texts the disk level holds, grouped with another member's 32 new texts on a model that
  takes 10 s: when each is answered, and the held texts walked alone;
- item 1 (an idle process): the disk level's files after three budgets' worth of writes by one process while another
  that wrote first sits idle, and how long the idle one keeps the dropped generations mapped (the test's helpers,
  ``tests/tiers/test_disk_faults.py``).

    cd <checkout> && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/scripts/issue38_after.py
"""

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import psutil  # noqa: E402
import torch  # noqa: E402

from ragcache.core import EmbeddingCache  # noqa: E402
from ragcache.core.levels import Levels  # noqa: E402
from ragcache.settings import Settings  # noqa: E402
from ragcache.storage.disk_store import DiskStore  # noqa: E402
from ragcache.tiers.disk import DiskTier  # noqa: E402
from ragcache.tiers.memory import MemoryTier  # noqa: E402
from ragcache_server.embedding import EmbedGroups  # noqa: E402
from tests.fakes import HashEncoder  # noqa: E402
from tests.live_server import LiveServer  # noqa: E402
from tests.tiers import test_disk_faults as disk  # noqa: E402

DIM = 384


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def slow_readers(folder: str) -> None:
    settings = Settings(redis_url="off", milvus_uri="off", data_dir=folder)
    with LiveServer(settings) as live:
        body = json.dumps({"input": ["one text, asked for many times over"] * 2048}).encode()
        request = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body)) + body
        before, sockets = rss_mib(), []
        for _ in range(20):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", live.port))
            sock.sendall(request)
            sockets.append(sock)
        started, samples = time.monotonic(), []
        while time.monotonic() - started < 45:
            time.sleep(1)
            samples.append((round(time.monotonic() - started), len(live.server.server_state.connections), round(rss_mib())))
        print(f"item 4: send deadline {settings.service.send_timeout_s} s; RSS before {before:.0f} MiB; "
              f"(seconds, connections held, RSS MiB) every 5 s: {samples[4::5]}")
        for sock in sockets:
            sock.close()


class SlowModel(HashEncoder):
    def encode(self, texts, **options):
        if any(text.startswith("new") for text in texts):
            time.sleep(10.0)
        return super().encode(texts)


def grouped_member(folder: str) -> None:
    store = DiskStore(Path(folder) / "disk", capacity_bytes=64 << 20)
    l1 = MemoryTier(2 * DIM * 4, DIM, torch.float32)  # two vectors: the held texts end up on the disk level only
    cache = EmbeddingCache(SlowModel(dim=DIM), Levels([l1, DiskTier(store, dim=DIM, dtype=torch.float32)], dim=DIM,
                                                       dtype=torch.float32, write_behind=False))
    held, new = [f"held {i}" for i in range(32)], [f"new {i}" for i in range(32)]
    cache.embed(held)
    cache.embed(["filler 0", "filler 1"])

    async def both() -> tuple[dict[str, float], int]:
        groups = EmbedGroups(asyncio.to_thread)
        probes = {"new": cache.probe(new), "held": cache.probe(held)}
        started, answered = time.perf_counter(), {}

        async def member(name: str, texts: list[str]) -> None:
            await groups.embed(cache, texts, probe=probes[name], normalize=False)
            answered[name] = time.perf_counter() - started

        await asyncio.gather(member("new", new), member("held", held))
        return answered, groups.num_grouped

    answered, grouped = asyncio.run(both())
    started = time.perf_counter()
    cache.embed(held)
    alone = time.perf_counter() - started
    print(f"item 6: {grouped} members in one group; the held member answered after {answered['held'] * 1000:.1f} ms, "
          f"the new texts (a 10 s model) after {answered['new']:.2f} s; the held texts walked alone: {alone * 1000:.1f} ms")
    cache.close()
    store.close()


def idle_process(folder: str) -> None:
    idle = subprocess.Popen([sys.executable, disk.PROCESS, folder, str(disk.CAPACITY), "idle", "0", "64"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=disk.ENV)
    assert idle.stdin is not None and idle.stdout is not None
    while idle.stdout.readline().strip() != "idle":  # its batches in, then no call of its own
        pass
    tier = disk.open_tier(folder, disk.CAPACITY)
    disk.write(tier, 64, 64 + 3 * disk.CAPACITY // disk.VALUE_BYTES)
    used = disk.files_of(Path(folder))
    tier.store.close()
    started, mapped = time.monotonic(), disk.mapped_deleted_generations(idle.pid)
    while disk.mapped_deleted_generations(idle.pid) and time.monotonic() - started < 60:
        time.sleep(0.05)
    print(f"item 1: files {used:,} bytes for a {disk.CAPACITY:,}-byte budget after three budgets written; the idle "
          f"process mapped {len(mapped)} dropped generations when the writes ended, none {time.monotonic() - started:.2f} s later")
    idle.stdin.write("\n")
    idle.stdin.flush()
    idle.wait(timeout=60)


if __name__ == "__main__":
    idle_process(tempfile.mkdtemp())
    grouped_member(tempfile.mkdtemp())
    slow_readers(tempfile.mkdtemp())
