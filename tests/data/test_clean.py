"""The text filters: what they drop, and that a crafted line cannot stall them."""

import time
from collections import Counter

from transformer_mt.data.clean import clean_text_pairs


def test_a_line_of_combining_marks_is_dropped_before_normalising():
    """NFC is quadratic in a run of combining marks (cpython#149079): normalising this line
    alone takes about 45 s here. Its length drops it first, in microseconds; the bound
    below only tells the two apart."""
    marks = "a" + "\u0301\u0316" * 125_000  # 250,000 alternating marks
    dropped: Counter = Counter()
    started = time.perf_counter()
    kept = list(clean_text_pairs([(marks, "b"), ("a", "b")], dropped, max_chars=5000))
    assert time.perf_counter() - started < 10
    assert kept == [("a", "b")] and dropped == Counter(too_long=1)


def test_the_length_bound_counts_characters_after_stripping():
    dropped: Counter = Counter()
    pairs = [("x" * 10, "y"), ("  " + "x" * 9 + "  ", "y"), ("x", "y" * 11)]
    kept = list(clean_text_pairs(pairs, dropped, max_chars=10))
    assert kept == [("x" * 10, "y"), ("x" * 9, "y")] and dropped == Counter(too_long=1)


def test_pairs_that_differ_only_in_where_a_tab_is_are_not_duplicates():
    """Joined with a tab, ("a\\tb", "c") and ("a", "b\\tc") would be the same text."""
    pairs = [("a\tb", "c"), ("a", "b\tc"), ("a", "b\tc"), ("a\tb", "c")]
    dropped: Counter = Counter()
    kept = list(clean_text_pairs(pairs, dropped, dedupe=True))
    assert kept == pairs[:2] and dropped == Counter(duplicate=2)
