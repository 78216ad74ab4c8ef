"""A replica-hour's cost split between requests and idle: pure arithmetic, checked to the cent."""

from __future__ import annotations

import random
from decimal import Decimal
from fractions import Fraction

import pytest

from billing.costs.allocate import allocate
from billing.costs.attribute import RequestWork, Speeds, hour_cost, kind_of, replica_hour_split

SPEEDS = Speeds(Decimal("2000"), Decimal("50"))  # prompt tokens/s and output tokens/s at a full batch


def test_allocate_adds_up_and_gives_leftover_units_to_the_largest_remainders():
    assert allocate(Decimal("0.10"), [Decimal(1)] * 3, places=2) == [Decimal("0.04"), Decimal("0.03"),
                                                                     Decimal("0.03")]
    assert allocate(Decimal("1.00"), [Decimal(1), Decimal(2)], places=2) == [Decimal("0.33"), Decimal("0.67")]
    assert allocate(Decimal("0"), [Decimal(1), Decimal(0)], places=6) == [Decimal(0), Decimal(0)]


@pytest.mark.parametrize("total,weights", [(Decimal("1.005"), [Decimal(1)]), (Decimal("-1"), [Decimal(1)]),
                                           (Decimal("1"), [Decimal(0)]), (Decimal("1"), []),
                                           (Decimal("1"), [Decimal(-1), Decimal(2)])])
def test_allocate_refuses_what_it_cannot_split(total, weights):
    with pytest.raises(ValueError):
        allocate(total, weights, places=2)


def test_hour_cost_is_rounded_half_up_to_the_cent_once():
    assert hour_cost(up_seconds=Decimal(3600), hourly_cost=Decimal("2.345")) == Decimal("2.35")
    assert hour_cost(up_seconds=Decimal(1800), hourly_cost=Decimal("0.01")) == Decimal("0.01")  # 0.005 up
    assert hour_cost(up_seconds=Decimal(1), hourly_cost=Decimal("3.99")) == Decimal("0.00")


def test_requests_share_by_work_and_the_rest_is_idle():
    # 2,000 prompt tokens = 1 s, 50 output tokens = 1 s: a does 1 + 2 s, b does 3 s; 3,594 s idle.
    split = replica_hour_split(up_seconds=Decimal(3600), hourly_cost=Decimal("3.60"), speeds=SPEEDS,
                               requests=[RequestWork(1, 2000, 100), RequestWork(2, 6000, 0)])
    assert split.total_cost == Decimal("3.60")
    assert [s.cost for s in split.shares] == [Decimal("0.003"), Decimal("0.003")]
    assert split.idle_cost == Decimal("3.594")
    assert split.busy_seconds == Decimal(6) and split.work_seconds == Decimal(6)
    a = split.shares[0]
    assert (a.prefill_seconds, a.decode_seconds) == (Decimal(1), Decimal(2))
    assert a.input_cost == Decimal("0.001") and a.input_cost + a.output_cost == a.cost
    assert split.shares[1].output_cost == 0


def test_an_hour_with_no_traffic_is_all_idle():
    split = replica_hour_split(up_seconds=Decimal(2700), hourly_cost=Decimal("4"), speeds=SPEEDS, requests=[])
    assert (split.total_cost, split.attributed_cost, split.idle_cost) == (Decimal("3.00"), 0, Decimal("3.00"))


def test_work_beyond_the_hour_shares_the_whole_hour_and_leaves_no_idle():
    split = replica_hour_split(up_seconds=Decimal(60), hourly_cost=Decimal("6"), speeds=SPEEDS,
                               requests=[RequestWork(1, 0, 50 * 100), RequestWork(2, 0, 50 * 300)])
    assert split.idle_cost == 0 and split.busy_seconds == Decimal(60) and split.work_seconds == Decimal(400)
    assert [s.cost for s in split.shares] == [Decimal("0.025"), Decimal("0.075")]


def test_no_rate_costs_zero():
    split = replica_hour_split(up_seconds=Decimal(3600), hourly_cost=None, speeds=None,
                               requests=[RequestWork(1, 10, 10)])
    assert split.total_cost == split.idle_cost == split.shares[0].cost == 0


def test_cached_tokens_weigh_nothing_and_a_request_with_no_work_costs_nothing():
    split = replica_hour_split(up_seconds=Decimal(3600), hourly_cost=Decimal("1"), speeds=SPEEDS,
                               requests=[RequestWork(1, 0, 0), RequestWork(2, 2000, 0)])
    assert split.shares[0].cost == 0 and split.shares[0].input_cost == 0 and split.shares[1].cost > 0


def test_the_invariant_holds_to_the_cent_over_random_hours():
    """For every replica-hour: attributed + idle = up hours x rate (rounded to the cent once), exactly."""
    rng = random.Random(29)
    for _ in range(400):
        up = Decimal(rng.randint(0, 3_600_000_000)).scaleb(-6)  # to the microsecond
        rate = Decimal(rng.randint(0, 10**12)).scaleb(-rng.randint(2, 10))
        speeds = Speeds(Decimal(rng.randint(1, 10**8)).scaleb(-4), Decimal(rng.randint(1, 10**7)).scaleb(-4))
        requests = [RequestWork(i, rng.randint(0, 50_000), rng.randint(0, 4_000)) for i in range(rng.randint(0, 60))]
        split = replica_hour_split(up_seconds=up, hourly_cost=rate, speeds=speeds, requests=requests)
        exact = Fraction(up) * Fraction(rate) / 3600
        assert abs(Fraction(split.total_cost) - exact) <= Fraction(1, 200)  # rounded once, to the cent
        assert split.total_cost == split.total_cost.quantize(Decimal("0.01"))
        assert sum(s.cost for s in split.shares) + split.idle_cost == split.total_cost
        assert split.attributed_cost == sum(s.cost for s in split.shares)
        assert all(s.cost >= 0 and s.input_cost + s.output_cost == s.cost for s in split.shares)
        assert split.busy_seconds <= up


def test_kind_names_the_traffic_line():
    assert kind_of(batch_id="", embeddings=False) == "online"
    assert kind_of(batch_id="batch_1", embeddings=False) == "batch"
    assert kind_of(batch_id="", embeddings=True) == "embeddings"
    assert kind_of(batch_id="batch_1", embeddings=True) == "batch-embeddings"
