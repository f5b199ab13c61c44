"""A tenant's charge, written once for every task: the estimate is taken at admission and
settled once with the model's count, or at 0 when the request failed."""

from __future__ import annotations

import asyncio

import pytest

from deployments.core.access.access import AccessControl, AccessDenied, Tenant
from deployments.core.access.token_bucket import TokenBucket
from deployments.core.priority import Priority
from tests.fakes import Clock


def tenant() -> Tenant:
    clock = Clock()
    return Tenant("t", Priority.NORMAL, None, tokens=TokenBucket(1, 100, clock=clock))


def level(owner: Tenant) -> float:
    assert owner.tokens is not None
    return owner.tokens.burst - owner.tokens.wait_for(owner.tokens.burst) * owner.tokens.rate


def test_a_settled_charge_costs_the_models_count_and_settles_once() -> None:
    owner = tenant()
    charge = AccessControl.hold(owner, 40)
    assert level(owner) == 60
    charge.settle(25)
    assert level(owner) == 75
    charge.settle(0)  # a second settle (a stream's end after its error) changes nothing
    assert level(owner) == 75


@pytest.mark.parametrize("failure", [RuntimeError("model"), asyncio.CancelledError()])
def test_a_failure_in_the_block_refunds_everything(failure: BaseException) -> None:
    owner = tenant()
    charge = AccessControl.hold(owner, 40)
    with pytest.raises(type(failure)), charge.refunded_on_failure():
        raise failure
    assert level(owner) == 100 and charge.settled


def test_no_tenant_holds_nothing_and_an_empty_bucket_refuses() -> None:
    AccessControl.hold(None, 10**9).settle(0)
    owner = tenant()
    AccessControl.hold(owner, 100)
    with pytest.raises(AccessDenied) as denied:
        AccessControl.hold(owner, 1)
    assert denied.value.kind == "rate_limited" and denied.value.retry_after_s == 1
