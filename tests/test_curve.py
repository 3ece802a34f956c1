"""The learning curve's data sizes (specdec_core.train.curve): nested shares of one teacher set.

A curve is read as "more of the same data": every smaller set must lie inside every larger one, hold about its
share of the response tokens, and keep the records' order (the training schedule shuffles by its own seed).
"""
import pytest
import torch

from specdec_core.train import curve


def _records(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [dict(key=f"p{i // 2}", mode=("greedy", "sample")[i % 2],
                 response=torch.zeros(int(torch.randint(5, 120, (1,), generator=g)), dtype=torch.long))
            for i in range(n)]


def test_shares_are_nested_sized_and_ordered():
    recs = _records()
    total = sum(r["response"].numel() for r in recs)
    sets = {s: curve.nested_subset(recs, s) for s in (0.25, 0.5, 1.0)}
    ids = {s: [id(r) for r in v] for s, v in sets.items()}
    assert set(ids[0.25]) < set(ids[0.5]) < set(ids[1.0]) and len(sets[1.0]) == len(recs)
    for s, v in sets.items():
        tok = sum(r["response"].numel() for r in v)
        assert s * total <= tok < s * total + 120, (s, tok, total)  # reaches its share, overshoots by < 1 record
        pos = [recs.index(r) for r in v]
        assert pos == sorted(pos), "records keep their order"
    # a fixed order: the same records give the same subset, whatever their list order
    again = curve.nested_subset(list(reversed(recs)), 0.5)
    assert {(r["key"], r["mode"]) for r in again} == {(r["key"], r["mode"]) for r in sets[0.5]}


@pytest.mark.parametrize("bad", [0, -0.5, 1.5])
def test_a_bad_share_is_named(bad):
    with pytest.raises(ValueError, match="share"):
        curve.nested_subset(_records(10), bad)
