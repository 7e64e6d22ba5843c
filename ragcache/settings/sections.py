"""The sections of the settings, one model per concern; each option declared once, here.

A field's name is its flat option name: ``RAGCACHE_`` plus the name in capitals is its environment variable
(``Levels.redis_url`` is ``RAGCACHE_REDIS_URL``), so names stay unique across sections (``Settings`` checks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragcache.observe.redact import redact_url

__all__ = ["MAX_BATCH_CEILING", "Access", "Compute", "Drift", "Knowledge", "Levels", "Prefixes", "Rerank", "Service", "Space"]

# The most items any list in a request body may hold, whatever ``max_batch`` says: the HTTP schemas declare it,
# so validation refuses a longer list at once instead of building every item first.
MAX_BATCH_CEILING = 16384


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Space(_Section):
    """The embedding space: which models, how they compute, and what is part of the cache key."""

    model: str = Field("sentence-transformers/all-MiniLM-L6-v2", description="default model: name or path")
    extra_models: list[str] = Field(default_factory=list, description="more models served beside `model`")
    model_revision: str | None = Field(None, description="revision; default: a content hash of the model files")
    dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description="compute and storage dtype (part of the key)")
    normalize: bool = Field(False, description="store L2-normalised vectors (requests can still ask for it)")
    max_seq_length: int | None = Field(None, gt=0, description="tokens; default: the model's own")
    prompt: str | None = Field(None, description="instruction prepended to every text (part of the key)")
    model_prompts: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description='named prompts per model (JSON), e.g. {"intfloat/e5-small-v2": {"query": "query: ", "document": "passage: "}}; '
        '/search embeds with "query", /documents with "document" (part of the key)',
    )
    text_normalization: Literal["NFC", "NFKC"] | None = Field(
        None, description="Unicode normalisation before hashing (part of the key); unset: the exact bytes")
    device: str = Field("auto", description="auto = CUDA when available, else CPU")
    model_backend: Literal["torch", "onnx", "onnx-int8"] = Field(
        "torch", description="engine of the local models: torch, or ONNX Runtime on the CPU (exported locally into "
        "<data_dir>/onnx; onnx-int8: int8 weights); each backend is its own space (part of the key)")
    model_backends: dict[str, Literal["torch", "onnx", "onnx-int8"]] = Field(
        default_factory=dict, description='per-model backend (JSON), overriding model_backend, e.g. {"all-MiniLM-L6-v2": "onnx"}')
    models_file: Path | None = Field(
        None, description="JSON or TOML file of remote models (OpenAI-compatible, TEI, Ollama) beside the local ones (docs/providers.md)"
    )
    models_json: str | None = Field(None, description="the same list of remote models as JSON text")

    @property
    def models(self) -> list[str]:
        """Every local model served: ``model`` first, then the extra ones."""
        return [self.model, *[m for m in self.extra_models if m != self.model]]


class Levels(_Section):
    """The cache levels: L1 in process, the host's disk, L2 in Redis, L3 in Milvus, and how vectors are written to them."""

    l1_bytes: int = Field(256 * 1024 * 1024, gt=0, description="L1 slab budget in bytes")
    disk_path: str | None = Field(
        None,
        description="folder of the per-host disk level (LMDB generations, shared by the host's processes); unset: "
        "<data_dir>/disk under `ragcache serve`, none in the library; 'off': none",
    )
    disk_max_bytes: int = Field(
        2 * 1024**3, gt=0, description="hard bound of the disk level's files; the oldest generation goes when it is reached")
    disk_generations: int = Field(
        4, ge=2, le=64, description="the disk level's generations: a full newest one drops the oldest (1/N of the budget at a time)")
    redis_url: str | None = Field(
        None,
        description="unset: an embedded Redis is started; 'off': no L2; a cluster node, or comma-separated seed nodes",
    )
    redis_ttl_s: int | None = Field(7 * 24 * 3600, gt=0, description="L2 time to live; unset = no expiry")
    redis_refresh_ttl_on_hit: bool = Field(False, description="an L2 hit restarts the entry's time to live (sliding expiry)")
    embedded_redis_max_bytes: int = Field(
        1024**3, gt=0, description="memory limit of the embedded Redis (no redis_url); least recently used TTL'd keys are evicted"
    )
    redis_timeout_s: float = Field(0.5, gt=0, description="connect and read timeout of a Redis call; slower counts as a failure")
    milvus_uri: str = Field("", description="default: <data_dir>/milvus.db (Milvus Lite); 'off': no L3")
    milvus_timeout_s: float = Field(
        5.0, gt=0, description="deadline of every Milvus call (L3 and the knowledge base); slower counts as an outage"
    )
    # Credentials apart from the URI, never printed (repr=False); a URI is only ever shown redacted (ragcache.observe.redact).
    milvus_user: str | None = Field(None, repr=False, description="Milvus user (with milvus_password)")
    milvus_password: str | None = Field(None, repr=False, description="Milvus password")
    milvus_token: str | None = Field(None, repr=False, description="Milvus token ('user:password' or an API key); wins over user/password")
    l3_max_rows: int | None = Field(
        None, ge=0, description="L3 size budget per space: the oldest written rows go beyond it; unset: a tenth of Milvus Lite's "
        "volume in rows, at most 1,000,000 (a server: 1,000,000); 0: no bound")
    l3_max_age_s: float | None = Field(None, gt=0, description="L3 age budget: rows last written longer ago go; unset = none")
    data_dir: Path = Field(Path("data"), description="local state: the embedded Redis's snapshots, the default Milvus Lite file")
    write_behind: bool = Field(True, description="store in L2/L3 from a worker thread per level")
    l3_write_linger_ms: float = Field(
        500.0, ge=0, description="L3's write-behind gathers writes this long into one Milvus call (fewer calls, less CPU)"
    )
    l3_empty_recheck_s: float | None = Field(
        30.0, gt=0, description="an empty L3 collection is not asked; its row count is read again this often (rows other "
        "processes write are found within it); unset: always asked")
    l3_admission: Literal["auto", "all", "reuse"] = Field(
        "auto",
        description="which vectors L3 stores: 'reuse' = a text asked for again after leaving L1 (served by the disk level "
        "or L2), written behind; 'all' = every computed vector too; 'auto' = reuse with a disk level, else all",
    )

    def __repr_args__(self):
        # A URI may still carry a password (redis://:secret@host): shown redacted, like everywhere else.
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name in ("redis_url", "milvus_uri") and value else value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value in (None, "", "off") or value.startswith(("redis://", "rediss://", "unix://")) and "," not in value:
            return value or None
        seeds = [part.strip() for part in value.split(",")]
        if all(seed.startswith(("redis://", "rediss://")) for seed in seeds):
            return ",".join(seeds)  # Redis Cluster seed nodes
        raise ValueError(
            "redis_url must be redis://..., rediss://..., unix://..., a comma-separated list of redis:// "
            "cluster seed nodes, 'off', or unset"
        )

    @property
    def l2_enabled(self) -> bool:
        return self.redis_url != "off"

    @property
    def l3_on_reuse(self) -> bool:
        """Whether L3 takes only vectors that proved reuse (``l3_admission``)."""
        return self.l3_admission == "reuse" or self.l3_admission == "auto" and self.resolved_disk_path is not None

    @property
    def resolved_disk_path(self) -> Path | None:
        """The disk level's folder, None when there is none (unset in the library, or 'off')."""
        if self.disk_path in (None, "", "off"):
            return None
        return Path(self.disk_path)

    @property
    def resolved_milvus_uri(self) -> str | None:
        """The Milvus to use: the configured URI, the Milvus Lite file under ``data_dir`` by default, None when off."""
        if self.milvus_uri == "off":
            return None
        return self.milvus_uri or str(self.data_dir / "milvus.db")


