"""The fan-out's pump: one wakeup per commit batch, every session's events in order, failures."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
import trio
import trio.testing

from actors.session import Event, MemoryStore, SessionError
from actors.session.durability import DurableMarks
from supervision.gateway.cursors import EventBatch
from supervision.gateway.encoding import encode_event
from supervision.gateway.fanout import Fanout
from tests.gateway.helpers import running_gateway
from tests.session.store_helpers import turn_start


@attrs.define(eq=False)
class _Log:
    """Sessions' events and their durability marks, as the gateway's live logs would have them."""

    marks: DurableMarks = attrs.field(factory=DurableMarks)
    events: dict[str, list[Event]] = attrs.field(factory=dict)
    in_store: set[str] = attrs.field(factory=set)
    """Sessions read with `read` (as a session without a live agent would be)."""
    store_reads: int = 0

    def commit(self, session_id: str, count: int = 1) -> None:
        log = self.events.setdefault(session_id, [])
        for _ in range(count):
            log.append(turn_start(len(log)))
        self.marks.advance(session_id, len(log) - 1)

    def read_now(
        self, session_id: str, from_seq: int, limit: int
    ) -> tuple[Sequence[Event], int] | None:
        if session_id in self.in_store:
            return None
        head = self.marks.seq(session_id)
        if head < from_seq:
            return None
        return self.events[session_id][from_seq : min(head + 1, from_seq + limit)], head

    async def read(self, session_id: str, from_seq: int, limit: int) -> tuple[Sequence[Event], int]:
        await self.marks.wait(session_id, from_seq)
        self.store_reads += 1
        head = self.marks.seq(session_id)
        return self.events[session_id][from_seq : min(head + 1, from_seq + limit)], head


@attrs.define(eq=False)
class _Subscriber:
    batches: list[list[int]] = attrs.field(factory=list)
    failures: list[str] = attrs.field(factory=list)
    broken: bool = False

    def deliver(self, batch: EventBatch) -> bool:
        if self.broken:
            raise RuntimeError("a bug")
        self.batches.append([event.seq for event in batch.events])
        return True

    def fail(self, reason: str) -> None:
        self.failures.append(reason)

    @property
    def seqs(self) -> list[int]:
        return [seq for batch in self.batches for seq in batch]


async def _running(log: _Log, nursery: trio.Nursery) -> Fanout:
    fanout = Fanout(changes=log.marks.changes, read_now=log.read_now, read=log.read)
    await nursery.start(fanout.run)
    return fanout


async def test_commits_between_two_wakeups_go_out_as_one_batch_per_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log()
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        subscribers = {sid: _Subscriber() for sid in ("a", "b", "c")}
        for sid, subscriber in subscribers.items():
            log.commit(sid, 2)  # already durable when it attaches: delivered too
            assert fanout.attach(sid, 0, subscriber)
        for _ in range(5):
            for sid in subscribers:
                log.commit(sid)
        await trio.sleep(1)
        for subscriber in subscribers.values():
            assert subscriber.batches == [[0, 1, 2, 3, 4, 5, 6]]
        rounds = fanout.rounds
        log.commit("a", 3)
        await trio.sleep(1)
        assert subscribers["a"].batches[-1] == [7, 8, 9]
        assert fanout.rounds == rounds + 1 and fanout.events == 3 * 7 + 3
        assert not fanout.attach("a", 5, _Subscriber())  # behind the feed: catches up first
        late = _Subscriber()
        assert fanout.attach("a", 10, late)
        log.commit("a")
        await trio.sleep(1)
        assert late.seqs == [10] and subscribers["a"].seqs == list(range(11))
        nursery.cancel_scope.cancel()


async def test_a_session_read_from_the_store_keeps_its_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log(in_store={"s"})
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        subscriber = _Subscriber()
        fanout.attach("s", 0, subscriber)
        for _ in range(20):
            log.commit("s")
            await trio.sleep(0.0005)
        await trio.sleep(1)
        assert subscriber.seqs == list(range(20))
        assert log.store_reads == len(subscriber.batches) < 20
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("in_store", [False, True])
async def test_a_failed_session_fails_its_subscribers_after_its_durable_events(
    autojump_clock: trio.testing.MockClock, in_store: bool
) -> None:
    log = _Log(in_store={"bad"} if in_store else set())
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        bad, good = _Subscriber(), _Subscriber()
        fanout.attach("bad", 0, bad)
        fanout.attach("good", 0, good)
        log.commit("bad", 2)
        await trio.sleep(1)
        log.marks.fail("bad", SessionError("session 'bad': the disk is gone"))
        log.commit("good", 2)
        await trio.sleep(1)
        assert bad.seqs == [0, 1]
        assert len(bad.failures) == 1 and "disk is gone" in bad.failures[0]
        assert "'bad'" in bad.failures[0]
        assert good.seqs == [0, 1] and not good.failures
        assert fanout.feeds == 1  # the failed feed ended
        nursery.cancel_scope.cancel()


async def test_a_bug_in_one_feed_ends_that_feed_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log()
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        broken, beside, other = _Subscriber(broken=True), _Subscriber(), _Subscriber()
        fanout.attach("x", 0, broken)
        fanout.attach("x", 0, beside)
        fanout.attach("y", 0, other)
        log.commit("x")
        log.commit("y")
        await trio.sleep(1)
        assert beside.failures == broken.failures == ["session 'x': the gateway's feed failed"]
        assert other.seqs == [0]
        log.commit("y")
        await trio.sleep(1)
        assert other.seqs == [0, 1] and fanout.feeds == 1
        nursery.cancel_scope.cancel()


async def test_a_detached_subscriber_gets_nothing_more_and_an_empty_feed_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log()
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        subscriber = _Subscriber()
        fanout.attach("s", 0, subscriber)
        log.commit("s")
        await trio.sleep(1)
        fanout.detach("s", subscriber)
        assert fanout.feeds == 0
        log.commit("s")
        await trio.sleep(1)
        assert subscriber.seqs == [0]
        nursery.cancel_scope.cancel()
    assert log.marks._listeners == []  # the pump's listener closed with it


async def test_rounds_that_took_long_space_the_next_rounds_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A saturated runtime (rounds that take long, commits right after) gets fewer, larger
    rounds; one slow round, or a pause in the commits, changes nothing."""
    log = _Log()
    work = 0.01  # the hand-out "takes" this long (the clock jumps in `deliver`)
    delivered_at: list[float] = []
    delivered = trio.Event()

    @attrs.define(eq=False)
    class _Slow(_Subscriber):
        def deliver(self, batch: EventBatch) -> bool:
            nonlocal delivered
            delivered_at.append(trio.current_time())
            autojump_clock.jump(work)
            delivered.set()
            delivered = trio.Event()
            return super().deliver(batch)

    async def delay_of_next_round(*, pause: float) -> float:
        """Commit `pause` s after the last round ended; how long until the round after it."""
        await trio.sleep(pause)
        committed = trio.current_time()
        next_round = delivered
        log.commit("s")
        await next_round.wait()
        return delivered_at[-1] - committed

    async with trio.open_nursery() as nursery:
        fanout = Fanout(
            changes=log.marks.changes,
            read_now=log.read_now,
            read=log.read,
            work_clock=trio.current_time,
        )
        await nursery.start(fanout.run)
        fanout.attach("s", 0, _Slow())
        assert await delay_of_next_round(pause=0) == pytest.approx(0.005)
        assert await delay_of_next_round(pause=0) == pytest.approx(0.005)  # one slow round
        assert fanout.round_work == pytest.approx((work, work))
        assert await delay_of_next_round(pause=0) == pytest.approx(20 * work)
        # Time that passed since the last round counts: a runtime that paused gets it at once.
        assert await delay_of_next_round(pause=0.05) == pytest.approx(20 * work - 0.05)
        assert await delay_of_next_round(pause=1) == pytest.approx(0.005)
        work = 0.0
        assert await delay_of_next_round(pause=0) == pytest.approx(20 * 0.01)
        assert await delay_of_next_round(pause=0) == pytest.approx(0.005)  # quick: the minimum
        assert fanout.next_linger(0.0) == fanout.linger == 0.005
        fanout.round_work = (10.0, 10.0)
        assert fanout.next_linger(0.0) == fanout.linger_max
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class _Timed(_Subscriber):
    at: list[float] = attrs.field(factory=list)

    def deliver(self, batch: EventBatch) -> bool:
        self.at.append(trio.current_time())
        return super().deliver(batch)


