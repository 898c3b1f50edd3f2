"""pass@k with the unbiased estimator: the chance that k of n samples (c correct) include a correct one."""

from __future__ import annotations

import math

from rllm.types.errors import InputError


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): unbiased for drawing k of the n attempts without replacement.

    Computed as a running product so large n does not overflow or lose precision.
    """
    if not 0 <= c <= n:
        raise InputError(f"need 0 <= correct <= attempts, got correct={c}, attempts={n}")
    if not 1 <= k <= n:
        raise InputError(f"need 1 <= k <= attempts, got k={k}, attempts={n}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(per_task: list[tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks given ``(attempts, correct)`` per task; tasks with fewer than k
    attempts are left out (pass@k is undefined for them)."""
    values = [pass_at_k(n, c, k) for n, c in per_task if n >= k]
    return math.fsum(values) / len(values) if values else 0.0
