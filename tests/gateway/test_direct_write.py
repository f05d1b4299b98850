"""Direct writes: a fan-out round written by the connection itself, its tail, its wakeups."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing
import trio_websocket

from actors.providers.simulator import SimulatorConfig
from supervision.gateway import Gateway
from supervision.gateway.cursors import EventBatch
from supervision.gateway.fanout import Fanout
from supervision.gateway.outbox import Outbox
from supervision.gateway.transport import WEBSOCKET_FRAMING, SharedStream, WebSocketTransport
from tests.gateway.helpers import RpcClient, running_gateway, small_window_stream, wrap_websocket
from tests.gateway.test_pump import _Log


@asynccontextmanager
async def _pair(send_buffer: int) -> AsyncIterator[tuple[SharedStream, trio.SocketStream]]:
    """A `SharedStream` that may write directly, and the stream reading its peer."""
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer)
    shared, peer = SharedStream(trio.SocketStream(a), socket=a), trio.SocketStream(b)
    try:
        yield shared, peer
    finally:
        await trio.aclose_forcefully(shared)
        await trio.aclose_forcefully(peer)


async def _read_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some()
        assert chunk, "the writer's side closed early"
        data += chunk
    return bytes(data)


async def test_a_direct_write_that_fills_the_socket_keeps_its_tail_before_any_other_write() -> None:
    async with _pair(4096) as (shared, peer):
        big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket takes at once
        assert shared.writable_now
        assert not shared.write_now(big)
        assert shared.has_tail
        assert not shared.writable_now  # a second direct write would pass the outbox's bounds
        received = b""

        async def read() -> None:
            nonlocal received
            received = await _read_exactly(peer, len(big) + 8)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await shared.send_all(b"PONGPONG")  # trio-websocket's own frame: after the whole tail
        assert received == big + b"PONGPONG"
        assert not shared.has_tail and shared.writable_now


async def test_the_writer_sends_the_tail_then_its_frames_and_nothing_after_a_close() -> None:
    async with _pair(4096) as (shared, peer):
        big = b"x" * (512 * 1024)
        assert not shared.write_now(big)
        async with trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def read() -> None:
                got.append(await _read_exactly(peer, len(big) + 3))

            nursery.start_soon(read)
            assert await shared.send_frames(b"", lambda: False)  # a kicked writer: the tail only
            assert await shared.send_frames(b"end", lambda: False)
        assert got == [big + b"end"]
        assert shared.write_now(b"a" * 10)  # a drained socket takes a small write at once
        assert await _read_exactly(peer, 10) == b"a" * 10
        assert not await shared.send_frames(b"late", lambda: True)  # closing: no data frame


async def test_no_direct_write_while_another_write_holds_the_stream() -> None:
    async with _pair(4096) as (shared, peer):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(shared.send_all, b"z" * (1024 * 1024))  # blocks: nobody reads
            await trio.testing.wait_all_tasks_blocked()
            assert not shared.writable_now
            await _read_exactly(peer, 1024 * 1024)
        assert shared.writable_now


async def test_a_direct_write_to_a_broken_socket_fails_at_the_next_write() -> None:
    async with _pair(4096) as (shared, peer):
        await peer.aclose()
        await trio.sleep(0.01)
        for _ in range(3):  # the first writes may still be taken before the reset arrives
            if not shared.write_now(b"y" * 100_000):
                break
        assert shared.has_tail
        try:
            await shared.send_frames(b"", lambda: False)
        except trio.BrokenResourceError:
            pass
        else:
            raise AssertionError("a write on a reset socket succeeded")


async def test_a_write_cut_by_cancellation_breaks_the_stream_for_every_later_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A ping (trio-websocket's write, under the keep-alive's timeout) cut partway through:
    # the peer has half a frame, so nothing may follow it, least of all a direct write.
    async with _pair(4096) as (shared, peer):
        with trio.move_on_after(1) as timeout:
            await shared.send_all(b"p" * (1024 * 1024))  # nobody reads: it blocks, then is cut
        assert timeout.cancelled_caught
        assert not shared.writable_now
        with pytest.raises(trio.BrokenResourceError):
            await shared.send_frames(b"frame", lambda: False)
        with pytest.raises(trio.BrokenResourceError):
            await shared.send_all(b"close")
        await peer.aclose()


async def test_a_tail_cut_by_cancellation_breaks_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _pair(4096) as (shared, _peer):
        assert not shared.write_now(b"t" * (1024 * 1024))
        with trio.move_on_after(1) as timeout:
            await shared.send_all(b"PONG")  # writes the tail first, and is cut in it
        assert timeout.cancelled_caught
        assert not shared.has_tail and not shared.writable_now
        with pytest.raises(trio.BrokenResourceError):
            await shared.send_frames(b"", lambda: False)


async def test_a_closed_stream_takes_no_direct_write() -> None:
    async with _pair(4096) as (shared, _peer):
        await shared.aclose()
        assert not shared.writable_now
        assert not SharedStream(shared.inner).writable_now  # no socket: the writer writes


async def test_offers_without_wake_leave_the_writer_asleep_until_woken_or_kicked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outbox = Outbox()
    woke: list[float] = []

    async def writer() -> None:
        while True:
            await outbox.wait_ready()
            woke.append(trio.current_time())
            outbox.take()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.sleep(1)
        outbox.offer_merged(b'{"s":1,"events":[', b"{}", WEBSOCKET_FRAMING, wake=False)
        outbox.offer_log([b"frame"], 5, wake=False)
        await trio.sleep(1)
        assert woke == [] and outbox.has_frames
        outbox.wake()
        await trio.sleep(1)
        assert woke == [2.0] and not outbox.has_frames
        outbox.wake()  # nothing queued: no wakeup
        await trio.sleep(1)
        assert woke == [2.0]
        outbox.kick()  # a transport's tail to write: the writer runs with nothing queued
        await trio.sleep(1)
        assert woke == [2.0, 4.0]
        await trio.sleep(1)
        assert woke == [2.0, 4.0]  # `take` cleared the kick
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class _Flushing:
    """A subscriber that asks for one callback per round, like a connection's log subscription."""

    fanout: Fanout
    ends: list[list[int]]
    seen: list[int] = attrs.field(factory=list)
    due: bool = False
    broken: bool = False

    def deliver(self, batch: EventBatch) -> bool:
        self.seen.extend(event.seq for event in batch.events)
        if not self.due:
            self.due = True
            self.fanout.after_round(self.flush)
        return True

    def flush(self) -> None:
        self.due = False
        self.ends.append(list(self.seen))
        if self.broken:
            raise RuntimeError("a bug in a round's end")

    def fail(self, reason: str) -> None:
        raise AssertionError(reason)


