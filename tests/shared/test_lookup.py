"""shared.lookup against a plain reference (scan every earlier start, longest n first)."""

import numpy as np

from acespec.shared.lookup import lookup, lookup_order


def _reference(ctx: list[int], k: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    for n in range(min(max_n, len(ctx) - 1), min_n - 1, -1):
        for i in range(len(ctx) - n - 1, -1, -1):
            if ctx[i:i + n] == ctx[-n:]:
                return ctx[i + n:i + n + k], n
    return [], 0


def test_matches_the_reference_on_random_texts():
    rng = np.random.default_rng(0)
    for _ in range(4000):
        ctx = rng.integers(0, int(rng.integers(2, 12)), int(rng.integers(1, 120))).tolist()
        k, min_n = int(rng.integers(1, 6)), int(rng.integers(1, 3))
        max_n = int(rng.integers(min_n, 6))
        want = _reference(ctx, k, min_n, max_n)
        assert lookup_order(ctx, k, min_n, max_n) == want, ctx
        assert lookup(ctx, k, min_n, max_n) == want[0]


def test_the_latest_longest_match_wins_and_the_window_bounds_the_search():
    text = [1, 2, 3, 9, 1, 2, 3, 7, 8, 2, 3]
    assert lookup(text, 3, 1, 4) == [7, 8, 2]  # "2 3" last seen before "7 8"
    assert lookup(text, 3, 3, 4) == []  # no earlier "8 2 3"
    assert lookup([5, 6, 0, 0, 0, 0, 5, 6], 2, 2, 2, window=4) == []  # the first "5 6" is out


def test_token_ids_whose_bytes_overlap_match_only_whole_tokens():
    """Ids built so that one id's bytes recur across two others' boundary: only whole
    tokens match (the search runs over the text's bytes)."""
    rng = np.random.default_rng(1)
    alphabet = np.array([0, 1, 256, 257, 1 << 16, 1 << 24, (1 << 31) - 1, 1 << 40])
    for _ in range(2000):
        ctx = alphabet[rng.integers(0, len(alphabet), int(rng.integers(1, 60)))].tolist()
        k, min_n = int(rng.integers(1, 6)), int(rng.integers(1, 3))
        max_n = int(rng.integers(min_n, 6))
        want = _reference(ctx, k, min_n, max_n)
        assert lookup_order(ctx, k, min_n, max_n) == want, ctx
        assert lookup_order(np.array(ctx), k, min_n, max_n) == want, ctx
        strided = np.repeat(np.array(ctx), 2)[::2]  # the same text, not contiguous
        assert lookup_order(strided, k, min_n, max_n) == want, ctx
