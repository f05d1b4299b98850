"""Keep-alive: websockets are pinged every 20 s; a pong 20 s late closes the connection 1011."""

from __future__ import annotations

import struct

import trio

from supervision.gateway import Gateway
from tests.gateway.helpers import SECRET, connect, running_gateway


async def _handshake(gateway: Gateway) -> trio.SocketStream:
    """Upgrade a raw TCP stream to a websocket by hand; the caller then never answers a ping."""
    stream = await trio.open_tcp_stream(gateway.host, gateway.port)
    lines = [
        "GET /acp HTTP/1.1",
        f"Host: {gateway.host}:{gateway.port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        f"Authorization: Bearer {SECRET}",
    ]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += await stream.receive_some()
    assert answer.startswith(b"HTTP/1.1 101"), answer
    assert answer.endswith(b"\r\n\r\n"), "no frame is due before the first ping"
    return stream


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of each unmasked frame the server sent."""
    frames = []
    while data:
        opcode, length = data[0] & 0x0F, data[1] & 0x7F
        start = 2
        if length == 126:
            (length,) = struct.unpack("!H", data[2:4])
            start = 4
        elif length == 127:
            (length,) = struct.unpack("!Q", data[2:10])
            start = 10
        frames.append((opcode, data[start : start + length]))
        data = data[start + length :]
    return frames


async def _arrivals(stream: trio.SocketStream) -> list[tuple[float, int, bytes]]:
    """(time, opcode, payload) of each frame, until the server ends the stream."""
    started = trio.current_time()
    arrivals = []
    buffer = b""
    while chunk := await stream.receive_some():
        buffer += chunk
        for opcode, payload in _frames(buffer):
            arrivals.append((trio.current_time() - started, opcode, payload))
        buffer = b""
    return arrivals


async def test_a_peer_that_stops_answering_pings_is_closed_with_1011(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway() as gateway:
        stream = await _handshake(gateway)  # it never answers a ping, nor sends anything
        arrivals = await _arrivals(stream)
        await stream.aclose()
    (ping_at, ping, _), (close_at, close, payload) = arrivals
    assert ping == 0x9 and 19.9 <= ping_at <= 20.5
    assert close == 0x8 and 39.9 <= close_at <= 40.5  # the pong was 20 s late
    code, reason = struct.unpack("!H", payload[:2])[0], payload[2:].decode()
    assert code == 1011 and "no pong within 20 s" in reason


async def test_a_live_idle_peer_answers_every_ping_and_stays_connected(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        await trio.sleep(300)  # 15 pings, each answered by the client's websocket library
        assert client.ws.closed is None
        assert gateway.statistics().connections == 1
        stats = await client.call("_harness/stats", {})
        assert stats["gateway"]["connections"] == 1


async def test_the_ping_interval_and_timeout_are_the_gateways_settings(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway(ping_interval=5.0, ping_timeout=2.0) as gateway:
        stream = await _handshake(gateway)
        arrivals = await _arrivals(stream)
        await stream.aclose()
    assert [(round(at, 1), opcode) for at, opcode, _ in arrivals] == [(5.0, 0x9), (7.0, 0x8)]
