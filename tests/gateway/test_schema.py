"""Real frames in both directions validate against schema.json and against the ACP SDK's models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from acp import schema as acp_schema
from jsonschema import Draft202012Validator

from supervision.gateway.methods import METHODS
from supervision.gateway.protocol import camel
from tests.gateway.helpers import RpcClient, connect, running_gateway

SCHEMA = json.loads(
    (Path(__file__).parents[2] / "supervision" / "gateway" / "schema.json").read_text()
)
Draft202012Validator.check_schema(SCHEMA)


def _validator(*path: str) -> Draft202012Validator:
    pointer = "/".join(part.replace("~", "~0").replace("/", "~1") for part in path)
    return Draft202012Validator({"$ref": f"#/$defs/{pointer}", "$defs": SCHEMA["$defs"]})


ACP_REQUESTS = {
    "initialize": acp_schema.InitializeRequest,
    "session/new": acp_schema.NewSessionRequest,
    "session/prompt": acp_schema.PromptRequest,
    "session/load": acp_schema.LoadSessionRequest,
    "session/resume": acp_schema.ResumeSessionRequest,
    "session/list": acp_schema.ListSessionsRequest,
    "session/close": acp_schema.CloseSessionRequest,
    "session/cancel": acp_schema.CancelNotification,
}
ACP_RESULTS = {
    "initialize": acp_schema.InitializeResponse,
    "session/new": acp_schema.NewSessionResponse,
    "session/prompt": acp_schema.PromptResponse,
    "session/resume": acp_schema.ResumeSessionResponse,
    "session/list": acp_schema.ListSessionsResponse,
    "session/close": acp_schema.CloseSessionResponse,
}


class Recorder:
    """Sends requests through an `RpcClient` and records (method, params, answer)."""

    def __init__(self, client: RpcClient) -> None:
        self.client = client
        self.calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    async def __call__(self, method: str, params: dict[str, Any]) -> Any:
        answer = await self.client.request(method, params)
        self.calls.append((method, params, answer))
        assert "result" in answer, (method, answer)
        return answer["result"]


async def _exercise(client: RpcClient) -> Recorder:
    call = Recorder(client)
    sid = (await call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
    await call("_harness/sessions/watch", {})
    await call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0})
    await call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0, "batch": True})
    await call("_harness/log/subscribe", {"sessionId": sid, "fromSeq": 0, "merge": True})
    await call("_harness/log/subscribe", {"sessionId": sid, "merge": True})
    await call(
        "session/prompt",
        {"sessionId": sid, "prompt": [{"type": "text", "text": 'call list_files {"path": "."}'}]},
    )
    await call("_harness/sessions/list", {"limit": 10})
    await call("_harness/log/read", {"sessionId": sid, "fromSeq": 0, "limit": 5})
    await call("_harness/session/state", {"sessionId": sid})
    await call(
        "_harness/session/send",
        {"sessionId": sid, "content": [{"type": "text", "text": "hi"}], "placement": "inject"},
    )
    await call("_harness/session/cancel", {"sessionId": sid})
    await call("_harness/prompt/inspect", {"sessionId": sid})
    await call("_harness/request/rebuild", {"sessionId": sid, "turn": 0, "step": 0})
    await call("_harness/stats", {})
    await call("_harness/supervision/tree", {})
    await call("session/list", {})
    await call("session/resume", {"sessionId": sid, "cwd": "/", "mcpServers": []})
    await call("session/load", {"sessionId": sid, "cwd": "/", "mcpServers": []})
    path = (await call("_harness/supervision/tree", {}))["tree"]["children"][0]["path"]
    await call("_harness/supervision/restart", {"path": path})
    subscription = (await call("_harness/log/subscribe", {"sessionId": sid}))["subscription"]
    await call("_harness/log/unsubscribe", {"subscription": subscription})
    await call("session/close", {"sessionId": sid})
    return call


@pytest.fixture
async def exercised() -> tuple[Recorder, list[dict[str, Any]]]:
    async with running_gateway() as gateway, connect(gateway) as client:
        with trio.fail_after(30):
            recorder = await _exercise(client)
            await client.wait_for(lambda n: n["method"] == "_harness/log/caughtUp")
        return recorder, list(client.notifications)


async def test_every_harness_method_was_exercised(
    exercised: tuple[Recorder, list[dict[str, Any]]],
) -> None:
    recorder, notifications = exercised
    harness = {name for name in METHODS if name.startswith("_harness/")}
    assert harness <= {method for method, _, _ in recorder.calls}
    kinds = {n["method"] for n in notifications}
    assert {
        "_harness/log/event",
        "_harness/log/events",
        "_harness/log/merged",
        "_harness/log/caughtUp",
        "_harness/sessions/changed",
    } <= kinds
    assert "_harness/supervision/event" in kinds


async def test_harness_frames_in_both_directions_match_the_schema(
    exercised: tuple[Recorder, list[dict[str, Any]]],
) -> None:
    recorder, notifications = exercised
    for method, params, answer in recorder.calls:
        if method.startswith("_harness/"):
            _validator("methods", method, "params").validate(params)
            _validator("methods", method, "result").validate(answer["result"])
    for notification in notifications:
        if notification["method"].startswith("_harness/"):
            _validator("notifications", notification["method"]).validate(notification["params"])


async def test_acp_frames_in_both_directions_match_the_sdk_models(
    exercised: tuple[Recorder, list[dict[str, Any]]],
) -> None:
    recorder, notifications = exercised
    for method, params, answer in recorder.calls:
        if method in ACP_REQUESTS:
            ACP_REQUESTS[method].model_validate(params)
        if method in ACP_RESULTS:
            ACP_RESULTS[method].model_validate(answer["result"])
        if method == "session/load":
            assert answer["result"] is None
    updates = [n for n in notifications if n["method"] == "session/update"]
    assert updates
    for update in updates:
        acp_schema.SessionNotification.model_validate(update["params"])


async def test_error_answers_match_the_schema() -> None:
    async with running_gateway() as gateway, connect(gateway) as client:
        answers = [
            await client.request("_harness/log/read", {"sessionId": "nope", "fromSeq": 0}),
            await client.request("_harness/log/read", {"sessionId": 3}),
            await client.request("nope/nope", {}),
        ]
    for answer in answers:
        _validator("Error").validate(answer["error"])
    assert [a["error"]["code"] for a in answers] == [-32002, -32602, -32601]
    assert answers[1]["error"]["data"]["path"] == "/sessionId"


def test_every_harness_params_class_has_exactly_the_schemas_members() -> None:
    for name, method in METHODS.items():
        if name.startswith("_harness/"):
            members = {camel(a.alias or a.name) for a in attrs.fields(method.params)}
            schema = SCHEMA["$defs"]["methods"][name]["params"]
            assert members == set(schema.get("properties", {})), name
            assert schema["additionalProperties"] is False, name
