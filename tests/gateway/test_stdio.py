"""One connection over newline-delimited stdio: at the end of input, what is running is answered."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from actors.providers.simulator import SimulatorConfig
from supervision.gateway import Gateway
from supervision.gateway.auth import Principal
from supervision.gateway.stdio import StdioTransport
from tests.gateway.helpers import ALL, running_gateway


async def _converse(gateway: Gateway, lines: list[Any]) -> list[Any]:
    """Write `lines` (one JSON value each), end the input, and return every line written
    back by the time the connection ended."""
    to_server, stdin = trio.testing.memory_stream_one_way_pair()
    stdout, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(stdin=stdin, stdout=stdout)
    written = bytearray()

    async def read_all() -> None:
        while data := await from_server.receive_some():
            written.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await to_server.send_all(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        await to_server.aclose()
        await gateway.run_connection(transport, Principal(token=ALL), answer_after_eof=True)
        await stdout.aclose()
    return [json.loads(line) for line in written.splitlines()]


def _request(rpc_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


NEW = {"cwd": "/", "mcpServers": []}


async def test_a_batch_still_running_at_the_end_of_input_is_answered() -> None:
    async with running_gateway() as gateway:
        with trio.fail_after(30):
            out = await _converse(
                gateway,
                [
                    _request(1, "initialize", {"protocolVersion": 1}),
                    [_request(2, "session/new", NEW), _request(3, "session/new", NEW)],
                ],
            )
    (batch,) = [line for line in out if isinstance(line, list)]
    assert sorted(reply["id"] for reply in batch) == [2, 3]
    assert all("sessionId" in reply["result"] for reply in batch)


async def test_a_prompt_still_running_at_the_end_of_input_is_answered_at_its_turns_end() -> None:
    config = SimulatorConfig(reply_tokens=40, token_rate=400.0)  # a turn of ~0.1 s
    async with running_gateway(config=config) as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        sid = agent.session.id
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
        with trio.fail_after(30):
            out = await _converse(
                gateway,
                [
                    _request(1, "initialize", {"protocolVersion": 1}),
                    _request(2, "session/prompt", prompt),
                ],
            )
    (reply,) = [line for line in out if isinstance(line, dict) and line.get("id") == 2]
    assert reply["result"]["stopReason"] == "end_turn"
    updates = [line for line in out if isinstance(line, dict) and line.get("method")]
    assert updates and all(u["method"] == "session/update" for u in updates)
    assert out.index(reply) > out.index(updates[-1])  # every update before the reply


class GatedStream(trio.abc.SendStream):
    """A send stream whose writes wait until `gate` is set (a reader that has not read yet)."""

    def __init__(self, inner: trio.abc.SendStream) -> None:
        self.inner = inner
        self.gate = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.gate.wait()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.gate.wait()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_replies_and_updates_queued_when_the_input_ends_are_written_before_the_close() -> (
    None
):
    """The writer is still busy with the first reply when the prompt's turn ends and the
    connection closes: what the log lane holds (updates, the prompt's reply) still goes out."""
    async with running_gateway() as gateway:
        agent = await gateway.directory.create(profile="default", owner=None)
        prompt = {"sessionId": agent.session.id, "prompt": [{"type": "text", "text": "hi"}]}
        to_server, stdin = trio.testing.memory_stream_one_way_pair()
        raw_stdout, from_server = trio.testing.memory_stream_one_way_pair()
        stdout = GatedStream(raw_stdout)
        transport = StdioTransport(stdin=stdin, stdout=stdout)
        written = bytearray()

        async def read_all() -> None:
            while data := await from_server.receive_some():
                written.extend(data)

        async def open_the_gate_once_the_turn_ended() -> None:
            await trio.sleep(0.05)  # the prompt has been queued
            await agent.when_idle()
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            stdout.gate.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                nursery.start_soon(open_the_gate_once_the_turn_ended)
                lines = [
                    _request(1, "initialize", {"protocolVersion": 1}),
                    _request(2, "session/prompt", prompt),
                ]
                await to_server.send_all(b"".join(json.dumps(ln).encode() + b"\n" for ln in lines))
                await to_server.aclose()
                await gateway.run_connection(transport, Principal(token=ALL), answer_after_eof=True)
                await raw_stdout.aclose()
    out = [json.loads(line) for line in written.splitlines()]
    assert [line.get("id") for line in out if "id" in line] == [1, 2]
    assert out[-1]["result"]["stopReason"] == "end_turn"
    assert any(line.get("method") == "session/update" for line in out)
