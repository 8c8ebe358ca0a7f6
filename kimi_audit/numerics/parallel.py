"""Running a kernel's independent row blocks on a thread pool (numpy releases the GIL in them)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor


def worker_count(threads: int | None, work: int) -> int:
    """`threads` if given; else 1 below a million elements of work, up to 8 above."""
    if threads is not None:
        return max(1, int(threads))
    if work < 1 << 20:
        return 1
    return max(1, min(8, os.cpu_count() or 1))


def run_each(fn: Callable[[int], None], items: Iterable[int], workers: int) -> None:
    """fn(item) for every item: in this thread when `workers` <= 1, else on a pool of that many."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(fn, items):
            pass
