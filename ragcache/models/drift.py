"""Model drift: notice when the model behind a name now computes other vectors, and stop serving the old ones.

A remote provider can change the model behind a name, and a local model whose ``model_revision`` is set by
hand is not hashed, so the space id alone cannot tell. The check embeds a few fixed canary texts directly
through the encoder (never the cache) and compares them with the canaries stored with the space
(``ragcache.models.fingerprints``). A canary further than the dtype's tolerance from its stored vector means another
model: the space moves to the next *generation* (``EmbeddingSpace.generation``, part of every key), so no
vector of the old model is looked up again, in L1, L2 or L3; the old entries age out (L1's LRU, L2's TTL)
or stay unreachable (L3). The model's one cache serves every scope (tenants, prompts) under one ``Generation``,
so one switch moves them all.

Requests racing a switch stay correct because a request takes the space once, at its start, and every key
it reads or writes is of that space: a request that computed with the old model writes under the old
generation's keys, never the new one's (L3 routes writes by the key's space, ``tiers.spaces``). Vectors
computed by a changed model before the check notices land in the old generation, which the switch then
abandons; the check interval bounds that window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ragcache.core.encoder import Encoder
from ragcache.core.keys import Generation
from ragcache.errors import RagCacheError, TierUnavailableError
from ragcache.models.fingerprints import Fingerprint, Fingerprints
from ragcache.models.remote.http import RemoteEncoder

__all__ = ["CANARY_TEXTS", "TOLERANCES", "DriftGuard", "DriftMonitor", "DriftState", "Generation", "fingerprint_distance"]

log = logging.getLogger(__name__)

# Fixed for ever: changing them would make every stored fingerprint look like drift. Short and long, prose,
# code, digits and non-Latin scripts, so a change in any part of the tokenizer or the weights shows.
CANARY_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Invoice 2024-0917: 3 x widgets at $19.99, total $59.97, due in 30 days.",
    "Die Katze schläft auf dem Sofa, während es draußen regnet.",
    "東京は日本の首都です。",
    "a",
    "Retrieval-augmented generation grounds a language model's answers in documents found by a search over "
    "embeddings, so the answer can cite its sources and stay current without retraining the model.",
)

# Largest relative L2 distance ||new - stored|| / ||stored|| of one canary that still counts as the same model.
# Measured here with all-MiniLM-L6-v2 on CPU (one run each): the same weights give the same canary batch bit for
# bit; the same texts in other batch shapes move by 8e-7 (float32), 1.2e-3 (float16) and 1.0e-2 (bfloat16), which
# is the noise another machine, kernel or provider replica can add. Hosted providers are not always bit-stable
# either (~1e-3 is reported). A changed model moves them by more: the last layer's output weights scaled by
# 1.01 -> 6e-3, by 1.05 -> 3.1e-2 (float32). Each tolerance sits a few times above its dtype's noise, so a
# replica on other hardware never starts a new generation by itself; a change smaller than the noise (all word
# embeddings scaled by 1.001 -> 6.6e-4) is below what any cache could tell from recomputation noise.
TOLERANCES = {"float32": 2e-3, "float16": 5e-3, "bfloat16": 3e-2}


@dataclass(frozen=True)
class DriftState:
    """What /stats, /metrics and /health say about one model's drift check."""

    model: str
    space_id: str  # the base space (generation 0), where the fingerprint is kept
    generation: int
    tolerance: float
    num_canaries: int
    num_checks: int
    num_check_errors: int
    num_drift_events: int
    last_distance: float | None  # largest canary distance at the last check
    last_check_at: float | None  # unix time
    last_drift_at: float | None
    last_error: str | None

    @property
    def status(self) -> str:
        """``check_failing`` while the last check failed, ``changed`` once a drift was seen, else ``stable``."""
        if self.last_error is not None:
            return "check_failing"
        return "changed" if self.num_drift_events else "stable"


def fingerprint_distance(current: np.ndarray, stored: np.ndarray) -> float:
    """The largest relative L2 distance of one canary; infinite when the shapes differ (another dimension)."""
    if current.shape != stored.shape:
        return float("inf")
    norms = np.maximum(np.linalg.norm(stored, axis=1), np.finfo(np.float32).tiny)
    return float((np.linalg.norm(current - stored, axis=1) / norms).max())