class Compute(_Section):
    """Calls to the model: batching, back-pressure, and computing a missed text once across replicas."""

    compute_batch_size: int = Field(32, gt=0, description="most texts in one model call")
    compute_max_wait_ms: float = Field(2.0, ge=0, description="how long a model batch waits to fill while another request may join")
    compute_max_pending: int = Field(
        4096, gt=0, description="most texts queued for the model; more: 503 with Retry-After (one request alone always fits)"
    )
    single_flight: bool = Field(True, description="replicas sharing Redis compute a text missed at once only once (docs/replicas.md)")
    single_flight_ttl_ms: int = Field(15000, gt=0, description="lock lifetime: how long a dead holder can keep others waiting")
    single_flight_wait_ms: int = Field(15000, ge=0, description="most a replica waits for another's vector before computing it")


class Knowledge(_Section):
    """The knowledge base's collections and its search result cache."""

    keyword_index: bool = Field(
        True, description="new collections get a BM25 index for keyword/hybrid search (slower Milvus writes); false: dense only"
    )
    result_cache_max_bytes: int = Field(
        1024 * 1024, gt=0, description="largest search result list (JSON bytes) cached in Redis; larger ones are not cached"
    )
    collection_max_documents: int | None = Field(
        1_000_000, gt=0, description="most documents one collection may hold; an ingest past it is refused whole (409); unset: none")
    tenant_max_documents: int | None = Field(
        2_000_000, gt=0, description="most documents one tenant's collections may hold together (409 beyond); unset: none")
    ingest_min_free_bytes: int | None = Field(
        1 << 30, ge=0, description="free bytes an ingest must leave on the embedded Milvus Lite's volume (409 beyond); unset: not checked")


