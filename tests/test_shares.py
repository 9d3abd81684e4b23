"""plan_shares: how a fleet's workers split the partitions (docs/distributed.md)."""

from __future__ import annotations

from collections import Counter

from courtly.distributed import plan_shares
from courtly.urls import partition_of

PARTITIONS = 64


def weights_of(origins: int) -> dict[int, int]:
    """Configured origins per partition, as the crawl database counts them."""
    return dict(Counter(partition_of(f"http://site{i}.example", PARTITIONS)
                        for i in range(origins)))


def loads(plan: dict[str, set[int]], weights: dict[int, int]) -> dict[str, int]:
    return {w: sum(weights.get(p, 0) for p in parts) for w, parts in plan.items()}


def test_four_workers_get_about_equal_origins_however_they_hash() -> None:
    weights = weights_of(200)
    assert max(weights.values()) >= 2 * min(weights.values())  # uneven partitions
    workers = ["a", "b", "c", "d"]
    plan = plan_shares(workers, PARTITIONS, weights, {})
    assert sorted(p for parts in plan.values() for p in parts) == list(range(PARTITIONS))
    for load in loads(plan, weights).values():
        assert abs(load - 50) <= 5  # equal shares by count would be off by up to a third
    # the partitions without origins are spread too (new origins may appear in them)
    empty = [len([p for p in parts if p not in weights]) for parts in plan.values()]
    assert max(empty) - min(empty) <= 1


def test_a_plan_is_stable_and_a_joining_worker_takes_only_its_share() -> None:
    weights = weights_of(200)
    first = plan_shares(["a", "b", "c"], PARTITIONS, weights, {})
    holders = {p: w for w, parts in first.items() for p in parts}
    assert plan_shares(["a", "b", "c"], PARTITIONS, weights, holders) == first  # nothing moves
    joined = plan_shares(["a", "b", "c", "d"], PARTITIONS, weights, holders)
    moved = [p for w, parts in joined.items() for p in parts if holders[p] != w]
    assert {holders[p] for p in moved} <= {"a", "b", "c"}
    assert set(moved) == joined["d"]  # every move is to the new worker
    assert abs(loads(joined, weights)["d"] - 50) <= 5
    # a worker gone: its partitions go to the others, the others keep theirs
    left = plan_shares(["a", "b"], PARTITIONS, weights, holders)
    assert all(first[w] <= left[w] for w in ("a", "b"))
    assert all(abs(load - 100) <= 5 for load in loads(left, weights).values())


def test_one_worker_holds_every_partition() -> None:
    plan = plan_shares(["only"], 8, {3: 5}, {1: "gone"})
    assert plan == {"only": set(range(8))}
