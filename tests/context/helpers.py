"""Shared helpers for context-plugin tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.agent import Agent, Enter, Reject, StepProposal, Tool
from actors.agent.decisions import PreStepNext, StepDecision
from actors.messages import Message, PluginSource, UserSource
from actors.session import Session, SessionStore
from actors.session.events import AssistantMessage, UserMessage


async def run_turn(agent: Agent, text: str) -> None:
    """Send `text` as a follow-up and wait until the agent is idle again."""
    agent.followup(text)
    await agent.when_idle()


def entered(session: Session) -> list[Message]:
    """Every user/message the session logged, as messages, in order."""
    return [
        event.data.to_message() for event in session.events if isinstance(event.data, UserMessage)
    ]


def from_plugin(messages: Sequence[Message], plugin: str) -> list[Message]:
    """The messages contributed by `plugin`, in order."""
    return [m for m in messages if isinstance(m.source, PluginSource) and m.source.plugin == plugin]


def labels(messages: Sequence[Message]) -> list[str]:
    """A label per message: "user:<text>", the contributing plugin, "assistant" or "tool"."""
    out: list[str] = []
    for message in messages:
        source = message.source
        if isinstance(source, PluginSource):
            out.append(source.plugin)
        elif isinstance(source, UserSource):
            out.append(f"user:{message.text}")
        else:
            out.append("assistant" if message.role == "assistant" else "tool")
    return out


def tool(name: str, result: str = "ok") -> Tool:
    """A tool that ignores its arguments and returns `result`."""

    async def execute(arguments: dict[str, Any] | str, call: object) -> str:
        return result

    return Tool(
        name=name, description=f"the {name} tool", parameters={"type": "object"}, execute=execute
    )


def reject_turns(*turns: int) -> Any:
    """A pre-step listener rejecting every step of the given turns."""

    async def listener(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        if proposal.turn in turns:
            return Reject(reason="test")
        return await next()

    return listener


def empty_turns(*turns: int) -> Any:
    """A pre-step listener entering nothing on the given turns (so no step opens)."""

    async def listener(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        if proposal.turn in turns:
            return Enter(messages=[])
        return await next()

    return listener


async def make_session(
    store: SessionStore, session_id: str, exchanges: Sequence[tuple[str, str]]
) -> Session:
    """A stored session holding one user/assistant message pair per exchange."""
    session = await Session.create(store, session_id)
    for turn, (question, answer) in enumerate(exchanges):
        await session.append(UserMessage(content=question, source=UserSource()))
        await session.append(
            AssistantMessage(turn=turn, step=0, message=Message(role="assistant", content=answer))
        )
    await session.flush()
    return session


def sections(message: Message) -> tuple[str, ...] | None:
    """The `sections` provenance of a plugin message."""
    assert isinstance(message.source, PluginSource), message
    return message.source.sections


def veto_turns(*turns: int) -> Any:
    """A pre-step listener that lets the inner listeners decide, then rejects the given turns."""

    async def listener(proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        return Reject(reason="vetoed") if proposal.turn in turns else decision

    return listener
