"""A knockout bracket: each round the best remaining seed meets the worst, the winner advances.

Reseeding every round keeps the strongest seeds apart until the end. The budget goes to the
matches that decide the most: every later match is guaranteed one call before an earlier one
is played, and second (reversed-order) calls go to the latest rounds first. A match with no
call left, or a tie, goes to the better seed.
"""

from __future__ import annotations

from rllm.sdk.v1.match import Match


async def knockout(order: list[int], match: Match, both_orders: bool) -> tuple[list[int], list[float], int]:
    """(ranking, rounds survived per candidate, rounds played) for candidates in seed ``order``."""
    rank = {c: r for r, c in enumerate(order)}
    alive = list(order)
    survived = [0.0] * len(order)
    rounds = 0
    while len(alive) > 1:
        alive.sort(key=lambda c: rank[c])
        bye = [alive[0]] if len(alive) % 2 else []  # the best seed sits out an odd round
        field = alive[len(bye) :]
        pairs = [(field[k], field[-1 - k]) for k in range(len(field) // 2)]
        matches_left = len(alive) - 1
        later = matches_left - len(pairs)
        played = max(0, min(len(pairs), match.remaining - later))
        doubled = 0
        if both_orders:
            spare = match.remaining - matches_left  # calls beyond one per remaining match
            doubled = max(0, min(played, spare - later))
        shares = await match.play(pairs[:played], doubled, rounds) if played else []
        winners = list(bye)
        for k, (i, j) in enumerate(pairs):
            share = shares[k] if k < played else 0.5
            # i is the better seed of the pair, so a draw (or an unplayed match) goes to i.
            winner = i if share >= 0.5 else j
            winners.append(winner)
        for c in winners:
            survived[c] += 1.0
        alive = winners
        rounds += 1
    ranking = sorted(range(len(order)), key=lambda c: (-survived[c], rank[c]))
    return ranking, survived, rounds
