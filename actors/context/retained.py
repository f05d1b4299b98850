"""What the pre-step context plugins share: step admission and their retained messages.

A plugin never remembers what it *offered*; it reads back what the session
surface *retains* (`RetainedPluginMessage`, shared with the runtime-context
projection), so a dropped, rejected or compacted message is offered again.
"""

from __future__ import annotations

from actors.agent import Enter, StepProposal
from actors.agent.decisions import StepDecision
from actors.agent.retained import SNAPSHOT_FORM as SNAPSHOT_FORM
from actors.agent.retained import RetainedPluginMessage as RetainedPluginMessage
from actors.messages import Message, PluginSource


def entered_step(proposal: StepProposal, decision: StepDecision) -> Enter | None:
    """`decision` when the loop will open the step for it, else None.

    A `Reject` never opens a step, and an empty `Enter` on a turn's first
    step ends the turn without one; a plugin must not add a message then,
    or it would open a step that nothing asked for.
    """
    if not isinstance(decision, Enter):
        return None
    if proposal.step == 0 and not decision.messages:
        return None
    return decision


def plugin_of(message: Message) -> str | None:
    """The plugin that contributed `message`, or None for any other source."""
    source = message.source
    return source.plugin if isinstance(source, PluginSource) else None
