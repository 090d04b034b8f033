"""Sizes given to the observers have documented caps: an absurd one is a one-line
ConfigError when the object is made, not memory or Redis time spent later.

(``background(..., max_pending=10**12)`` let a stuck observer pin every event of the
process; ``TenantBudget(..., buckets=10**12)`` made a hash field per millisecond of the
window, every one of them read by the script on each charge and check.)
"""

from __future__ import annotations

import pytest

from ctxguard.errors import ConfigError
from ctxguard.observe import background
from ctxguard.observe.background import MAX_PENDING
from ctxguard.observe.tenant_budget import MAX_BUCKETS, TenantBudget

UNREACHABLE = "redis://:pw-s3cret@127.0.0.1:1/0"  # never connected to: made only


@pytest.mark.parametrize("size", [MAX_PENDING + 1, 10**12, 10**400], ids=["cap+1", "1e12", "1e400"])
def test_max_pending_past_the_cap_is_a_one_line_config_error(size: int) -> None:
    with pytest.raises(ConfigError) as caught:
        background(print, max_pending=size)
    message = str(caught.value)
    assert "\n" not in message and "max_pending" in message and f"{MAX_PENDING:,}" in message
    assert len(message) < 200  # (10**400 is not printed whole)


def test_max_pending_at_the_cap_is_taken() -> None:
    deliverer = background(print, max_pending=MAX_PENDING)
    try:
        assert deliverer.max_pending == MAX_PENDING
    finally:
        deliverer.close()


@pytest.mark.parametrize(
    "buckets", [MAX_BUCKETS + 1, 10**12, 10**400], ids=["cap+1", "1e12", "1e400"]
)
def test_buckets_past_the_cap_are_a_one_line_config_error(buckets: int) -> None:
    with pytest.raises(ConfigError) as caught:
        TenantBudget(UNREACHABLE, tokens=10, window_seconds=3600, buckets=buckets)
    message = str(caught.value)
    assert "\n" not in message and "buckets" in message and f"{MAX_BUCKETS:,}" in message
    assert len(message) < 200 and "pw-s3cret" not in message


def test_buckets_at_the_cap_are_taken() -> None:
    budget = TenantBudget(UNREACHABLE, tokens=10, window_seconds=3600, buckets=MAX_BUCKETS)
    try:
        assert budget.width_ms == 3_600_000 // MAX_BUCKETS
    finally:
        budget.close()
