"""Redis and Milvus plumbing: clients, cluster pipelines, the Milvus error conversion, the embedded servers (kept
alive by ``supervision``), and the data folder they share (private, one process at a time: ``data_folder``).

Each name is imported on first use: the HTTP client reaches this package (through ``redis_client``) and must not
pull in pymilvus, which ``stores`` and ``milvus_errors`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragcache.observe.exports import lazy_exports

_EXPORTS = {
    ".stores": ("Stores",),
    ".redis_client": ("REDIS_ERRORS", "asyncio_twin", "is_cluster"),
    ".milvus_errors": ("is_milvus_outage", "milvus_error_message", "milvus_failures"),
    ".embedded_milvus": ("MilvusLiteServer",),
    ".embedded_redis": ("EmbeddedRedis",),
    ".data_folder": ("PRIVATE_UMASK", "DataFolderLock", "hold_data_folder", "secure_data_dir"),
    ".supervision": ("Supervisor", "shared_restarts", "write_shared_restarts"),
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from ragcache.storage.data_folder import PRIVATE_UMASK, DataFolderLock, hold_data_folder, secure_data_dir
    from ragcache.storage.embedded_milvus import MilvusLiteServer
    from ragcache.storage.embedded_redis import EmbeddedRedis
    from ragcache.storage.milvus_errors import is_milvus_outage, milvus_error_message, milvus_failures
    from ragcache.storage.redis_client import REDIS_ERRORS, asyncio_twin, is_cluster
    from ragcache.storage.stores import Stores
    from ragcache.storage.supervision import Supervisor, shared_restarts, write_shared_restarts
