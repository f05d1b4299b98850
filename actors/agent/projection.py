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

from actors.messages import RUNTIME_CONTEXT_PLUGIN, Message, PluginSource
from actors.prompt.types import AssembledContext
from actors.session.events import Event, UserMessage
from actors.session.session import Session

SNAPSHOT_FORM = "snapshot"
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

    `catch_up(session)` reads the events appended since its last call
    (whoever appended them), so the projection keeps the newest retained
    runtime-context text at O(new events) per step and rescans the surface
    only after a replacement (compaction) removed the retained snapshot.
    """

    _retained: str | None = attrs.field(default=None, init=False)
    _retained_seq: int | None = attrs.field(default=None, init=False)
    _seen: int = attrs.field(default=0, init=False)

    def catch_up(self, session: Session) -> None:
        """Observe every event appended to `session` since the last call."""
        events = session.events_since(self._seen)
        self._seen += len(events)
        for event in events:
            if self._observe(event):
                self.reset(session.surface_events())

    def reset(self, surface: Sequence[Event]) -> None:
        """Recompute the retained snapshot from the current surface events."""
        self._retained = None
        self._retained_seq = None
        for event in reversed(surface):
            data = event.data
            if isinstance(data, UserMessage) and is_runtime_context(data.to_message()):
                self._remember(event, data)
                return

    def _observe(self, event: Event) -> bool:
        """Track a newly appended event; returns True when a rescan is needed."""
        data = event.data
        if event.surface_op == "replace":
            return self._retained_seq is not None and self._retained_seq in (
                event.source_event_seqs or ()
            )
        if isinstance(data, UserMessage) and is_runtime_context(data.to_message()):
            self._remember(event, data)
        return False

    def propose(self, text: str, sections: Sequence[AssembledContext]) -> Message | None:
        """The message this step should add, or None when history already says it."""
        if text:
            if text == self._retained:
                return None
            return snapshot_message(text, sections)
        if self._retained:
            return tombstone_message()
        return None

    def _remember(self, event: Event, data: UserMessage) -> None:
        message = data.to_message()
        source = message.source
        is_snapshot = isinstance(source, PluginSource) and source.form == SNAPSHOT_FORM
        self._retained = message.text if is_snapshot else ""
        self._retained_seq = event.seq
