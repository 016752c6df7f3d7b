"""The shared load table of ``--api-server-count``: per-worker and per-DP-rank counts that
each frontend writes for itself and every frontend sums, and two rank routers (two
frontends) that choose ranks by them."""

from __future__ import annotations

from pathlib import Path

from smg_trio.connector.routing import RankRouter
from smg_trio.worker.shared_load import MAX_SHARED_RANKS, SharedLoad, create_shared_load


def _views(tmp_path: Path, frontends: int = 2) -> list[SharedLoad]:
    path = str(tmp_path / "load")
    create_shared_load(path, frontends)
    return [SharedLoad(path, frontends, i) for i in range(frontends)]


def test_rank_counts_sum_over_frontends_per_worker_and_rank(tmp_path: Path) -> None:
    one, two = _views(tmp_path)
    one.publish_rank(3, 1, 2)
    two.publish_rank(3, 1, 5)
    two.publish_rank(3, 0, 1)
    one.publish_rank(4, 1, 7)  # another worker
    assert [one.rank_total(3, r) for r in (0, 1, 2)] == [1, 7, 0]
    assert two.rank_total(4, 1) == 7
    one.publish(3, 9)  # the per-worker cells are apart from the rank cells
    assert (one.total(3), one.rank_total(3, 1)) == (9, 7)
    # out of range: not shared, never an error
    one.publish_rank(3, MAX_SHARED_RANKS, 4)
    assert one.rank_total(3, MAX_SHARED_RANKS) == 0
    assert one.rank_total(-1, 0) == 0


def test_a_restarted_frontend_starts_from_zero(tmp_path: Path) -> None:
    one, two = _views(tmp_path)
    one.publish_rank(0, 0, 3)
    two.publish_rank(0, 0, 4)
    one.publish(0, 3)
    again = SharedLoad(str(tmp_path / "load"), 2, 0)  # frontend 1 restarted
    assert (again.rank_total(0, 0), again.total(0)) == (4, 0)


def test_two_routers_sharing_ranks_fill_the_rank_the_other_left_free(tmp_path: Path) -> None:
    one, two = _views(tmp_path)
    first = RankRouter([0, 1], one.ranks(0))
    second = RankRouter([0, 1], two.ranks(0))
    # frontend 1: two requests, then the one on rank 1 ends
    assert [first.reserve("a", None), first.reserve("b", None)] == [0, 1]
    first.release(1, "b")
    assert second.score(0) == 1.0  # frontend 1's request, seen by frontend 2
    assert [second.reserve("c", None), second.reserve("d", None)] == [1, 1]
    assert first.score(1) == 2.0
    first.clear()  # frontend 1's client died: its counts are gone
    assert (second.score(0), second.score(1)) == (0.0, 2.0)


def test_without_sharing_each_router_sees_only_its_own(tmp_path: Path) -> None:
    first, second = RankRouter([0, 1]), RankRouter([0, 1])
    first.reserve("a", None)
    assert second.score(0) == 0.0