async def test_round_end_callbacks_run_once_after_every_session_of_the_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = _Log(in_store={"stored"})
    async with trio.open_nursery() as nursery:
        fanout = Fanout(changes=log.marks.changes, read_now=log.read_now, read=log.read)
        await nursery.start(fanout.run)
        ends: list[list[int]] = []
        first = _Flushing(fanout, ends, broken=True)  # its failure does not stop the others
        second = _Flushing(fanout, ends)
        for sid in ("a", "b", "c"):
            fanout.attach(sid, 0, first)
            fanout.attach(sid, 0, second)
        for sid in ("a", "b", "c"):
            log.commit(sid, 2)
        await trio.sleep(1)
        # One callback each, after all three sessions were handed out.
        assert ends == [[0, 1] * 3, [0, 1] * 3]
        stored = _Flushing(fanout, ends)
        fanout.attach("stored", 0, stored)
        log.commit("stored", 3)
        await trio.sleep(1)
        assert ends[-1] == [0, 1, 2]  # a batch read from the store ends its own round
        called: list[int] = []
        fanout.after_round(lambda: called.append(1))  # outside a round: at once
        assert called == [1]
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class _Hold:
    """Slows a slow reader (`_slow_window_client`) down once `active`, until `released`."""

    released: trio.Event
    active: bool = False


@asynccontextmanager
async def _slow_window_client(
    gateway: Gateway, nursery: trio.Nursery, *, hold: _Hold | None = None
) -> AsyncIterator[tuple[trio_websocket.WebSocketConnection, RpcClient]]:
    """An initialized client that reads slowly, with a 4 KiB window on both sides of its
    socket (no autotuning), so the gateway's direct writes fill it and leave tails.

    With `hold`, once the hold is active it pauses 50 ms after each message until the hold
    is released (so the socket fills however fast this machine is)."""
    stream = await small_window_stream(gateway)
    try:
        ws = await wrap_websocket(nursery, stream, gateway.host, message_queue_size=1)
        client = RpcClient(ws=ws)

        async def read_slowly() -> None:
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                while True:
                    client.file(json.loads(await ws.get_message()))
                    if hold is not None and hold.active:
                        with trio.move_on_after(0.05):  # a pause per message until released
                            await hold.released.wait()
                    await trio.sleep(0.0005)
            client.file({"jsonrpc": "2.0", "method": "closed"})  # wakes waiters

        nursery.start_soon(read_slowly)
        await client.call("initialize", {"protocolVersion": 1})
        (connection,) = gateway.connections
        assert isinstance(connection.transport, WebSocketTransport)
        server_socket = connection.transport.stream._socket
        assert server_socket is not None
        server_socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        yield ws, client
    finally:
        await trio.aclose_forcefully(stream)


