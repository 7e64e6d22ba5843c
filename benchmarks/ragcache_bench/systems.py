"""The systems compared, each behind ``embed(texts) -> np.ndarray [n, dim] float32``.

Every system wraps the same ``SentenceTransformer`` object with the same batch size, and the Redis-backed
ones share the same Redis server. ``seed(texts, vectors)`` makes vectors resident in a system's own storage
format without computing them, so a fetch race starts from the same keys everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["PEER_MODEL_NAME", "BareModel", "CountingModel", "LangChainCache", "RedisVLCache", "RedisFloor", "DictFloor",
           "RagcacheLibrary"]

BATCH_SIZE = 32
# The model name RedisVL records with each cached vector (the shared model object is this one).
PEER_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class CountingModel:
    """The shared ``SentenceTransformer``, counting the texts each ``encode`` is handed: a cache built over it
    that answered from its store computed none, which is what a fetch race must check before it is timed
    as one (a miss would time the model instead)."""

    def __init__(self, model):
        self._model = model
        self.num_texts = 0

    def encode(self, sentences, *args, **kwargs):
        self.num_texts += 1 if isinstance(sentences, str) else len(sentences)
        return self._model.encode(sentences, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class BareModel:
    """No cache: ``SentenceTransformer.encode`` directly."""

    name = "no cache (sentence-transformers)"

    def __init__(self, model, batch_size: int = BATCH_SIZE):
        self.model = model
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.encode(list(texts), batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)


def _langchain_embeddings(model, batch_size: int):
    from langchain_core.embeddings import Embeddings

    class SentenceTransformerEmbeddings(Embeddings):
        """LangChain's embeddings interface over the shared model (what HuggingFaceEmbeddings does)."""

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True).tolist()

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    return SentenceTransformerEmbeddings()


class LangChainCache:
    """LangChain ``CacheBackedEmbeddings`` over ``langchain_community.storage.RedisStore`` (values are
    JSON lists of floats; keys a blake2b hash of namespace + text, the fastest encoder it offers)."""

    name = "LangChain CacheBackedEmbeddings + RedisStore"

    def __init__(self, model, redis_url: str, namespace: str, batch_size: int = BATCH_SIZE):
        import redis
        from langchain_community.storage import RedisStore

        try:  # LangChain >= 1.0 moved it to langchain-classic
            from langchain_classic.embeddings import CacheBackedEmbeddings
        except ImportError:
            from langchain.embeddings import CacheBackedEmbeddings  # type: ignore[no-redef,unused-ignore]

        self.client = redis.Redis.from_url(redis_url)
        self.store = RedisStore(client=self.client, namespace="lc")
        self.cached = CacheBackedEmbeddings.from_bytes_store(
            _langchain_embeddings(model, batch_size),
            self.store,
            namespace=namespace,
            batch_size=batch_size,
            key_encoder="blake2b",
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.cached.embed_documents(list(texts)), dtype=np.float32)

    def seed(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.cached.document_embedding_store.mset(list(zip(texts, vectors.tolist())))

    def close(self) -> None:
        self.client.close()


class RedisVLCache:
    """RedisVL's ``HFTextVectorizer`` with an ``EmbeddingsCache`` (its documented way to cache embeddings),
    sharing the model object rather than loading a second copy."""

    name = "RedisVL EmbeddingsCache (HFTextVectorizer)"

    def __init__(self, model, redis_url: str, model_name: str, batch_size: int = BATCH_SIZE):
        import redis
        from redisvl.extensions.cache.embeddings import EmbeddingsCache
        from redisvl.utils.vectorize import HFTextVectorizer

        class SharedModelVectorizer(HFTextVectorizer):
            def _initialize_client(self, model_name: str, **kwargs):
                self._client = model

        self.client = redis.Redis.from_url(redis_url)
        self.cache = EmbeddingsCache(name="rvl", redis_client=self.client)
        self.vectorizer = SharedModelVectorizer(model=model_name, cache=self.cache)
        self.model_name = model_name
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.vectorizer.embed_many(list(texts), batch_size=self.batch_size), dtype=np.float32)

    def seed(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        items = [{"content": t, "model_name": self.model_name, "embedding": v} for t, v in zip(texts, vectors.tolist())]
        self.cache.mset(items)

    def close(self) -> None:
        self.client.close()


class RedisFloor:
    """The floor for L2: one bare redis-py (hiredis) ``MGET`` of ragcache's own keys, decoded with
    ``np.frombuffer`` (header skipped, no checks). Keys are given, not built from texts."""

    name = "floor: one MGET + np.frombuffer"

    def __init__(self, redis_url: str, dim: int, header_bytes: int = 16):
        import redis

        self.client = redis.Redis.from_url(redis_url)
        self.dim = dim
        self.header_bytes = header_bytes

    def fetch(self, keys: Sequence[str]) -> np.ndarray:
        values = self.client.mget(keys)
        table = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), -1)  # type: ignore[arg-type]
        return np.ascontiguousarray(table[:, self.header_bytes :]).view(np.float32)

    def close(self) -> None:
        self.client.close()


class DictFloor:
    """The floor for L1: a plain dict of key -> numpy vector, looked up and stacked."""

    name = "floor: plain dict + np.stack"

    def __init__(self):
        self.vectors: dict[str, np.ndarray] = {}

    def seed(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        self.vectors.update(zip(keys, vectors))

    def fetch(self, keys: Sequence[str]) -> np.ndarray:
        vectors = self.vectors
        return np.stack([vectors[key] for key in keys])


class RagcacheLibrary:
    """ragcache as a library: ``cache.embed``."""

    name = "ragcache (library)"

    def __init__(self, cache):
        self.cache = cache

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.cache.embed(texts)
