"""Math reward for slime's ``--custom-rm-path recipes.qwen3_30b_a3b.reward.rm``: 1.0 iff the final answer equals
the label.

Equivalence is decided by math-verify (``parse`` + ``verify``: numbers, fractions, LaTeX vs plain, sets,
intervals, units stripped). The answer examined is, in order:

1. the text after the last ``</think>`` (Qwen3 thinking); a response with ``<think>`` but no ``</think>`` is an
   unfinished thought and scores 0.0;
2. its last ``MAX_RESPONSE_CHARS`` characters;
3. the content of the last ``\\boxed{...}`` there if any (at most ``MAX_ANSWER_CHARS``), else the whole tail
   (math-verify then looks for a final LaTeX or plain expression).

``score`` is synchronous and never raises. ``rm`` runs ``score`` in a process pool: math-verify bounds each
parse/compare with ``signal.alarm``, which only works in a main thread (a worker process's is one; slime calls
``rm`` from an event loop that need not be), and a process can be killed if it is stuck in C code anyway.
``rm`` also enforces ``RM_DEADLINE_SECONDS`` per call and returns 0.0 past it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import multiprocessing
import os
import threading
import weakref
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from .boxed import last_boxed_content

logger = logging.getLogger(__name__)

MAX_RESPONSE_CHARS = 4000
MAX_ANSWER_CHARS = 1000
PARSE_TIMEOUT_SECONDS = 3
VERIFY_TIMEOUT_SECONDS = 3
RM_DEADLINE_SECONDS = 30.0
WORKERS_ENV = "RECIPE_RM_WORKERS"

_GOLD_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_ANSWER_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def final_answer_text(response: str) -> str | None:
    """The part of a response that holds the final answer (steps 1-3 of the module doc), or None if there is none."""
    if "</think>" in response:
        response = response.rsplit("</think>", 1)[1]
    elif "<think>" in response:
        return None
    tail = response[-MAX_RESPONSE_CHARS:]
    boxed = last_boxed_content(tail)
    if boxed is not None:
        boxed = boxed.strip()
        if not boxed or len(boxed) > MAX_ANSWER_CHARS:
            return None
        return "\\boxed{" + boxed + "}"
    return tail if tail.strip() else None


def _signal_timeouts_work() -> bool:
    return threading.current_thread() is threading.main_thread()


@functools.lru_cache(maxsize=4096)
def _parse_gold(label: str, timeout: int | None) -> tuple:
    text = label.strip()
    if len(text) >= 2 and text[0] == text[-1] == "$":
        text = text.strip("$").strip()
    if "\\boxed" not in text:
        text = "\\boxed{" + text + "}"
    return tuple(parse(text, extraction_config=_GOLD_CONFIG, parsing_timeout=timeout))


def score(response: Any, label: Any) -> float:
    """1.0 if the final answer of ``response`` is mathematically equal to ``label``, else 0.0; never raises.

    Bad input (non-string response, empty or missing label, garbage, huge text) gives 0.0. In a main thread
    math-verify's own timeouts bound each parse/compare; elsewhere they cannot be used (signal.alarm), so call
    ``score`` from a main thread or through ``rm``.
    """
    try:
        if not isinstance(response, str) or isinstance(label, bool):
            return 0.0
        if isinstance(label, (int, float)):
            label = str(label)
        if not isinstance(label, str) or not label.strip() or len(label) > MAX_ANSWER_CHARS:
            return 0.0
        answer = final_answer_text(response)
        if answer is None:
            return 0.0
        parse_timeout = PARSE_TIMEOUT_SECONDS if _signal_timeouts_work() else None
        verify_timeout = VERIFY_TIMEOUT_SECONDS if _signal_timeouts_work() else None
        gold = _parse_gold(label, parse_timeout)
        if not gold:
            return 0.0
        predicted = parse(answer, extraction_config=_ANSWER_CONFIG, parsing_timeout=parse_timeout)
        if not predicted:
            return 0.0
        return 1.0 if verify(list(gold), predicted, timeout_seconds=verify_timeout) else 0.0
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # math-verify's TimeoutException derives from BaseException
        logger.debug("score failed", exc_info=True)
        return 0.0


_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
_pool_has_scored = False
_pools_killed_at_deadline: weakref.WeakSet[concurrent.futures.ProcessPoolExecutor] = weakref.WeakSet()
_score_in_threads = False
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def worker_count() -> int:
    """Processes in the scoring pool: ``$RECIPE_RM_WORKERS`` if set, else min(16, CPU count)."""
    configured = os.environ.get(WORKERS_ENV, "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    if configured:
        logger.warning("ignoring %s=%r: not a positive integer", WORKERS_ENV, configured)
    return max(1, min(16, os.cpu_count() or 1))


def _get_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # spawn, not fork: the caller is a multi-threaded Ray actor.
            _pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=worker_count(), mp_context=multiprocessing.get_context("spawn")
            )
        return _pool


def _retire_pool(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Drop ``pool`` (if still current; the next call starts a new one) and kill its workers.

    ProcessPoolExecutor has no public way to stop a running task; ``_processes`` (pid -> Process) has been
    stable since Python 3.8. Other calls in flight on the pool see BrokenProcessPool and are scored in a thread.
    """
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = None
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()


def _slot(loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
    """At most ``worker_count()`` scorings in flight per event loop, so the deadline measures work, not queueing."""
    semaphore = _slots.get(loop)
    if semaphore is None:
        semaphore = _slots[loop] = asyncio.Semaphore(worker_count())
    return semaphore


async def _score_in_thread(response: str, label: Any) -> float:
    """Fallback without math-verify's own timeouts; past the deadline the thread is abandoned."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(score, response, label), RM_DEADLINE_SECONDS)
    except asyncio.TimeoutError:
        logger.warning("reward past %.0f s deadline in a thread; scored 0.0", RM_DEADLINE_SECONDS)
        return 0.0


async def _score_in_pool(response: str, label: Any) -> float:
    global _pool_has_scored, _score_in_threads
    pool = _get_pool()
    try:
        future = asyncio.get_running_loop().run_in_executor(pool, score, response, label)
        result = await asyncio.wait_for(future, RM_DEADLINE_SECONDS)
    except asyncio.TimeoutError:
        logger.warning("reward past %.0f s deadline; scored 0.0 and restarted the scoring pool", RM_DEADLINE_SECONDS)
        _pools_killed_at_deadline.add(pool)
        _retire_pool(pool)
        return 0.0
    except (BrokenProcessPool, RuntimeError):  # RuntimeError: the pool was shut down by a concurrent retire
        if not _pool_has_scored and pool not in _pools_killed_at_deadline:
            _score_in_threads = True
            logger.exception("scoring processes failed to start; scoring in threads from now on")
        _retire_pool(pool)
        return await _score_in_thread(response, label)
    _pool_has_scored = True
    return result


async def rm(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """slime custom reward: ``score(sample.response, sample.label)`` in a worker process; never raises.

    ``args`` is slime's namespace (unused). A list of samples (slime's ``--group-rm`` call) gives a list of rewards.
    """
    if isinstance(sample, list):
        return list(await asyncio.gather(*(rm(args, item, **kwargs) for item in sample)))
    try:
        response = getattr(sample, "response", None)
        label = getattr(sample, "label", None)
        if not isinstance(response, str) or label is None:
            return 0.0
        async with _slot(asyncio.get_running_loop()):
            if _score_in_threads:
                return await _score_in_thread(response, label)
            return await _score_in_pool(response, label)
    except Exception:
        logger.warning("reward failed; scored 0.0", exc_info=True)
        return 0.0
