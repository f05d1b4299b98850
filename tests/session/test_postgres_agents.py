"""Agents on a shared `PostgresStore`: one writer per session across store objects (nodes).

Each `PostgresStore` object stands for a node process; they share one
database. A lease is made to look abandoned by expiring it in the database,
as a stalled or dead node's would.
"""

from __future__ import annotations

import psycopg
import pytest
import trio

from actors.agent import open_agent
from actors.prompt import SystemPrompt
from actors.providers.scripted import Reply, ScriptedProvider
from actors.session import PostgresStore, SessionBusyError, SessionFencedError
from actors.session.events import TurnEnd


def expire_lease(dsn: str, session_id: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            "UPDATE harness_leases SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE session_id = %s",
            (session_id,),
        )


async def turn_end_kinds(dsn: str, session_id: str) -> list[str]:
    events = await PostgresStore(dsn).load(session_id)
    return [e.data.reason.kind for e in events if isinstance(e.data, TurnEnd)]


async def test_a_second_node_is_refused_before_it_accepts_input(postgres_dsn: str) -> None:
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text("a")]),
        store=PostgresStore(postgres_dsn),
        session_id="s",
    ) as first:
        with pytest.raises(SessionBusyError, match=r"session 's' is busy.*pid \d+"):
            async with open_agent(
                system_prompt=SystemPrompt(),
                provider=ScriptedProvider([]),
                store=PostgresStore(postgres_dsn),
                session_id="s",
            ):
                raise AssertionError("the second writer must not get an agent")
        first.followup("still mine")
        await first.when_idle()
    async with open_agent(
        system_prompt=SystemPrompt(),
        provider=ScriptedProvider([Reply.text("b")]),
        store=PostgresStore(postgres_dsn),
        session_id="s",
    ) as after:
        after.followup("released on exit, so another node opens it at once")
        await after.when_idle()
    assert await turn_end_kinds(postgres_dsn, "s") == ["completed", "completed"]


async def test_a_session_taken_over_fails_alone_and_the_nodes_other_agents_go_on(
    postgres_dsn: str,
) -> None:
    store = PostgresStore(postgres_dsn, lease_ttl=0.3)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        async with open_agent(
            system_prompt=SystemPrompt(),
            provider=ScriptedProvider([Reply.text("x"), Reply.text("y")]),
            store=store,
            session_id="healthy",
        ) as healthy:
            with pytest.raises(SessionFencedError):
                async with open_agent(
                    system_prompt=SystemPrompt(),
                    provider=ScriptedProvider([Reply.text("never")]),
                    store=store,
                    session_id="victim",
                ) as victim:
                    expire_lease(postgres_dsn, "victim")
                    await PostgresStore(postgres_dsn).acquire_lease("victim", owner="other node")
                    for _ in range(1000):  # renewals run every 0.1 s; one finds out
                        if store.statistics().broken_sessions:
                            break
                        await trio.sleep(0.01)
                    await victim.session.flush()
            healthy.followup("one")
            await healthy.when_idle()
            healthy.followup("two")
            await healthy.when_idle()
        nursery.cancel_scope.cancel()
    assert await turn_end_kinds(postgres_dsn, "healthy") == ["completed", "completed"]