async def test_a_step_still_streaming_when_the_linger_ends_goes_out_whole(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log()
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        subscriber = _Timed()
        fanout.attach("s", 0, subscriber)
        start = trio.current_time()
        for _ in range(9):  # a step streaming for 8.8 ms, past the 5 ms linger
            log.commit("s")
            await trio.sleep(0.0011)
        await trio.sleep(1)
        assert subscriber.batches == [list(range(9))]
        # Out once the commits paused for `linger_quiet`, not later.
        assert subscriber.at[0] - start == pytest.approx(0.011)
        # A lone commit still goes out after the linger, nothing added.
        committed = trio.current_time()
        log.commit("s")
        await trio.sleep(1)
        assert subscriber.batches[-1] == [9]
        assert subscriber.at[-1] - committed == pytest.approx(fanout.linger)
        nursery.cancel_scope.cancel()


async def test_commits_that_never_pause_go_out_at_least_every_streaming_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log()
    async with trio.open_nursery() as nursery:
        fanout = await _running(log, nursery)
        subscriber = _Timed()
        fanout.attach("s", 0, subscriber)
        committed: list[float] = []
        for _ in range(100):
            committed.append(trio.current_time())
            log.commit("s")
            await trio.sleep(0.00101)
        await trio.sleep(1)
        assert subscriber.seqs == list(range(100))
        assert len(subscriber.batches) >= 4
        for batch, at in zip(subscriber.batches, subscriber.at, strict=True):
            # No event waited longer than the streaming wait (plus the quiet check after it).
            assert at - committed[batch[0]] <= fanout.linger_streaming + fanout.linger_quiet
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class _Keeping(_Subscriber):
    kept: list[EventBatch] = attrs.field(factory=list)

    def deliver(self, batch: EventBatch) -> bool:
        self.kept.append(batch)
        return super().deliver(batch)


async def test_the_fanout_sends_a_memory_stores_own_text_of_each_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The store made each event's JSON at its append; the fan-out sends those bytes as they
    # are (a request header, kept decoded, is encoded), byte-equal to encoding the event.
    store = MemoryStore()
    async with running_gateway(store=store) as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        sid = agent.session.id
        agent.followup("hello")
        await agent.when_idle()
        events = agent.session.durable_events(0)
        texts = [store.durable_json(sid, event.seq) for event in events]
        assert any(text is None for text in texts)  # the request header
        assert all(
            text == encode_event(event)
            for text, event in zip(texts, events, strict=True)
            if text is not None
        )
        assert store.durable_json(sid, len(events)) is None
        assert store.durable_json("no-such-session", 0) is None
        # A range is read in one walk: the same texts, None past the log's end.
        for first in range(len(events)):
            assert store.durable_json_range(sid, first, len(events)) == [
                *texts[first:],
                None,
            ]
        assert store.durable_json_range("no-such-session", 0, 1) == [None, None]
        assert gateway.fanout.stored_json is not None
        encoded: list[int] = []

        def counting(event: Event) -> bytes:
            encoded.append(event.seq)
            return encode_event(event)

        monkeypatch.setattr("supervision.gateway.fanout.encode_event", counting)
        subscriber = _Keeping()
        batches = subscriber.kept
        assert gateway.fanout.attach(sid, len(events), subscriber)
        agent.followup("again")
        await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        sent = [text for batch in batches for text in batch.texts]
        assert sent == [encode_event(event) for event in agent.session.durable_events(len(events))]
        stored = [store.durable_json(sid, seq) for seq in range(len(events), len(agent.session))]
        assert sent == [text for text in stored if text is not None]
        assert len(sent) == len(stored) and encoded == []  # nothing encoded again