@attrs.define(eq=False)
class _Partial:
    """Direct writes the socket did not take whole (each left a tail)."""

    sizes: list[int] = attrs.field(factory=list)
    happened: trio.Event = attrs.field(factory=trio.Event)


@pytest.fixture
def partial_writes(monkeypatch: pytest.MonkeyPatch) -> _Partial:
    partial = _Partial()
    write_now = SharedStream.write_now

    def counting(self: SharedStream, data: bytes) -> bool:
        done = write_now(self, data)
        if not done:
            partial.sizes.append(len(data))
            partial.happened.set()
        return done

    monkeypatch.setattr(SharedStream, "write_now", counting)
    return partial


MAX_TURNS = 30
"""Turns a slow-reader test runs at most while waiting for a direct write to leave a tail."""


@pytest.mark.parametrize("mode", [{}, {"merge": True}])
async def test_a_slow_pinging_reader_gets_every_event_once_in_order_through_socket_full_tails(
    mode: dict[str, bool], partial_writes: _Partial
) -> None:
    # A reader with a tiny window that reads slowly and pings all the time: direct writes
    # leave tails, and the pongs trio-websocket writes (between the gateway's writes) take
    # them; every frame must still arrive whole, every event once, in order.
    config = SimulatorConfig(reply_tokens=120)
    hold = _Hold(released=partial_writes.happened)
    async with running_gateway(config=config, write_deadline=30.0) as gateway:
        with trio.fail_after(180):
            agents = [
                await gateway.directory.create(profile="default", owner=None) for _ in range(4)
            ]
            async with (
                trio.open_nursery() as nursery,
                _slow_window_client(gateway, nursery, hold=hold) as (ws, client),
            ):

                async def ping() -> None:
                    with contextlib.suppress(trio_websocket.ConnectionClosed):
                        while True:
                            await ws.ping()
                            await trio.sleep(0.002)

                for agent in agents:
                    params = {"sessionId": agent.session.id, "fromSeq": 0, **mode}
                    await client.call("_harness/log/subscribe", params)
                hold.active = True  # a much slower reader until a direct write has left a tail
                nursery.start_soon(ping)
                # At least three turns each, and more until a direct write has left a tail
                # (the client reads much slower until one has).
                for turn in range(MAX_TURNS):
                    if turn >= 3 and partial_writes.sizes:
                        break
                    for agent in agents:
                        agent.followup(f"turn {turn}")
                    for agent in agents:
                        await agent.when_idle()
                expected = {
                    agent.session.id: [json.dumps(e) for e in agent.session.to_json()]
                    for agent in agents
                }
                await client.wait_for_log_events(sum(map(len, expected.values())))
                for sid, events in expected.items():
                    assert [json.dumps(e) for e in client.log_events[sid]] == events
                assert gateway.statistics().slow_consumer_closes == 0
                nursery.cancel_scope.cancel()
    assert partial_writes.sizes, "no direct write filled the socket: no tail was exercised"


@pytest.mark.parametrize(("bad", "code"), [(b"binary", 1003), ("x" * (1024 * 1024 + 1), 1009)])
async def test_a_close_for_a_bad_frame_follows_every_frame_already_written(
    bad: str | bytes, code: int, partial_writes: _Partial
) -> None:
    # The close frame (1003 from the gateway, 1009 from trio-websocket) goes out behind the
    # tail of a direct write, whole, and nothing follows it: the reader gets a gap-free prefix
    # of each log, then the close with its code.
    config = SimulatorConfig(reply_tokens=200)
    async with running_gateway(config=config, write_deadline=30.0) as gateway:
        with trio.fail_after(90):
            agents = [
                await gateway.directory.create(profile="default", owner=None) for _ in range(4)
            ]
            async with (
                trio.open_nursery() as nursery,
                _slow_window_client(gateway, nursery) as (ws, client),
            ):
                for agent in agents:
                    params = {"sessionId": agent.session.id, "merge": True}
                    await client.call("_harness/log/subscribe", params)
                for agent in agents:
                    agent.followup("a long reply")
                await partial_writes.happened.wait()  # a tail is waiting
                await ws.send_message(bad)
                with contextlib.suppress(trio_websocket.ConnectionClosed):
                    await client.wait_for(lambda n: n["method"] == "closed")
                assert ws.closed is not None and ws.closed.code == code
                for agent in agents:
                    await agent.when_idle()
                    got = [json.dumps(e) for e in client.log_events.get(agent.session.id, [])]
                    log = [json.dumps(e) for e in agent.session.to_json()]
                    assert got == log[: len(got)]
                nursery.cancel_scope.cancel()