class Rerank(_Section):
    """Reranking (ragcache.rerank): served by /rerank and the rerank stage of /search."""

    rerank_models: list[str] = Field(default_factory=list, description="local cross-encoders (folder or name) served by /rerank")
    rerank_url: str | None = Field(None, description="a remote rerank endpoint, e.g. http://host:7997/rerank (Infinity)")
    rerank_remote_model: str | None = Field(None, description="the model name the remote endpoint serves (and ours for it)")
    rerank_api: Literal["tei", "cohere"] = Field("tei", description="the remote endpoint's shape: TEI, or Cohere/Infinity")
    rerank_api_key: str | None = Field(None, repr=False, description="bearer token for the remote endpoint")
    rerank_revision: str = Field("unversioned", description="revision label of the remote model (part of the score key)")
    rerank_timeout_s: float = Field(10.0, gt=0, description="deadline of a whole remote rerank call, retries included; slower is an outage")
    rerank_max_answer_bytes: int = Field(1 << 20, gt=0, description="most bytes of one remote rerank answer; larger is refused (502)")
    rerank_l1_bytes: int = Field(8 * 1024 * 1024, gt=0, description="L1 budget for cached rerank scores (4 bytes each)")


class Drift(_Section):
    """Model drift (docs/drift.md): canaries stored with each space tell a changed model."""

    drift_check: bool = Field(True, description="check each model against canaries stored with its space (changed: new generation)")
    drift_check_interval_s: float = Field(300.0, ge=0, description="seconds between drift checks after the one at start; 0 = only at start")
    drift_tolerance: float | None = Field(None, gt=0, description="most relative canary distance of an unchanged model; unset: the dtype's")


