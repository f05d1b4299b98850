"""Runtime-context projection: volatile facts as append-only user-role snapshots.

The projection never writes anything itself. Each step it compares the
rendered runtime context with the snapshot still retained on the session
surface and proposes a message only when they differ: a full snapshot when
there is context, a tombstone when context disappeared. The proposal is
committed only if the step's final pre-step decision enters it, so the
retained state is always read back from the surface.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from actors.agent.retained import SNAPSHOT_FORM, RetainedPluginMessage
from actors.messages import RUNTIME_CONTEXT_PLUGIN, Message, PluginSource
from actors.prompt.types import AssembledContext
from actors.session.session import Session

TOMBSTONE_TEXT = "Current runtime context: none. Earlier runtime-context snapshots no longer apply."


def is_runtime_context(message: Message) -> bool:
    """True for runtime-context snapshot and tombstone messages."""
    source = message.source
    return isinstance(source, PluginSource) and source.plugin == RUNTIME_CONTEXT_PLUGIN


def snapshot_message(text: str, sections: Sequence[AssembledContext]) -> Message:
    """A full runtime-context snapshot with named-section provenance."""
    return Message.user(
        text,
        PluginSource(
            plugin=RUNTIME_CONTEXT_PLUGIN,
            form=SNAPSHOT_FORM,
            sections=tuple(section.name for section in sections),
        ),
    )


def tombstone_message() -> Message:
    """The marker that earlier snapshots no longer apply."""
    return Message.user(TOMBSTONE_TEXT, PluginSource(plugin=RUNTIME_CONTEXT_PLUGIN))


@attrs.define(eq=False)
class RuntimeContextProjection:
    """Decides, per step, whether the runtime context needs a new message.

    It follows the newest runtime-context message the surface retains
    (`catch_up(session)` reads only the events appended since its last call,
    whoever appended them), so a step costs O(new events), and a compaction
    that removed the retained snapshot makes the next step re-assert it.
    """

    _retained: RetainedPluginMessage = attrs.field(
        factory=lambda: RetainedPluginMessage(plugin=RUNTIME_CONTEXT_PLUGIN), init=False
    )

    def catch_up(self, session: Session) -> None:
        """Observe every event appended to `session` since the last call."""
        self._retained.catch_up(session)

    def propose(self, text: str, sections: Sequence[AssembledContext]) -> Message | None:
        """The message this step should add, or None when history already says it."""
        retained = self._retained.snapshot_text
        if text:
            return None if text == retained else snapshot_message(text, sections)
        return tombstone_message() if retained else None
