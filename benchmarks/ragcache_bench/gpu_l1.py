"""The GPU path of L1, checked and timed: run it whenever a CUDA device is at hand.

    python -m ragcache_bench.gpu_l1                    # device = cuda (fails with a clear message without one)
    python -m ragcache_bench.gpu_l1 --device cpu       # the same checks on the CPU (what CI runs)

What it checks, for float32, float16 and bfloat16:
- exact: a slab on the device returns bit-identical vectors to a slab on the CPU for the same keys, and the
  same hit positions, for lookups of 1 to 10,000 keys;
- no host round trip: ``EmbeddingCache.embed(..., as_tensor=True)`` over a device L1 returns a tensor that
  lives on the device, without computing anything, and (on CUDA) without a single device-to-host copy,
  counted by the torch profiler;
and what it times (medians, side by side in one run): the device L1 lookup for 1..10,000 keys, against a CPU
L1 lookup followed by the copy to the device that a caller wanting a device tensor would otherwise pay.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from ragcache.core.cache import EmbeddingCache
from ragcache.core.keys import EmbeddingSpace
from ragcache.core.levels import Levels
from ragcache.tiers.memory import MemoryTier, resolve_device
from ragcache_bench import add_gpu_l1_arguments
from ragcache_bench.report import write_json

__all__ = ["LookupTiming", "check_and_time", "main", "run"]

DTYPES = ("float32", "float16", "bfloat16")
SIZES = (1, 10, 100, 1_000, 10_000)


@dataclass(frozen=True)
class LookupTiming:
    dtype: str
    num_keys: int
    device_lookup_us: float  # L1 on the device: index lookup + gather, result on the device
    cpu_lookup_us: float  # L1 on the CPU, result on the CPU
    cpu_lookup_then_copy_us: float  # L1 on the CPU, then copied to the device (what a device caller pays)


class _NoModel:
    """An encoder that must never be called: the hand-off check serves everything from L1."""

    def __init__(self, space: EmbeddingSpace):
        self.space = space

    def encode(self, texts: Sequence[str], *, prompt: str | None = None) -> torch.Tensor:  # takes no prompt (none declared)
        raise AssertionError(f"the model was asked for {len(texts)} texts: L1 should have served them all")

    def stats(self):
        raise AssertionError("not used")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_us(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        _synchronize(device)
        started = time.perf_counter()
        run()
        _synchronize(device)
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples)


def _filled_pair(dtype: torch.dtype, dim: int, num_entries: int, device: torch.device, seed: int):
    """The same keys and vectors in a CPU slab and a device slab."""
    keys = [f"rc:gpu-check:{i:08x}" for i in range(num_entries)]
    vectors = torch.randn(num_entries, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)
    capacity = num_entries * dim * vectors.element_size()
    cpu_tier = MemoryTier(capacity, dim, dtype, device="cpu")
    device_tier = MemoryTier(capacity, dim, dtype, device=device)
    cpu_tier.put_many(keys, vectors)
    device_tier.put_many(keys, vectors.to(device))
    return keys, vectors, cpu_tier, device_tier


def _check_exact(keys, cpu_tier: MemoryTier, device_tier: MemoryTier, num_keys: int, seed: int) -> None:
    picked = torch.randint(len(keys), (num_keys,), generator=torch.Generator().manual_seed(seed)).tolist()
    # A few absent keys mixed in: the hit positions must agree too.
    asked = [keys[i] for i in picked] + ["rc:gpu-check:absent"]
    on_cpu, on_device = cpu_tier.get_many(asked), device_tier.get_many(asked)
    if list(on_cpu.index) != list(on_device.index):
        raise AssertionError(f"{num_keys} keys: hit positions differ between the CPU and {device_tier.device}")
    if on_device.vectors.device != device_tier.device:
        raise AssertionError(f"{num_keys} keys: the device L1 returned vectors on {on_device.vectors.device}")
    if not torch.equal(on_device.vectors.cpu(), on_cpu.vectors):
        raise AssertionError(f"{num_keys} keys: vectors from {device_tier.device} are not bit-identical to the CPU's")


def _count_device_to_host_copies(run: Callable[[], object], device: torch.device) -> int | None:
    """Device-to-host memcpy events while ``run`` runs (CUDA only; None elsewhere, where there is no host copy)."""
    if device.type != "cuda":
        run()
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        _synchronize(device)
    return sum(1 for event in prof.events() if "DtoH" in event.name or "Device -> Pageable" in event.name)


def check_handoff(dtype_name: str, device: torch.device, num_keys: int = 1_000, dim: int = 384) -> dict:
    """Through the cache: a device L1 hands a device tensor to the caller, bit-exact, computing nothing."""
    dtype = getattr(torch, dtype_name)
    space = EmbeddingSpace(model="gpu-check", revision="0", dtype=dtype_name, dim=dim, normalize=False, max_seq_length=128)
    texts = [f"text {i}" for i in range(num_keys)]
    vectors = torch.randn(num_keys, dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    tier = MemoryTier(num_keys * dim * vectors.element_size(), dim, dtype, device=device)
    tier.put_many(space.keys(texts), vectors.to(device))
    with EmbeddingCache(_NoModel(space), Levels([tier], dim=dim, dtype=dtype, write_behind=False), device=device) as cache:
        cache.embed_detailed(texts[:8], as_tensor=True)  # warm-up: first CUDA calls initialise kernels
        results = []
        copies = _count_device_to_host_copies(lambda: results.append(cache.embed_detailed(texts, as_tensor=True)), device)
    result = results[0]
    if result.vectors.device != device:
        raise AssertionError(f"embed(as_tensor=True) returned a tensor on {result.vectors.device}, not {device}")
    if not torch.equal(result.vectors.cpu(), vectors):
        raise AssertionError("embed(as_tensor=True) vectors differ from those stored")
    if result.served["L1"] != num_keys:
        raise AssertionError(f"L1 served {result.served['L1']} of {num_keys}")
    if copies:
        raise AssertionError(f"{copies} device-to-host copies during an all-L1 embed")
    return {"dtype": dtype_name, "num_keys": num_keys, "device": str(result.vectors.device), "device_to_host_copies": copies}


def check_and_time(device: torch.device, *, sizes=SIZES, dtypes=DTYPES, num_entries: int = 100_000, dim: int = 384,
                   repeats: int = 50, quiet: bool = True) -> tuple[list[dict], list[LookupTiming]]:
    """Every check (raising AssertionError on the first failure) and the timing table."""
    from ragcache.observe.progress import progress_bar

    handoffs, timings = [], []
    with progress_bar(desc="gpu-l1", unit="dtype", total=len(dtypes), quiet=quiet) as bar:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            keys, _, cpu_tier, device_tier = _filled_pair(dtype, dim, num_entries, device, seed=0)
            for num_keys in sizes:
                _check_exact(keys, cpu_tier, device_tier, num_keys, seed=num_keys)
                asked = keys[:: max(1, len(keys) // num_keys)][:num_keys]
                device_us = _median_us(lambda: device_tier.get_many(asked), device, repeats)  # noqa: B023 - timed within this iteration
                cpu_us = _median_us(lambda: cpu_tier.get_many(asked), torch.device("cpu"), repeats)  # noqa: B023 - timed within this iteration
                copied_us = _median_us(lambda: cpu_tier.get_many(asked).vectors.to(device), device, repeats)  # noqa: B023 - timed within this iteration
                timings.append(LookupTiming(dtype_name, num_keys, device_us, cpu_us, copied_us))
            handoffs.append(check_handoff(dtype_name, device, dim=dim))
            bar.update(1)
    return handoffs, timings


def format_timings(timings: list[LookupTiming], device: torch.device) -> str:
    lines = [f"{'dtype':<9} {'keys':>6} {str(device) + ' L1 us':>14} {'cpu L1 us':>10} {'cpu L1+copy us':>15} {'ratio':>6}"]
    for t in timings:
        ratio = t.cpu_lookup_then_copy_us / t.device_lookup_us if t.device_lookup_us else float("nan")
        lines.append(f"{t.dtype:<9} {t.num_keys:>6} {t.device_lookup_us:>14.1f} {t.cpu_lookup_us:>10.1f} "
                     f"{t.cpu_lookup_then_copy_us:>15.1f} {ratio:>5.2f}x")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        device = resolve_device(args.device)
    except Exception as exc:  # noqa: BLE001 - a ConfigError with the reason ("CUDA is not available here")
        print(f"gpu_l1: {exc}", file=sys.stderr)
        return 2
    handoffs, timings = check_and_time(device, num_entries=args.entries, repeats=args.repeats, quiet=args.quiet)
    print(f"exact: the {device} slab matches the CPU slab bit for bit, for 1..10,000 keys and {', '.join(DTYPES)}")
    for handoff in handoffs:
        copies = handoff["device_to_host_copies"]
        print(f"hand-off ({handoff['dtype']}): {handoff['num_keys']} vectors on {handoff['device']}, "
              f"device-to-host copies: {'n/a (cpu)' if copies is None else copies}")
    print(format_timings(timings, device))
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    write_json(args.out, {"device": str(device), "gpu": gpu_name, "torch": torch.__version__,
                          "handoffs": handoffs, "timings": [asdict(t) for t in timings]})
    print(f"JSON in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragcache_bench.gpu_l1", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_gpu_l1_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