class Prefixes(_Section):
    """The KV-prefix registry: keep-warm of vLLM prefix-cache entries."""

    prefix_warm_budget_per_minute: int = Field(120, gt=0, description="most warm requests sent to vLLM a minute")
    prefix_warm_budget_per_tenant_per_minute: int = Field(
        60, gt=0, description="most warm requests one tenant's prefixes may take a minute, within the whole budget "
        "(one tenant's many prefixes never spend another's; the keys without a tenant share one)")
    prefix_warm_budget_sized: bool = Field(
        True, description="size the warm budget from the engines' /metrics (one warm per KV-cache turnover per pinned "
        "prefix and endpoint, twice over), within [prefix_warm_budget_min_per_minute, prefix_warm_budget_per_minute]; "
        "false: prefix_warm_budget_per_minute, fixed (docs/kv-events.md)")
    prefix_warm_budget_min_per_minute: int = Field(12, gt=0, description="the least warms a minute a sized budget allows")
    prefix_min_rewarm_interval_s: float = Field(1.0, gt=0, description="shortest time between two warms of one prefix")
    prefix_max_rewarm_interval_s: float = Field(120.0, gt=0, description="longest time between two warms of one prefix")
    prefix_vllm_endpoints: list[str] = Field(
        default_factory=list, max_length=64,
        description="the deployment's vLLM replicas (base URLs): a prefix whose target is one of them is kept warm on all")
    prefix_allowed_targets: list[str] = Field(
        default_factory=list, max_length=256,
        description="more base URLs (vLLM servers, LMCache controllers) any tenant's prefix may name, beside "
        "prefix_vllm_endpoints; with API keys (or a bind beyond loopback) no other URL is ever called")
    prefix_tenant_targets: dict[str, list[str]] = Field(
        default_factory=dict,
        description='base URLs one tenant\'s prefixes may name besides the shared ones (JSON), e.g. {"acme": ["http://vllm-acme:8000"]}')
    prefix_max_text_bytes: int = Field(256 * 1024, gt=0, description="most UTF-8 bytes of one prefix's text (413 beyond)")
    prefix_max_per_tenant: int = Field(
        100, gt=0, description="most prefixes one tenant may register (403 beyond; the keys without a tenant count as one)")
    prefix_registrations_per_minute: int = Field(
        60, gt=0, description="most prefix registrations of one tenant in any minute, per replica (429 beyond)")
    prefix_kv_events: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description='vLLM endpoints that publish KV events (--kv-events-config), by base URL (JSON): '
        '{"http://vllm-1:8000": {"endpoint": "tcp://vllm-1:5557", "replay_endpoint": "tcp://vllm-1:5558"}}; their '
        "residency comes from the engine, warms go out on eviction (docs/kv-events.md)")
    prefix_lease_ttl_s: float = Field(
        10.0, gt=0, description="with Redis: how long a dead replica's warm leases outlive it before another takes over")
    prefix_warm_priority: int = Field(
        1_000_000, description="vLLM request priority of warms (larger: later, under vLLM's --scheduling-policy priority; "
        "0: as users')")
    prefix_warm_max_waiting: int = Field(
        0, ge=0, description="a due warm waits while vLLM's /metrics reports more requests waiting than this")
    prefix_warm_max_running: int | None = Field(
        None, ge=0, description="a due warm waits while vLLM reports more requests running (0: strict idle); unset: no limit")
    prefix_warm_max_defer_s: float = Field(5.0, ge=0, description="longest a due warm waits for vLLM to calm down")


