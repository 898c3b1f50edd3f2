"""RewardBatch: every reward of many groups in flat arrays, with vectorised per-group statistics.

Estimators never loop over groups: a group's mean is ``np.bincount(group, weights=rewards)``
divided by its size, gathered back to rows with ``stat[group]``. One pass per statistic, whatever
the number of groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rllm.algos.errors import AlgorithmInputError


@dataclass(frozen=True)
class RewardBatch:
    """Flat rewards of one role's groups.

    rewards: float64 [n], one per row (a trajectory, or a step under turn-level credit).
    group: int64 [n], the row's group in ``0..num_groups-1``; rows of a group need not be adjacent.
    token_counts: float64 [n], response tokens per row. Token-weighted statistics (whitening)
        use it, because the loss sees one advantage per token.
    """

    rewards: np.ndarray
    group: np.ndarray
    num_groups: int
    token_counts: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        rewards = np.asarray(self.rewards, dtype=np.float64)
        group = np.asarray(self.group, dtype=np.int64)
        if rewards.ndim != 1 or group.shape != rewards.shape:
            raise AlgorithmInputError(
                f"rewards and group must be 1-D arrays of one length, got shapes {rewards.shape} and {group.shape}"
            )
        if rewards.size == 0:
            raise AlgorithmInputError("empty batch: no rewards to compute advantages from")
        if not np.isfinite(rewards).all():
            bad = int(np.flatnonzero(~np.isfinite(rewards))[0])
            raise AlgorithmInputError(f"reward at row {bad} is {rewards[bad]}; rewards must be finite")
        if group.min() < 0 or group.max() >= self.num_groups:
            raise AlgorithmInputError(
                f"group indices must lie in [0, {self.num_groups}), got [{group.min()}, {group.max()}]"
            )
        counts = self.token_counts
        counts = np.ones_like(rewards) if counts is None else np.asarray(counts, dtype=np.float64)
        if counts.shape != rewards.shape:
            raise AlgorithmInputError(
                f"token_counts shape {counts.shape} does not match rewards shape {rewards.shape}"
            )
        if (counts < 0).any() or not np.isfinite(counts).all():
            raise AlgorithmInputError("token_counts must be finite and >= 0")
        if counts.sum() == 0:  # no token information at all: weigh every row alike
            counts = np.ones_like(rewards)
        object.__setattr__(self, "rewards", rewards)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "token_counts", counts)

    @classmethod
    def from_group_ids(
        cls, rewards: np.ndarray, group_ids: np.ndarray, token_counts: np.ndarray | None = None
    ) -> RewardBatch:
        """Build from arbitrary group ids (ints or strings, e.g. verl's ``uid`` array).

        Strings are numbered in first-seen order with one dict pass, because sorting Python
        objects (``np.unique`` on an object array) is far slower on large batches.
        """
        ids = np.asarray(group_ids)
        if ids.dtype.kind in "iub":
            _, inverse = np.unique(ids, return_inverse=True)
            inverse = inverse.reshape(-1)
        else:
            codes: dict[object, int] = {}
            inverse = np.fromiter(
                (codes.setdefault(g, len(codes)) for g in ids.tolist()), dtype=np.int64, count=ids.size
            )
        num_groups = int(inverse.max()) + 1 if inverse.size else 0
        # None is the field's own default: __post_init__ turns it into one count per row.
        return cls(rewards=rewards, group=inverse, num_groups=num_groups, token_counts=token_counts)  # pyright: ignore[reportArgumentType]

    def group_sizes(self) -> np.ndarray:
        """[num_groups] number of rows per group."""
        return np.bincount(self.group, minlength=self.num_groups).astype(np.float64)

    def group_sum(self, values: np.ndarray) -> np.ndarray:
        """[num_groups] sum of ``values`` within each group."""
        return np.bincount(self.group, weights=values, minlength=self.num_groups)

    def group_mean(self, values: np.ndarray | None = None) -> np.ndarray:
        """[n] mean of ``values`` (default: rewards) over each row's group, gathered back to rows."""
        values = self.rewards if values is None else values
        sizes = self.group_sizes()
        return (self.group_sum(values) / np.maximum(sizes, 1.0))[self.group]

    def group_std(self, values: np.ndarray | None = None, ddof: int = 1) -> np.ndarray:
        """[n] standard deviation over each row's group (two-pass, so large offsets stay exact).

        Groups with ``size <= ddof`` have no spread to measure and get 0.
        """
        values = self.rewards if values is None else values
        centred = values - self.group_mean(values)
        sizes = self.group_sizes()
        sq = self.group_sum(centred * centred)
        dof = sizes - ddof
        var = np.divide(sq, dof, out=np.zeros_like(sq), where=dof > 0)
        return np.sqrt(var)[self.group]
