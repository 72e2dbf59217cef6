"""The math reward: equivalence cases decided by hand, robustness to bad input, and the async slime entry point."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import pytest

from recipes.qwen3_30b_a3b import reward
from recipes.qwen3_30b_a3b.boxed import last_boxed_content

EQUIVALENT = [
    ("The answer is \\boxed{34}.", "34"),
    ("so $x = \\boxed{\\frac{1}{2}}$", "0.5"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{3}{4}}", "3/4"),
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    ("\\boxed{1 + x^2}", "x^2+1"),
    ("\\boxed{(1,2]}", "(1, 2]"),
    ("\\boxed{10\\text{ cm}}", "10"),
    ("\\boxed{10 \\mathrm{~cm}}", "10"),
    ("\\boxed{5, 3}", "3, 5"),
    ("\\boxed{\\pi}", "\\pi"),
    ("\\boxed{27}", "27.0"),
    ("\\boxed{34}", "$34$"),
    ("First \\boxed{3}; no, recomputing, \\boxed{5}", "5"),
    ("<think>maybe \\boxed{7}?</think>\n\nThe final answer is \\boxed{8}.", "8"),
    ("So the final answer is 12.", "12"),
]

NOT_EQUIVALENT = [
    ("\\boxed{35}", "34"),
    ("\\boxed{0.51}", "\\frac{1}{2}"),
    ("\\boxed{x^2-1}", "x^2+1"),
    ("\\boxed{[1,2]}", "(1, 2]"),
    ("\\boxed{(1,2)}", "(1, 2]"),
    ("First \\boxed{3}; no, recomputing, \\boxed{5}", "3"),
    ("<think>maybe \\boxed{7}?</think>\n\nThe final answer is \\boxed{8}.", "7"),
]

MALFORMED = [
    ("", "34"),
    ("   \n ", "34"),
    ("\x00\x01 }}}{{{ \\boxed{", "34"),
    ("\\boxed{}", "34"),
    ("<think>still thinking... \\boxed{34}", "34"),
    ("\\boxed{34}</think>", "34"),
    ("\\boxed{" + "1" * 2000 + "}", "1" * 2000),
    ("\\boxed{34}", ""),
    ("\\boxed{34}", None),
    ("\\boxed{34}", True),
    (None, "34"),
    (34, "34"),
    (["\\boxed{34}"], "34"),
]


@pytest.mark.parametrize(("response", "label"), EQUIVALENT)
def test_equivalent_answers_score_one(response, label):
    assert reward.score(response, label) == 1.0


@pytest.mark.parametrize(("response", "label"), NOT_EQUIVALENT)
def test_wrong_answers_score_zero(response, label):
    assert reward.score(response, label) == 0.0


@pytest.mark.parametrize(("response", "label"), MALFORMED)
def test_malformed_input_scores_zero(response, label):
    assert reward.score(response, label) == 0.0


def test_integer_label_is_accepted():
    assert reward.score("\\boxed{34}", 34) == 1.0
    assert reward.score("\\boxed{33}", 34) == 0.0


def test_huge_response_is_cut_to_its_tail_quickly():
    start = time.perf_counter()
    assert reward.score("blah " * 200_000 + "\\boxed{34}", "34") == 1.0
    # The box lies before the last MAX_RESPONSE_CHARS characters, so it is not seen.
    assert reward.score("\\boxed{34}" + " " + "y" * (reward.MAX_RESPONSE_CHARS + 10), "34") == 0.0
    assert time.perf_counter() - start < 5.0


def test_score_works_outside_the_main_thread():
    # math-verify's signal-based timeouts raise there; score must switch them off rather than return 0.0.
    results = []
    worker = threading.Thread(target=lambda: results.append(reward.score("\\boxed{\\frac{2}{4}}", "0.5")))
    worker.start()
    worker.join()
    assert results == [1.0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("a \\boxed{1} b \\boxed{\\{2, 3\\}} c", "\\{2, 3\\}"),
        ("\\fbox{4}", "4"),
        ("\\boxed{5} then a truncated \\boxed{6", "5"),
        ("no box", None),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


def test_final_answer_text_takes_text_after_think_and_last_box():
    assert reward.final_answer_text("<think>\\boxed{1}</think> x \\boxed{2} y") == "\\boxed{2}"
    assert reward.final_answer_text("<think>\\boxed{1}") is None
    assert reward.final_answer_text("plain 5") == "plain 5"


def _samples(pairs):
    return [SimpleNamespace(response=response, label=label) for response, label in pairs]


def test_rm_matches_score_and_handles_group_calls():
    pairs = [EQUIVALENT[0], EQUIVALENT[6], NOT_EQUIVALENT[0], NOT_EQUIVALENT[3]]

    async def run():
        single = await asyncio.gather(*(reward.rm(None, sample) for sample in _samples(pairs)))
        group = await reward.rm(None, _samples(pairs))
        return single, group

    single, group = asyncio.run(run())
    expected = [1.0, 1.0, 0.0, 0.0]
    assert single == expected
    assert group == expected


@pytest.mark.parametrize("sample", [object(), SimpleNamespace(response=None, label="1"), SimpleNamespace(response="1")])
def test_rm_never_raises_on_bad_samples(sample):
    assert asyncio.run(reward.rm(None, sample)) == 0.0


def test_rm_deadline_kills_a_stuck_scoring_and_recovers(monkeypatch):
    # 9^(9^(9^9)) keeps sympy busy far longer than the deadline set here (math-verify's own limit is 3 s).
    async def run():
        warm = await reward.rm(None, SimpleNamespace(response="\\boxed{7}", label="7"))
        monkeypatch.setattr(reward, "RM_DEADLINE_SECONDS", 0.5)
        start = time.perf_counter()
        stuck = await reward.rm(None, SimpleNamespace(response="\\boxed{9^{9^{9^{9}}}}", label="1"))
        elapsed = time.perf_counter() - start
        pool_after_kill = reward._pool
        monkeypatch.setattr(reward, "RM_DEADLINE_SECONDS", 30.0)
        healthy = await reward.rm(None, SimpleNamespace(response="\\boxed{7}", label="7"))
        return warm, stuck, elapsed, pool_after_kill, healthy

    warm, stuck, elapsed, pool_after_kill, healthy = asyncio.run(run())
    assert warm == 1.0
    assert stuck == 0.0
    assert elapsed < 2.0
    assert pool_after_kill is None  # the stuck pool was retired; the next call started a fresh one
    assert healthy == 1.0


class _BrokenPool:
    def submit(self, *args, **kwargs):
        raise BrokenProcessPool("workers cannot start")

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def test_rm_falls_back_to_threads_when_processes_cannot_start(monkeypatch):
    monkeypatch.setattr(reward, "_pool_has_scored", False)
    monkeypatch.setattr(reward, "_score_in_threads", False)
    monkeypatch.setattr(reward, "_get_pool", lambda: _BrokenPool())
    samples = _samples([("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{2}", "3")])
    assert asyncio.run(reward.rm(None, samples)) == [1.0, 0.0]
    assert reward._score_in_threads