class Service(_Section):
    """The HTTP service: where it listens, what one request may carry and take, and what it reports."""

    host: str = Field("127.0.0.1", description="address `ragcache serve` binds (beyond loopback only with API keys)")
    port: int = Field(8000, description="port `ragcache serve` listens on")
    max_batch: int = Field(2048, gt=0, le=MAX_BATCH_CEILING, description="most texts one request may carry (413 beyond)")
    truncate: bool = Field(True, description="truncate over-long texts; false: reject them with 413")
    max_text_bytes: int = Field(65536, gt=0, description="most UTF-8 bytes in one text or query (413 beyond)")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="most bytes in one request body (413 beyond)")
    max_answer_bytes: int = Field(
        32 * 1024 * 1024, gt=0,
        description="most bytes of hits' texts and metadata in one /search, /search/batch or /documents/get answer "
        "(413 beyond: ask for fewer queries or hits, or include_text=false)",
    )
    request_timeout_s: float = Field(60.0, gt=0, description="a request still unanswered after this gets 504")
    body_timeout_s: float = Field(30.0, gt=0, description="a request body still not in after this gets 408")
    header_timeout_s: float = Field(
        10.0, gt=0, description="a connection's request line and headers must be in within this, or it is closed (slow clients)")
    send_timeout_s: float = Field(
        30.0, gt=0, description="an answer backed up in a connection's write buffer (a client not reading) must drain "
        "within this, or the connection is closed (slow readers)")
    max_connections: int = Field(
        0, ge=0, description="most open connections, one beyond closed as it is accepted; 0: the descriptor limit less 128, "
        "at most 4096")
    max_worker_threads: int = Field(
        32, gt=0, description="most threads running blocking work (the model, Redis, Milvus), abandoned ones included"
    )
    malloc_retain_bytes: int = Field(
        128 * 1024 * 1024, ge=0,
        description="freed memory glibc keeps for reuse, not faulted in again per request (ragcache.app.allocator); 0: glibc's defaults",
    )
    torch_threads: int = Field(
        0, ge=0, description="torch's CPU threads per operation (intra-op); 0: one when every model is remote (the cache's own "
        "tensor work is small, and idle pool threads spin: ragcache.app.torch_threads), else torch's default")
    stats_window_s: float = Field(300.0, gt=0, description="seconds covered by the recent figures of /stats")
    tracing: Literal["off", "otlp", "console"] = Field(
        "off", description="OpenTelemetry spans per request, level lookup and model call (ragcache.observe.tracing)")
    tracing_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces; unset: the OTEL_EXPORTER_OTLP_* default")


class Access(_Section):
    """Who may use the service (docs/SECURITY.md): API keys, tenants and their quotas, rate limits."""

    # repr=False: a key never shows in a repr of the settings, a log line or a traceback.
    api_key: str | None = Field(None, repr=False, description="when set, requests need 'Authorization: Bearer <key>' (all scopes)")
    api_keys_file: Path | None = Field(None, description="JSON or TOML file of API keys with scopes and tenants")
    api_keys: str | None = Field(None, repr=False, description="the same key list as JSON text, e.g. from a secret store")
    insecure: bool = Field(False, description="allow a non-loopback bind without any API key")
    tenant_max_collections: int | None = Field(
        100, gt=0, description="most knowledge-base collections one tenant may create (403 beyond); unset: no quota"
    )
    tenant_cache_namespaces: bool = Field(False, description="each tenant its own cache entries (no shared hits)")
    rate_limit_per_s: float | None = Field(None, gt=0, description="requests a second per key; unset = no limit")
    rate_limit_burst: int | None = Field(None, gt=0, description="bucket size; default: 2 x rate, at least 1")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses (IPs or CIDRs) of the proxies in front whose X-Forwarded-For names the client; none: the "
        "connection's own address counts (rate limits and the failed-key budget), a forwarded header is ignored")

    def bind_refusal(self, host: str) -> str | None:
        """Why the service must not bind ``host`` with these settings, or None: a non-loopback address
        needs an API key unless ``insecure`` says otherwise (safe by default)."""
        if self.insecure or self.api_key or self.api_keys or self.api_keys_file:
            return None
        if host in ("localhost", "::1") or host.startswith("127."):
            return None
        return (
            f"refusing to listen on {host} without API keys: anyone who can reach it could use and change the "
            "service. Set RAGCACHE_API_KEY or RAGCACHE_API_KEYS_FILE (docs/SECURITY.md), bind 127.0.0.1, or "
            "pass --insecure (RAGCACHE_INSECURE=true) to accept an open service"
        )
