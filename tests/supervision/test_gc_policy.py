"""The runtime's garbage-collector policy: thresholds set while a runtime is open, then restored."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import trio

from actors.prompt import SystemPrompt
from supervision import open_runtime
from supervision.gc_policy import (
    DEFAULT_GC_THRESHOLDS,
    GcPolicyError,
    applied_thresholds,
    check_thresholds,
)

BEFORE = (700, 10, 10)


@pytest.fixture(autouse=True)
def known_thresholds() -> Iterator[None]:
    """Every test starts at CPython's default thresholds and puts the process's back."""
    saved = gc.get_threshold()
    gc.set_threshold(*BEFORE)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_thresholds_hold_inside_the_block_and_are_restored_after() -> None:
    with applied_thresholds((5000, 7, 9)):
        assert gc.get_threshold() == (5000, 7, 9)
        assert gc.isenabled()
    assert gc.get_threshold() == BEFORE


def test_none_leaves_the_collector_alone() -> None:
    gc.set_threshold(1234, 5, 6)
    with applied_thresholds(None):
        assert gc.get_threshold() == (1234, 5, 6)
        gc.set_threshold(99, 9, 9)
    assert gc.get_threshold() == (99, 9, 9)


def test_an_exception_in_the_block_still_restores() -> None:
    with pytest.raises(KeyError), applied_thresholds((5000, 10, 10)):
        raise KeyError("boom")
    assert gc.get_threshold() == BEFORE


def test_overlapping_blocks_closed_out_of_order_restore_the_first_ones_before() -> None:
    first, second = ExitStack(), ExitStack()
    first.enter_context(applied_thresholds((1000, 10, 10)))
    second.enter_context(applied_thresholds((2000, 10, 10)))
    assert gc.get_threshold() == (2000, 10, 10)
    first.close()  # the later one still open keeps its thresholds
    assert gc.get_threshold() == (2000, 10, 10)
    second.close()
    assert gc.get_threshold() == BEFORE


def test_closing_the_latest_block_goes_back_to_the_one_still_open() -> None:
    with applied_thresholds((1000, 10, 10)):
        with applied_thresholds((2000, 10, 10)):
            assert gc.get_threshold() == (2000, 10, 10)
        assert gc.get_threshold() == (1000, 10, 10)
    assert gc.get_threshold() == BEFORE


@pytest.mark.parametrize(
    ("thresholds", "named"),
    [
        ((0, 10, 10), "young"),
        ((700, -1, 10), "middle"),
        ((700, 10, True), "old"),
        ((700, 10, 1.5), "old"),
        ((700, 10), "three numbers"),
    ],
)
def test_out_of_range_thresholds_are_refused_naming_the_value(thresholds: Any, named: str) -> None:
    with pytest.raises(GcPolicyError, match=named), applied_thresholds(thresholds):
        pass  # pragma: no cover - never entered
    assert gc.get_threshold() == BEFORE
    with pytest.raises(GcPolicyError, match=named):
        check_thresholds(thresholds)


async def test_an_open_runtime_collects_at_the_default_policy_and_restores_on_exit() -> None:
    async with open_runtime(system_prompt=SystemPrompt()):
        assert gc.get_threshold() == DEFAULT_GC_THRESHOLDS
        assert DEFAULT_GC_THRESHOLDS[0] > BEFORE[0]
    assert gc.get_threshold() == BEFORE


async def test_a_runtime_takes_its_configured_thresholds_or_none() -> None:
    async with open_runtime(system_prompt=SystemPrompt(), gc_thresholds=(3000, 4, 5)):
        assert gc.get_threshold() == (3000, 4, 5)
    async with open_runtime(system_prompt=SystemPrompt(), gc_thresholds=None):
        assert gc.get_threshold() == BEFORE
    assert gc.get_threshold() == BEFORE


async def test_a_runtime_left_by_an_error_or_a_cancellation_restores_the_thresholds() -> None:
    with pytest.raises(KeyError):
        async with open_runtime(system_prompt=SystemPrompt()):
            raise KeyError("body failed")
    assert gc.get_threshold() == BEFORE
    with trio.move_on_after(0.01):
        async with open_runtime(system_prompt=SystemPrompt()):
            await trio.sleep_forever()
    assert gc.get_threshold() == BEFORE


async def test_a_runtime_with_bad_thresholds_does_not_start() -> None:
    with pytest.raises(GcPolicyError, match="young"):
        async with open_runtime(system_prompt=SystemPrompt(), gc_thresholds=(0, 10, 10)):
            pytest.fail("the runtime started")  # pragma: no cover
    assert gc.get_threshold() == BEFORE
