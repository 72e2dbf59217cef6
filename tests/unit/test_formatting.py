"""``formatting.count_and_values``: the lab's ``seeds`` column, checked by reading the text back."""

from __future__ import annotations

import random

import pytest

from mismatch_ctrl.formatting import count_and_values


def _read_back(text: str) -> tuple[int, list[int], list[tuple[int, int]]]:
    """(count, the values the ranges name, the ranges) of ``N (a,b-c,...)``: a parser written apart from the code."""
    count, _, inside = text.partition(" ")
    assert inside.startswith("(") and inside.endswith(")"), text
    parts = []
    for part in inside[1:-1].split(","):
        low, _, high = part.partition("-")
        parts.append((int(low), int(high or low)))
    return int(count), [v for low, high in parts for v in range(low, high + 1)], parts


@pytest.mark.parametrize("values, text", [([0], "1 (0)"), ([70, 71, 72, 73, 74], "5 (70-74)"),
                                           ([7, 0, 2, 5, 6], "5 (0,2,5-7)"), ([3, 1], "2 (1,3)"), ([], "0")])
def test_examples(values, text):
    assert count_and_values(values) == text


def test_random_seed_sets_read_back_to_the_same_seeds_in_maximal_ranges():
    rng = random.Random(230)
    for _ in range(300):
        pool = range(rng.randint(1, 40))
        values = rng.sample(pool, rng.randint(1, min(12, len(pool))))
        count, named, parts = _read_back(count_and_values(values))
        assert count == len(values) and named == sorted(values)
        # maximal: two neighbouring ranges never touch (they would be one range), and every range is ordered
        assert all(low <= high for low, high in parts)
        assert all(b[0] > a[1] + 1 for a, b in zip(parts, parts[1:]))