class DriftGuard:
    """The drift check of one model: fingerprint on first use, compare on every later check, switch on drift."""

    def __init__(
        self,
        model: str,
        encoder: Encoder,
        fingerprints: Fingerprints,
        generation: Generation,
        *,
        clock: Callable[[], float] = time.time,
        max_races: int = 3,
        tolerance: float | None = None,
    ):
        self.model = model
        self.encoder = encoder
        self.base = replace(encoder.space, generation=0, namespace=None)
        self.fingerprints = fingerprints
        self.generation = generation
        # An operator's own tolerance for an upstream noisier than its dtype (docs/drift.md), else the dtype's.
        self.tolerance = TOLERANCES[self.base.dtype] if tolerance is None else tolerance
        self._clock = clock
        self._max_races = max_races
        self._lock = threading.Lock()  # one check of a model at a time
        self._num_checks = self._num_check_errors = self._num_drift_events = 0
        self._last_distance: float | None = None
        self._last_check_at: float | None = None
        self._last_drift_at: float | None = None
        self._last_error: str | None = None

    def check(self) -> bool:
        """Embed the canaries and compare; True when the model changed (the caches now use a new generation).

        Raises ``RagCacheError`` when the model or every fingerprint store failed (nothing switches then)."""
        with self._lock:
            first = self._num_checks == 0
            self._num_checks += 1
            self._last_check_at = self._clock()
            try:
                drifted, adopted = self._compare(self._canaries())
            except RagCacheError as exc:
                self._num_check_errors += 1
                self._last_error = str(exc)
                raise
            self._last_error = None
            # A newer generation than the one in use: this check or another replica's saw the model change
            # (at start, a stored generation that the model matches is where the last run stopped: no event).
            changed = drifted or (adopted > self.generation.value and not first)
            if adopted != self.generation.value:
                log.warning(
                    "%s: model %r now embeds under generation %d (was %d); cached vectors of other generations "
                    "are no longer served", "drift detected" if changed else "drift check", self.model, adopted,
                    self.generation.value,
                )
            self.generation.value = adopted
            if changed:
                self._num_drift_events += 1
                self._last_drift_at = self._last_check_at
            return changed

    def _canaries(self) -> np.ndarray:
        # A remote model's canaries go with its own key, alone: the texts are public, and a caller's pass-through
        # key in flight for them at the same moment (routed elsewhere by a gateway, or refused) must not decide
        # what the check sees.
        encoder = self.encoder
        encode = encoder.encode_with_own_key if isinstance(encoder, RemoteEncoder) else encoder.encode
        vectors = encode(list(CANARY_TEXTS))
        array = vectors.detach().to("cpu", torch.float32).numpy() if isinstance(vectors, torch.Tensor) else np.asarray(vectors, np.float32)
        if array.shape != (len(CANARY_TEXTS), self.base.dim) or not np.isfinite(array).all():
            raise TierUnavailableError("drift", f"the model answered the canaries with {array.shape} values, or not finite ones")
        # Rounded to the space's dtype, as every cached vector is: the comparison then sees the same numbers.
        return torch.from_numpy(array).to(getattr(torch, self.base.dtype)).float().numpy()

    def _compare(self, canaries: np.ndarray) -> tuple[bool, int]:
        """(the model changed, the generation to use now), racing other replicas through compare-and-set."""
        for _ in range(self._max_races):
            stored, arbiter = self.fingerprints.load(self.base.space_id)
            if stored is None:
                # First use: this model's vectors define the current generation.
                record = Fingerprint(self.generation.value, canaries)
                if self.fingerprints.save(self.base.space_id, record, expected=arbiter):
                    return False, record.generation
                continue
            self._last_distance = fingerprint_distance(canaries, stored.vectors)
            if self._last_distance <= self.tolerance:
                if arbiter != stored.generation:  # the arbiter lost the record (a flushed Redis): put it back
                    self.fingerprints.save(self.base.space_id, stored, expected=arbiter)
                return False, stored.generation
            record = Fingerprint(stored.generation + 1, canaries)
            if self.fingerprints.save(self.base.space_id, record, expected=arbiter):
                return True, record.generation
            # Another replica wrote a generation first: compare with that one.
        raise TierUnavailableError("drift", f"the fingerprint kept changing under {self._max_races} checks in a row")

    def state(self) -> DriftState:
        return DriftState(
            model=self.model,
            space_id=self.base.space_id,
            generation=self.generation.value,
            tolerance=self.tolerance,
            num_canaries=len(CANARY_TEXTS),
            num_checks=self._num_checks,
            num_check_errors=self._num_check_errors,
            num_drift_events=self._num_drift_events,
            last_distance=self._last_distance,
            last_check_at=self._last_check_at,
            last_drift_at=self._last_drift_at,
            last_error=self._last_error,
        )


class DriftMonitor:
    """Runs every guard's check now (at start) and then every ``interval_s`` in one daemon thread (0: never).

    A failed check is logged and counted; the caches keep the generation they have, and the next check tries
    again (a provider that is down at start must not stop the service)."""

    def __init__(self, guards: Sequence[DriftGuard], *, interval_s: float = 0.0):
        self.guards = list(guards)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> DriftMonitor:
        self.check_all()
        if self.interval_s > 0 and self.guards:
            self._thread = threading.Thread(target=self._run, name="ragcache-drift-check", daemon=True)
            self._thread.start()
        return self

    def check_all(self) -> int:
        """Check every model once; returns how many drifted."""
        num_drifted = 0
        for guard in self.guards:
            try:
                num_drifted += guard.check()
            except RagCacheError as exc:
                log.warning("drift check of model %r failed, keeping generation %d: %s", guard.model, guard.generation.value, exc)
        return num_drifted

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check_all()

    def states(self) -> list[DriftState]:
        return [guard.state() for guard in self.guards]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
