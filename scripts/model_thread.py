"""The packaged model's forward pass on the main thread against a new thread, in one process (BENCHMARKS.md, round
six: why `bench cold`'s service spends more time in the model than its floor). The floor encodes on the bench's
main thread; the service encodes on its batcher's thread (``ragcache-compute``). Same texts, same batch size, the
two alternating three times; page faults of one pass each.

    cd /tmp && HF_HUB_OFFLINE=1 /work/main/.venv/bin/python /work/main/scripts/model_thread.py
"""

import resource
import threading
import time

import torch

from ragcache_bench.context import BenchContext

NUM_BATCHES = 15


def main() -> None:
    ctx = BenchContext(quick=True)
    model = ctx.encoder.model
    batches = [ctx.unseen_texts(32, skip=32 * i) for i in range(NUM_BATCHES)]

    def run() -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            for batch in batches:
                model.encode(batch, batch_size=32, show_progress_bar=False, convert_to_tensor=True)
        return time.perf_counter() - started

    def on_new_thread() -> float:
        seconds: list[float] = []
        thread = threading.Thread(target=lambda: seconds.append(run()))
        thread.start()
        thread.join()
        return seconds[0]

    run()  # warm
    for _ in range(3):
        main_s, thread_s = run(), on_new_thread()
        print(f"{NUM_BATCHES} batches of 32: main thread {main_s:.2f} s, a new thread {thread_s:.2f} s ({thread_s / main_s:.3f}x)")
    for name, call in (("main thread", run), ("new thread", on_new_thread)):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        call()
        print(f"minor page faults, one pass on the {name}: {resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before:,}")


if __name__ == "__main__":
    main()
