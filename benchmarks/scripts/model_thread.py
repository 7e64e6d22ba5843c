"""The packaged model's forward pass on the main thread against a new thread, in one process (benchmarks/notes/r6.md:
why `bench cold`'s service spends more time in the model than its floor). The floor encodes on the bench's main thread; the
service encodes on its batcher's thread (``ragcache-compute``). Same texts, same batch size, the three alternating three
times: the main thread, a new thread each time, one long-lived thread; page faults of one pass each.

    cd /tmp && HF_HUB_OFFLINE=1 /work/main/.venv/bin/python /work/main/benchmarks/scripts/model_thread.py
"""

import queue
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

    # A thread that lives on, as the service's batcher does: passes handed to it one at a time.
    asks: queue.Queue = queue.Queue()
    answers: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [answers.put(run()) for _ in iter(asks.get, None)], daemon=True).start()

    def on_long_lived_thread() -> float:
        asks.put(True)
        return answers.get()

    run()  # warm
    on_long_lived_thread()
    for _ in range(3):
        main_s, new_s, long_s = run(), on_new_thread(), on_long_lived_thread()
        print(f"{NUM_BATCHES} batches of 32: main thread {main_s:.2f} s, a new thread {new_s:.2f} s ({new_s / main_s:.3f}x), "
              f"a long-lived thread {long_s:.2f} s ({long_s / main_s:.3f}x)")
    asks.put(None)
    for name, call in (("main thread", run), ("new thread", on_new_thread)):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        call()
        print(f"minor page faults, one pass on the {name}: {resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before:,}")


if __name__ == "__main__":
    main()
