"""The request index: each request id's latest logged turn, kept up to date incrementally."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from actors.agent import TurnFailedError
from actors.messages import Message, TextBlock, UserSource
from actors.session import Event
from actors.session.events import TurnEnd, TurnStart, UserMessage
from supervision.cluster.request_index import LoggedPrompt, request_index
from tests.agent.helpers import fail_first_step_once, refuse
from tests.gateway.helpers import running_gateway


def scanned(events: Sequence[Event], request_id: str) -> LoggedPrompt | None:
    """The whole-log scan the index replaces: the latest turn carrying `request_id`."""
    found: LoggedPrompt | None = None
    starts: dict[int, int] = {}
    for event in events:
        data = event.data
        if isinstance(data, TurnStart):
            starts[data.turn] = event.seq
        elif (
            isinstance(data, UserMessage)
            and isinstance(data.source, UserSource)
            and data.source.request_id == request_id
        ):
            turn = max(starts)
            found = LoggedPrompt(turn=turn, start_seq=starts[turn], end=None)
        elif isinstance(data, TurnEnd) and found is not None and data.turn == found.turn:
            found = LoggedPrompt(turn=found.turn, start_seq=found.start_seq, end=data)
    return found


def message(text: str, request_id: str) -> Message:
    return Message(
        role="user", content=(TextBlock(text=text),), source=UserSource(request_id=request_id)
    )


async def test_the_index_matches_a_full_scan_after_every_turn_reading_each_event_once() -> None:
    async with running_gateway() as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        session = agent.session
        index = request_index(session)
        assert request_index(session) is index  # one per session
        ids = ["r0", "r1", "r2", "r0"]  # r0 again: its latest attempt counts
        for turn, request_id in enumerate(ids):
            agent.followup(message(f"turn {turn}", request_id))
            index.queue(request_id, None)
            assert index.queued(request_id) is not None
            await agent.when_idle()
            await session.flush()
            for known in {*ids, "never"}:
                assert index.find(known) == scanned(session.durable_events(0), known)
            assert index.next_seq == len(session)  # read up to the head, and no further
            assert index.queued(request_id) is None  # logged now
        latest = index.find("r0")
        assert latest is not None and latest.end is not None
        assert latest.turn == max(
            e.data.turn for e in session.durable_events(0) if isinstance(e.data, TurnStart)
        )
        assert index.find("never") is None


async def test_a_prompt_whose_turn_ended_without_its_message_stops_counting_as_queued() -> None:
    async with running_gateway() as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        agent.on_pre_step(refuse)  # the turn ends before its first step logs the message
        index = request_index(agent.session)
        ticket = agent.submit(message("hi", "r"))
        index.queue("r", ticket)
        queued = index.queued("r")
        assert queued is not None and queued.ticket is ticket  # its turn has not ended
        with pytest.raises(TurnFailedError, match="blocked"):
            await ticket.outcome()
        await agent.session.flush()  # the refused turn's end is durable
        assert index.queued("r") is None and index.find("r") is None


async def test_a_prompt_put_back_by_a_failed_first_step_still_counts_as_queued() -> None:
    async with running_gateway() as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        agent.on_pre_step(fail_first_step_once())  # the message goes back to the inbox, parked
        index = request_index(agent.session)
        ticket = agent.submit(message("hi", "r"))
        index.queue("r", ticket)
        with pytest.raises(TurnFailedError, match="not now"):
            await ticket.outcome()
        await agent.session.flush()
        # A retry must not queue it again: it is parked and runs at the next wake.
        queued = index.queued("r")
        assert queued is not None and queued.ticket is ticket and ticket.requeued
        agent.followup(message("wake up", "w"))
        await agent.when_idle()
        await agent.session.flush()
        assert index.queued("r") is None  # logged now, once
        logged = [
            e.data.source.request_id
            for e in agent.session.durable_events(0)
            if isinstance(e.data, UserMessage) and isinstance(e.data.source, UserSource)
        ]
        assert logged == ["r", "w"]
