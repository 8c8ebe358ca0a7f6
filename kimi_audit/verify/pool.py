"""Running `verify`'s file tasks: a local process pool (default: one worker per core), or a Ray cluster.

Both run the same function (verify.read.verify_file) on the same tasks, largest file first, and hand
each FileResult back as it completes. The local pool's workers ignore SIGINT: Ctrl-C reaches the main
process, which terminates them and reports what was checked. Progress: the pool's workers send the bytes
of each piece through a queue (per piece, batched); Ray reports per finished file.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue as queue_module
import signal
import time
from collections.abc import Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from kimi_audit.errors import KimiAuditError
from kimi_audit.verify.read import FileResult, FileTask, verify_file

ProgressFn = Callable[[str, int], None]
"""(file, bytes done so far in that file)."""

IN_FLIGHT_PER_WORKER = 2
"""Tasks submitted to the pool and not yet done, per worker: one running, one waiting."""

_QUEUE: Any = None
_LAST: list[float] = [0.0]
SEND_EVERY_S = 0.2


def _init_worker(q: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the handler the main process set: terminate() ends it
    global _QUEUE
    _QUEUE = q


def _pool_task(task: FileTask) -> FileResult:
    done = [0]

    def hook(n: int) -> None:
        done[0] += n
        now = time.monotonic()
        if now - _LAST[0] >= SEND_EVERY_S:
            _LAST[0] = now
            _QUEUE.put((task.name, done[0]))

    return verify_file(task, hook if _QUEUE is not None else None)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_local(tasks: list[FileTask], workers: int | None = None,
              progress: ProgressFn | None = None) -> Generator[FileResult, None, None]:
    """Each task's result as it completes. At most IN_FLIGHT_PER_WORKER tasks a worker are submitted at a time
    (a listing of millions of files makes as many futures only as there are workers). A KeyboardInterrupt, or
    SystemExit (SIGTERM under cli.application.sigterm_exits), while waiting terminates the workers; a worker
    that dies fails its task, not the run."""
    if not tasks:
        return
    n = max(1, min(workers or default_workers(), len(tasks)))
    ordered = sorted(tasks, key=lambda t: -t.size)
    if n == 1:
        for t in ordered:
            yield verify_file(t, _inline_hook(t.name, progress))
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    q = ctx.Queue() if progress else None
    pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker, initargs=(q,))
    finished = False
    try:
        queued = iter(ordered)
        pending: dict[Future[FileResult], FileTask] = {}

        def refill() -> None:
            for t in itertools.islice(queued, n * IN_FLIGHT_PER_WORKER - len(pending)):
                pending[pool.submit(_pool_task, t)] = t

        refill()
        while pending:
            done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            _drain(q, progress)
            for fut in done:
                task = pending.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    result = FileResult(task.name, task.size, None, 0, 0.0, error="not read whole: a worker process "
                                        "died (killed), which stops the pool")
                if progress:
                    progress(result.name, result.size)
                yield result
            refill()
        finished = True
    finally:
        _stop(pool, finished)


def _stop(pool: ProcessPoolExecutor, finished: bool) -> None:
    """Shut the pool down: at once, its workers killed, unless every task finished."""
    if finished:
        pool.shutdown(wait=True)
        return
    procs = dict(getattr(pool, "_processes", None) or {})  # its workers (terminate_workers() is Python 3.14's)
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs.values():
        if proc.is_alive():
            proc.terminate()


def _inline_hook(name: str, progress: ProgressFn | None) -> Callable[[int], None] | None:
    if progress is None:
        return None
    done = [0]

    def hook(n: int) -> None:
        done[0] += n
        progress(name, done[0])

    return hook


def _drain(q: Any, progress: ProgressFn | None) -> None:
    if q is None or progress is None:
        return
    while True:
        try:
            name, done = q.get_nowait()
        except (queue_module.Empty, OSError, EOFError):
            return
        progress(name, done)


def first_sentence(text: str) -> str:
    """The first sentence of a library's message (Ray's go on with advice for its own API), on one line."""
    line = " ".join(text.split())
    cut = line.find(". ")
    return (line[:cut] if cut > 0 else line)[:300]


def _ray_unusable(address: str | None, e: BaseException) -> KimiAuditError:
    # Ray's own advice names its API's `address=`: the tool's options are --ray-address ADDRESS, or `local`
    why = first_sentence(str(e)) or type(e).__name__
    return KimiAuditError(f"cannot connect to a Ray cluster at {address or 'auto'} ({why}): start one with "
                          "`ray start --head`, name it with --ray-address ADDRESS, or run one inside this "
                          "process with --ray-address local")


def run_ray(tasks: list[FileTask], address: str | None = None,
            progress: ProgressFn | None = None) -> Generator[FileResult, None, None]:
    """The same tasks as Ray tasks (one CPU each) on the cluster at `address` ("auto": the one RAY_ADDRESS or
    a local `ray start` names; "local": a new local instance, even beside a running one, shut down at the end);
    an already initialized Ray is used as it is.

    Whatever Ray raises while connecting (ConnectionError, or a LocalRayletDiedError when the instance it found
    on this host went away: an exception of its own, not a RuntimeError) is unusable input, a KimiAuditError
    (exit 2); a task Ray could not run is that file's error, as a worker the local pool lost is."""
    try:
        import ray
    except ImportError:
        raise KimiAuditError("--ray needs Ray, an optional extra: pip install 'kimi-audit[ray]'") from None
    started_here = not ray.is_initialized()
    try:
        if started_here:
            ray.init(address=address or "auto", include_dashboard=False, logging_level=logging.ERROR,
                     log_to_driver=False)
        cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
    except Exception as e:  # Ray's exceptions are its own classes: every one is "no usable cluster"
        if started_here and ray.is_initialized():
            ray.shutdown()
        raise _ray_unusable(address, e) from None
    remote = ray.remote(num_cpus=1, max_retries=0)(verify_file)
    queued = iter(sorted(tasks, key=lambda t: -t.size))
    limit = max(1, int(cpus)) * IN_FLIGHT_PER_WORKER
    pending: dict[Any, FileTask] = {}
    try:
        while True:
            for t in itertools.islice(queued, limit - len(pending)):  # bounded: as many as the cluster runs
                pending[remote.remote(t)] = t
            if not pending:
                break
            try:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            except ray.exceptions.RayError as e:
                raise KimiAuditError(f"the Ray cluster failed while verifying ({first_sentence(str(e))})") from None
            for ref in done:
                task = pending.pop(ref)
                try:
                    result: FileResult = ray.get(ref)
                except ray.exceptions.RayError as e:
                    result = FileResult(task.name, task.size, None, 0, 0.0, error="not read whole: Ray did not "
                                        f"run its task ({type(e).__name__}: {first_sentence(str(e))[:120]})")
                if progress:
                    progress(task.name, task.size)
                yield result
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:  # the command ends with os._exit: Ray's own atexit would not run
            ray.shutdown()


def run_tasks(tasks: list[FileTask], *, workers: int | None = None, ray_address: str | None = None,
              progress: ProgressFn | None = None) -> Generator[FileResult, None, None]:
    if ray_address is not None:
        return run_ray(tasks, ray_address, progress)
    return run_local(tasks, workers, progress)
