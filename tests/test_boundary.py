"""One exception at public boundaries: what `one_exception()` re-raises, and what it keeps."""

from __future__ import annotations

import pytest
import trio

from actors.boundary import one_exception


class DomainError(Exception):
    """A stand-in for a domain exception raised from a lower-level cause."""


async def _fail_with_cause() -> None:
    try:
        raise OSError(98, "Address already in use")
    except OSError as exc:
        raise DomainError("port 8700 is busy") from exc


async def test_a_group_of_one_failure_leaves_as_that_failure() -> None:
    with pytest.raises(DomainError, match="busy"), one_exception():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_fail_with_cause)


async def test_the_chosen_failure_keeps_its_own_cause_and_the_group_as_context() -> None:
    with pytest.raises(DomainError) as info, one_exception():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_fail_with_cause)
    assert isinstance(info.value.__cause__, OSError)
    assert isinstance(info.value.__context__, BaseExceptionGroup)


async def test_a_failure_without_a_cause_is_chained_from_its_group() -> None:
    async def fail() -> None:
        raise DomainError("plain")

    with pytest.raises(DomainError) as info, one_exception():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
    assert isinstance(info.value.__cause__, BaseExceptionGroup)


async def test_other_failures_are_named_in_a_note() -> None:
    async def fail(message: str) -> None:
        raise DomainError(message)

    with pytest.raises(DomainError) as info, one_exception():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail, "first")
            nursery.start_soon(fail, "second")
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "also raised: DomainError" in notes
