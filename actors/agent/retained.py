"""Following the newest message of one plugin that a session's surface still retains.

A plugin (or the runtime-context projection) never remembers what it
*offered*; it reads back what the surface *retains*. A message an outer
listener dropped, a step that was rejected, or a snapshot a compaction
replaced therefore never counts as delivered.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from actors.messages import Message, PluginSource
from actors.session.events import Event, UserMessage
from actors.session.session import Session

SNAPSHOT_FORM = "snapshot"
"""The `form` of a plugin message that states the plugin's whole current context."""


@attrs.define(eq=False)
class RetainedPluginMessage:
    """Follows the newest message of one plugin still on a session's surface.

    `catch_up(session)` reads only the events appended since its last call,
    so following costs O(new events) per step; the surface is rescanned only
    when a replacement (compaction) removed the retained message.
    """

    plugin: str
    _message: Message | None = attrs.field(default=None, init=False)
    _seq: int | None = attrs.field(default=None, init=False)
    _seen: int = attrs.field(default=0, init=False)

    @property
    def message(self) -> Message | None:
        """The newest retained message of the plugin, as of the last `catch_up`."""
        return self._message

    @property
    def snapshot_text(self) -> str | None:
        """The retained message's text when it is a snapshot; None when absent or a clear marker."""
        message = self._message
        if message is None or not isinstance(message.source, PluginSource):
            return None
        return message.text if message.source.form == SNAPSHOT_FORM else None

    def catch_up(self, session: Session) -> Sequence[Event]:
        """Observe the events appended to `session` since the last call, and return them."""
        events = session.events_since(self._seen)
        self._seen += len(events)
        rescan = False
        for event in events:
            if event.surface_op == "replace":
                rescan = rescan or self._seq in (event.source_event_seqs or ())
            elif isinstance(event.data, UserMessage) and self._owns(event.data):
                self._message = event.data.to_message()
                self._seq = event.seq
        if rescan:
            self._rescan(session.surface_events())
        return events

    def _owns(self, data: UserMessage) -> bool:
        source = data.source
        return isinstance(source, PluginSource) and source.plugin == self.plugin

    def _rescan(self, surface: Sequence[Event]) -> None:
        self._message = None
        self._seq = None
        for event in reversed(surface):
            if isinstance(event.data, UserMessage) and self._owns(event.data):
                self._message = event.data.to_message()
                self._seq = event.seq
                return
