"""Auth at the handshake, scopes per request, session filters that leak nothing."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from supervision.gateway import Gateway, Token
from supervision.gateway.auth import Denial, authenticate, bearer_subprotocol, match_token
from tests.gateway.helpers import ALL, SECRET, connect, running_gateway

OBSERVER = Token(secret="observer-secret", scopes=["observe"], name="observer")
OWNER = Token(secret="owner-secret", scopes=["observe", "control"], sessions="own", name="owner")
TOKENS = (ALL, OBSERVER, OWNER)


async def _rejected(gateway: Gateway, headers: list[tuple[str, str]], path: str = "/acp") -> int:
    """Send a websocket upgrade by hand; return the HTTP status that refused it."""
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {gateway.host}:{gateway.port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers),
    ]
    async with await trio.open_tcp_stream(gateway.host, gateway.port) as stream:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some():
                answer += chunk
    for token in TOKENS:
        assert token.secret.encode() not in answer and token.name.encode() not in answer
    return int(answer.split(b" ", 2)[1])


async def test_no_token_is_refused_with_401() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        assert await _rejected(gateway, []) == 401


async def test_a_wrong_token_is_refused_with_401() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        assert await _rejected(gateway, [("Authorization", "Bearer nope")]) == 401


async def test_a_token_in_the_query_string_is_not_accepted() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        assert await _rejected(gateway, [], path=f"/acp?token={SECRET}") == 401
        assert await _rejected(gateway, [], path=f"/acp?access_token={SECRET}") == 401


async def test_a_foreign_origin_is_refused_with_403_even_with_a_valid_token() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        headers = [("Authorization", f"Bearer {SECRET}"), ("Origin", "http://evil.example")]
        assert await _rejected(gateway, headers) == 403


async def test_the_gateways_own_origin_is_allowed() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        origin = f"http://{gateway.host}:{gateway.port}"
        headers = [("Authorization", f"Bearer {SECRET}"), ("Origin", origin)]
        async with connect(gateway, headers=headers) as client:
            assert (await client.call("_harness/stats", {}))["epoch"] == gateway.epoch


async def test_a_browser_authenticates_with_the_bearer_subprotocol() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        offered = ["harness.v1", bearer_subprotocol(SECRET)]
        async with connect(gateway, headers=[], subprotocols=offered) as client:
            assert client.ws.subprotocol == "harness.v1"


async def test_a_missing_scope_is_forbidden() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        headers = [("Authorization", f"Bearer {OBSERVER.secret}")]
        async with connect(gateway, headers=headers) as client:
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            assert answer["error"]["code"] == -33001
            assert answer["error"]["data"]["required"] == "control"
            assert "control" in answer["error"]["message"]
            # observe methods work
            await client.call("_harness/sessions/list", {})


async def test_a_session_outside_the_filter_is_answered_as_not_found() -> None:
    async with running_gateway(tokens=TOKENS) as gateway:
        with trio.fail_after(10):
            async with connect(gateway) as admin:
                theirs = (await admin.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
            headers = [("Authorization", f"Bearer {OWNER.secret}")]
            async with connect(gateway, headers=headers) as owner:
                mine = (await owner.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                listed = await owner.call("_harness/sessions/list", {})
                assert [s["sessionId"] for s in listed["sessions"]] == [mine]
                foreign = await owner.request("_harness/session/state", {"sessionId": theirs})
                missing = await owner.request("_harness/session/state", {"sessionId": "nope"})
                assert foreign["error"]["code"] == missing["error"]["code"] == -32002
                assert theirs not in str(foreign["error"]).replace(theirs, "", 1)
                for method in ("_harness/log/subscribe", "_harness/log/read"):
                    params = {"sessionId": theirs, "fromSeq": 0}
                    assert (await owner.request(method, params))["error"]["code"] == -32002
                answer = await owner.request(
                    "session/prompt",
                    {"sessionId": theirs, "prompt": [{"type": "text", "text": "hi"}]},
                )
                assert answer["error"]["code"] == -32002
                assert (await owner.call("_harness/session/state", {"sessionId": mine}))[
                    "status"
                ] == "idle"


async def test_requests_before_initialize_are_refused() -> None:
    async with running_gateway(tokens=TOKENS) as gateway, connect(gateway, initialize=False) as c:
        answer = await c.request("_harness/stats", {})
        assert answer["error"]["code"] == -32600
        assert "initialize" in answer["error"]["message"]


def test_token_matching_compares_every_token() -> None:
    assert match_token(SECRET, TOKENS) is ALL
    assert match_token("owner-secret", TOKENS) is OWNER
    assert match_token("owner-secre", TOKENS) is None
    assert match_token("", TOKENS) is None


LISTED = Token(secret="listed-secret", scopes=["observe"], sessions=("s-listed",), name="listed")
ELSEWHERE = Token(secret="elsewhere-secret", scopes=["observe"], sessions=("nope",), name="else")
CONTROL_ONLY = Token(secret="control-secret", scopes=["control"], name="control-only")


async def test_a_supervision_event_reaches_only_tokens_that_may_observe_its_session() -> None:
    tokens = (*TOKENS, LISTED, ELSEWHERE, CONTROL_ONLY)
    with trio.fail_after(30):
        async with running_gateway(tokens=tokens) as gateway, AsyncExitStack() as stack:
            await gateway.directory.create(profile="default", owner=None, session_id="s-listed")
            clients = {
                token.name: await stack.enter_async_context(
                    connect(gateway, headers=[("Authorization", f"Bearer {token.secret}")])
                )
                for token in tokens
            }
            path = f"{gateway.runtime.name}/agent:s-listed"
            await clients[ALL.name].call("_harness/supervision/restart", {"path": path})
            # A round trip on every connection: an event queued for it came before its answer.
            for client in clients.values():
                await client.request("session/resume", {"sessionId": "missing"})
    events = {
        name: [n for n in client.notifications if n["method"] == "_harness/supervision/event"]
        for name, client in clients.items()
    }
    assert {name for name, got in events.items() if got} == {ALL.name, OBSERVER.name, LISTED.name}
    assert all(e["params"]["path"] == path for got in events.values() for e in got)


OTHER_OWNER = Token(
    secret="other-owner-secret", scopes=["observe", "control"], sessions="own", name="other"
)
OPERATOR = Token(secret="operator-secret", scopes=["observe", "control"], name="operator")


def _bearer(token: Token) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token.secret}")]


async def test_own_covers_the_sessions_a_token_created_and_their_subagents() -> None:
    async with running_gateway(tokens=(*TOKENS, OTHER_OWNER)) as gateway:
        with trio.fail_after(30):
            async with (
                connect(gateway, headers=_bearer(OWNER)) as owner,
                connect(gateway, headers=_bearer(OTHER_OWNER)) as other,
            ):
                mine = (await owner.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                child = await gateway.directory.create(profile="default", owner=None, parent=mine)
                grandchild = await gateway.directory.create(
                    profile="default", owner=None, parent=child.session.id
                )
                family = [mine, child.session.id, grandchild.session.id]
                listed = await owner.call("_harness/sessions/list", {})
                assert [s["sessionId"] for s in listed["sessions"]] == family
                for sid in family:
                    state = await owner.call("_harness/session/state", {"sessionId": sid})
                    assert state["status"] == "idle"
                    refused = await other.request("_harness/session/state", {"sessionId": sid})
                    assert refused["error"]["code"] == -32002
                assert (await other.call("_harness/sessions/list", {}))["sessions"] == []


async def test_a_list_of_ids_sees_exactly_those_sessions() -> None:
    async with running_gateway(tokens=(*TOKENS, LISTED)) as gateway:
        with trio.fail_after(30):
            await gateway.directory.create(profile="default", owner=None, session_id="s-listed")
            hidden = (await gateway.directory.create(profile="default", owner=None)).session.id
            async with connect(gateway, headers=_bearer(LISTED)) as client:
                listed = await client.call("_harness/sessions/list", {})
                assert [s["sessionId"] for s in listed["sessions"]] == ["s-listed"]
                acp = await client.call("session/list", {})
                assert [row["sessionId"] for row in acp["sessions"]] == ["s-listed"]
                await client.call("_harness/log/read", {"sessionId": "s-listed", "fromSeq": 0})
                refused = await client.request(
                    "_harness/log/read", {"sessionId": hidden, "fromSeq": 0}
                )
                assert refused["error"]["code"] == -32002
                tree = (await client.call("_harness/supervision/tree", {}))["tree"]
                assert [c["path"].rpartition(":")[2] for c in tree["children"]] == ["s-listed"]


async def test_restarting_an_agent_needs_admin_and_increments_its_incarnation() -> None:
    async with running_gateway(tokens=(*TOKENS, OPERATOR)) as gateway:
        with trio.fail_after(30):
            async with (
                connect(gateway, headers=_bearer(OPERATOR)) as operator,
                connect(gateway) as admin,
            ):
                sid = (await operator.call("session/new", {"cwd": "/", "mcpServers": []}))[
                    "sessionId"
                ]
                path = f"{gateway.runtime.name}/agent:{sid}"
                refused = await operator.request("_harness/supervision/restart", {"path": path})
                assert refused["error"]["code"] == -33001
                assert refused["error"]["data"]["required"] == "admin"
                state = await admin.call("_harness/session/state", {"sessionId": sid})
                assert state["supervisor"] == {"path": path, "incarnation": 0}
                for incarnation in (1, 2):
                    restarted = await admin.call("_harness/supervision/restart", {"path": path})
                    assert restarted == {"path": path, "incarnation": incarnation}
                    state = await admin.call("_harness/session/state", {"sessionId": sid})
                    assert state["supervisor"]["incarnation"] == incarnation
                missing = await admin.request(
                    "_harness/supervision/restart", {"path": f"{gateway.runtime.name}/agent:nope"}
                )
                assert missing["error"]["code"] == -32002


async def test_a_token_with_non_ascii_characters_authenticates_through_the_header() -> None:
    token = Token(secret="sécret-über-ключ", name="unicode")
    async with running_gateway(tokens=(token,)) as gateway:
        headers = [("Authorization", f"Bearer {token.secret}")]  # sent as UTF-8
        async with connect(gateway, headers=headers) as client:
            assert (await client.call("_harness/stats", {}))["epoch"] == gateway.epoch


def test_a_bearer_header_that_is_not_utf8_is_refused_naming_why() -> None:
    verdict = authenticate([(b"authorization", b"Bearer \xff\xfe")], [], TOKENS, ())
    assert verdict == Denial(status=401, reason="the bearer token is not valid UTF-8")
