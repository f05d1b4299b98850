"""Framing, ids, limits and errors over a live connection; the HTTP side of the port."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
import trio_websocket

from actors.providers.simulator import SimulatorConfig
from actors.session import EVENT_TYPES
from supervision.gateway import harness_methods
from supervision.gateway import methods as method_table
from supervision.gateway.methods import METHODS, Method
from tests.gateway.helpers import connect, running_gateway

TEXT = [{"type": "text", "text": "tell me a story"}]


async def _new(client: object) -> str:
    return (await client.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]  # type: ignore[attr-defined]


async def test_a_batch_is_answered_as_one_list_and_lifecycle_methods_are_refused_in_it() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        await client.send(
            [
                {"jsonrpc": "2.0", "id": "a", "method": "_harness/stats"},
                {
                    "jsonrpc": "2.0",
                    "id": "b",
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                },
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "x"}},
                {"jsonrpc": "2.0", "id": "c", "method": "nope"},
            ]
        )
        with trio.fail_after(10):
            await client.answer("a")
        batch = next(frame for frame in client.frames if isinstance(frame, list))
        assert [m["id"] for m in batch] == ["a", "b", "c"]
        assert "result" in batch[0]
        assert batch[1]["error"]["code"] == -32600
        assert batch[2]["error"]["code"] == -32601


async def test_a_duplicate_in_flight_id_and_a_second_prompt_on_a_session_are_refused() -> None:
    config = SimulatorConfig(reply_tokens=200, token_rate=100.0)
    async with running_gateway(config=config) as gateway, connect(gateway) as client:
        sid = await _new(client)
        prompt = {"jsonrpc": "2.0", "id": 9, "method": "session/prompt"}
        await client.send({**prompt, "params": {"sessionId": sid, "prompt": TEXT}})
        with trio.fail_after(10):
            await client.wait_for(lambda n: n["method"] == "session/update")
            await client.send({"jsonrpc": "2.0", "id": 9, "method": "_harness/stats"})
            refused = await client.answer(9)
            assert refused["error"]["code"] == -32600 and "9" in refused["error"]["message"]
            busy = await client.request("session/prompt", {"sessionId": sid, "prompt": TEXT})
            assert busy["error"]["code"] == -33002
            await client.send(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            done = await client.answer(9)
        assert done["result"]["stopReason"] == "cancelled"


async def test_requests_beyond_the_in_flight_limit_are_overloaded() -> None:
    config = SimulatorConfig(reply_tokens=400, token_rate=50.0)
    async with (
        running_gateway(config=config, max_inflight=2) as gateway,
        connect(gateway) as client,
    ):
        sids = [await _new(client) for _ in range(2)]
        for index, sid in enumerate(sids):
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": f"p{index}",
                    "method": "session/prompt",
                    "params": {"sessionId": sid, "prompt": TEXT},
                }
            )
        with trio.fail_after(10):
            answer = await client.request("_harness/stats", {})
        assert answer["error"]["code"] == -33003
        assert answer["error"]["data"]["retryAfterMs"] > 0


async def test_from_seq_past_the_head_is_out_of_range() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        sid = await _new(client)
        answer = await client.request("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 5})
        assert answer["error"]["code"] == -32602
        assert answer["error"]["data"] == {
            "path": "/fromSeq",
            "reason": "seq_out_of_range",
            "headSeq": -1,
        }
        ok = await client.call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0})
        assert (ok["fromSeq"], ok["headSeq"]) == (0, -1)


async def test_non_empty_mcp_servers_are_invalid_params() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        answer = await client.request("session/new", {"cwd": "/", "mcpServers": [{"name": "x"}]})
        assert answer["error"]["code"] == -32602
        assert answer["error"]["data"]["path"] == "/mcpServers"


async def test_a_failing_handler_closes_only_its_connection_with_1011(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(params: object, call: object) -> None:
        raise RuntimeError("bug")

    table = dict(METHODS)
    table["_harness/stats"] = Method(
        params=METHODS["_harness/stats"].params, handler=broken, scope=None
    )
    monkeypatch.setattr(method_table, "METHODS", table)
    async with running_gateway() as gateway:
        monkeypatch.setattr(gateway, "methods", method_table.MethodTable(methods=table))
        async with connect(gateway) as bystander, connect(gateway) as victim:
            with trio.fail_after(10):
                answer = await victim.request("_harness/stats", {})
                assert answer["error"]["code"] == -32603
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    await victim.answer("never")
                assert closed.value.reason.code == 1011
                assert (await bystander.call("session/list", {}))["sessions"] == []


async def test_leaving_the_gateway_closes_sockets_with_1001() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        gateway.shut_down_connections()
        with trio.fail_after(5), pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await client.answer("never")
        assert closed.value.reason.code == 1001


async def test_the_port_serves_healthz_a_placeholder_page_and_a_static_directory(
    tmp_path: Path,
) -> None:
    async with running_gateway() as gateway, httpx.AsyncClient() as http:
        base = f"http://{gateway.host}:{gateway.port}"
        assert (await http.get(f"{base}/healthz")).text == "ok\n"
        page = await http.get(f"{base}/")
        assert "later" in page.text and gateway.url in page.text
        assert (await http.post(f"{base}/healthz")).status_code == 405
        assert (await http.get(f"{base}/acp")).status_code == 426
        assert (await http.get(f"{base}/missing.js")).status_code == 404
    (tmp_path / "index.html").write_text("<h1>dashboard</h1>")
    (tmp_path / "app.js").write_text("console.log(1)")
    (tmp_path.parent / "secret.txt").write_text("no")
    async with running_gateway(static_dir=tmp_path) as gateway, httpx.AsyncClient() as http:
        base = f"http://{gateway.host}:{gateway.port}"
        assert (await http.get(f"{base}/")).text == "<h1>dashboard</h1>"
        script = await http.get(f"{base}/app.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert (await http.get(f"{base}/%2e%2e/secret.txt")).status_code == 404


async def test_initialize_advertises_the_method_table_and_limits() -> None:
    async with running_gateway() as gateway, connect(gateway, initialize=False) as client:
        result = await client.call("initialize", {"protocolVersion": 1})
        harness = result["agentCapabilities"]["_meta"]["harness"]
        assert harness["methods"] == list(METHODS)
        assert harness["limits"]["maxInflight"] == 64 and harness["epoch"] == gateway.epoch
        again = await client.request("initialize", {"protocolVersion": 1})
        assert again["error"]["code"] == -32600
        json.dumps(result)


async def test_an_unknown_member_of_harness_params_is_refused_naming_it() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        sid = await _new(client)
        typo = await client.request("_harness/log/subscribe", {"sessionId": sid, "fromseq": 0})
        error = typo["error"]
        assert error["code"] == -32602
        assert error["data"] == {"path": "/fromseq", "reason": "unknown_member"}
        assert "'fromseq'" in error["message"] and "fromSeq" in error["message"]
        nested = await client.request("_harness/sessions/list", {"filter": {"agnet": "x"}})
        assert nested["error"]["data"] == {"path": "/filter/agnet", "reason": "unknown_member"}
        for method, params in [
            ("_harness/stats", {"verbose": True}),
            ("_harness/session/state", {"sessionId": sid, "x": 1}),
            ("_harness/log/read", {"sessionId": sid, "fromSeq": 0, "max": 5}),
        ]:
            answer = await client.request(method, params)
            assert answer["error"]["data"]["reason"] == "unknown_member", method
        assert client.ws.closed is None


async def test_meta_is_allowed_everywhere_and_acp_params_ignore_members_they_do_not_know() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        sid = await _new(client)
        meta = {"traceparent": "00-80e1afed08e019fc1110464cfa66635c-7a085853722dc6d2-01"}
        await client.call("_harness/stats", {"_meta": meta})
        await client.call("_harness/session/state", {"sessionId": sid, "_meta": meta})
        # ACP reserves every name at the root of its types for later versions: a newer
        # client's members are ignored, as ACP's own SDKs ignore them.
        await client.call("session/list", {"_meta": meta, "futureField": 1})
        await client.call("session/resume", {"sessionId": sid, "cwd": "/", "additional": []})


async def test_unknown_event_types_are_refused_naming_them_and_the_known_ones() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        sid = await _new(client)
        answer = await client.request(
            "_harness/log/subscribe",
            {"sessionId": sid, "types": ["turn/end", "no/such/type", "turn/ends"]},
        )
        error = answer["error"]
        assert error["code"] == -32602
        assert error["data"]["path"] == "/types/1" and error["data"]["reason"] == "unknown_type"
        assert "'no/such/type', 'turn/ends'" in error["message"]
        assert error["data"]["known"] == list(EVENT_TYPES)
        assert "turn/start" in error["message"]
        assert await client.call(
            "_harness/log/subscribe", {"sessionId": sid, "types": ["turn/end"]}
        )


async def test_a_batched_initialize_is_refused_and_leaves_the_connection_uninitialized() -> None:
    async with running_gateway() as gateway, connect(gateway, initialize=False) as client:
        init = {"jsonrpc": "2.0", "id": "i", "method": "initialize", "params": {}}
        await client.send([{**init, "params": {"protocolVersion": 1}}])
        with trio.fail_after(10):
            refused = await client.answer("i")
            assert refused["error"]["code"] == -32600 and "batch" in refused["error"]["message"]
            before = await client.request("_harness/stats")
            assert before["error"]["code"] == -32600 and "before initialize" in str(before)
            assert "result" in await client.request("initialize", {"protocolVersion": 1})


@pytest.mark.parametrize("method", ["session/list", "_harness/sessions/list"])
@pytest.mark.parametrize("cursor", ["²", "1" * 5000, "-1", " 1", "", "0x1"])
async def test_a_cursor_that_was_not_issued_is_invalid_params_and_the_connection_stays(
    method: str, cursor: str
) -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        with trio.fail_after(10):
            answer = await client.request(method, {"cursor": cursor})
            assert answer["error"]["code"] == -32602
            assert answer["error"]["data"]["reason"] == "invalid_cursor"
            assert "result" in await client.request("_harness/stats")


async def test_log_subscriptions_and_watches_beyond_the_connections_limits_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness_methods, "MAX_SUBSCRIPTIONS", 2)
    monkeypatch.setattr(harness_methods, "MAX_WATCHES", 1)
    async with running_gateway() as gateway, connect(gateway) as client:
        with trio.fail_after(10):
            sid = await _new(client)
            subscribe = {"sessionId": sid, "fromSeq": 0}
            first = await client.call("_harness/log/subscribe", subscribe)
            await client.call("_harness/log/subscribe", subscribe)
            refused = await client.request("_harness/log/subscribe", subscribe)
            assert refused["error"]["code"] == -33003
            assert refused["error"]["data"] == {"reason": "too_many_subscriptions", "limit": 2}
            await client.call("_harness/log/unsubscribe", {"subscription": first["subscription"]})
            await client.call("_harness/log/subscribe", subscribe)  # room again
            await client.call("_harness/sessions/watch", {})
            watch = await client.request("_harness/sessions/watch", {})
            assert watch["error"]["data"] == {"reason": "too_many_watches", "limit": 1}
        limits = gateway.limits()
        assert limits["maxSubscriptions"] == 10_000 and limits["maxWatches"] == 16
