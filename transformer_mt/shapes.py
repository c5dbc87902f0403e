"""Few tensor shapes from many sizes: a count rounded up to one of 8 values per doubling, so that
kernels and caches keyed by shape (oneDNN's on the CPU, the allocator's and the compiler's on a
GPU) meet the same shapes again and again."""

from __future__ import annotations


def in_eighth_steps(count: int) -> int:
    """`count` as it is up to 15, above in steps of an eighth of the power of two below it
    (16-31 in steps of 2, 32-63 of 4, ...): under 1/8 more, 8 values per doubling."""
    step = 1 << max(count.bit_length() - 4, 0)
    return count + -count % step
