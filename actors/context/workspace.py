"""Workspace instructions: `AGENTS.md` files from the workspace root down to touched paths."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import PurePath

import attrs
import trio

from actors.agent import Agent, Enter, StepProposal
from actors.agent.decisions import PreStepNext, StepDecision
from actors.agent.projection import is_runtime_context
from actors.agent.tools import parse_arguments
from actors.context.errors import ContextPluginError
from actors.context.retained import SNAPSHOT_FORM, RetainedPluginMessage, entered_step
from actors.messages import Message, PluginSource
from actors.scope import Registration
from actors.session import Session
from actors.session.events import ToolCallRequested

WORKSPACE_PLUGIN = "workspace-instructions"
"""The `plugin` name on workspace-instruction messages."""
INSTRUCTIONS_PREAMBLE = (
    "Workspace instructions from AGENTS.md files, the workspace root first; a deeper file "
    "refines the ones above it. This message supersedes earlier workspace-instruction messages."
)
CLEARED_TEXT = (
    "Workspace instructions: no AGENTS.md file applies any more; earlier workspace-instruction "
    "messages no longer apply."
)
_ROOT = PurePath()


def _absolute_root(value: str | os.PathLike[str]) -> PurePath:
    root = PurePath(value)
    if not root.is_absolute():
        raise ContextPluginError(
            "workspace instructions: the workspace root must be an absolute path, "
            f"got {str(root)!r}"
        )
    return PurePath(os.path.normpath(root))


def _check_positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ContextPluginError(
            f"workspace instructions: {attribute.name} must be a positive number of characters, "
            f"got {value!r}"
        )


@attrs.frozen(kw_only=True)
class InstructionFile:
    """One instruction file as read: its path relative to the root and its text.

    `text` holds at most `max_file_chars + 1` characters of the file, so that
    composing can tell there was more; `error` says why a file that exists
    could not be read.
    """

    label: str
    text: str = ""
    error: str | None = None


@attrs.frozen(kw_only=True)
class WorkspaceInstructions:
    """`AGENTS.md` files from the workspace root down to the directories tools touched.

    Attributes:
        root: the absolute workspace root; its own file always applies.
        filename: the instruction file looked for in each directory.
        path_keys: argument names of a tool call whose string (or list of
            strings) values are paths; a path inside the root adds its
            directory (the path itself when it is a directory) and every
            directory between it and the root.
        max_file_chars: the most characters of one file shown.
        max_total_chars: the most characters of file text in one message.

    Raises:
        ContextPluginError: a relative root or a non-positive bound.
    """

    root: PurePath = attrs.field(converter=_absolute_root)
    filename: str = "AGENTS.md"
    path_keys: frozenset[str] = attrs.field(
        default=frozenset({"path", "file_path"}), converter=frozenset
    )
    max_file_chars: int = attrs.field(default=8_000, validator=_check_positive)
    max_total_chars: int = attrs.field(default=24_000, validator=_check_positive)

    def install(self, agent: Agent) -> Registration:
        """Keep `agent`'s model told the instructions that apply, as a pre-step listener.

        On every step that runs, the listener reads the instruction files of
        the root and of every directory touched by a tool call so far (paths
        are read from the session's `tool/call` events), composes them root
        first, and enters one message (source plugin
        "workspace-instructions", form "snapshot", `sections` the files'
        relative paths) only when that composition differs from the one the
        session retains; when every file disappeared it enters a clear
        marker instead. The message goes right after the claimed batch and
        before the runtime-context snapshot. Nothing is entered for a step
        that will not run (a rejection, or an empty first step), so the
        instructions stay pending for the next step that does. Disposing the
        returned registration removes the listener.
        """
        state = _WorkspaceState(
            config=self,
            session=agent.session,
            retained=RetainedPluginMessage(plugin=WORKSPACE_PLUGIN),
        )
        return agent.on_pre_step(state.pre_step)

    def paths_of(self, arguments: str) -> list[PurePath]:
        """The paths (relative to the root) named by a tool call's raw JSON arguments.

        Only values under `path_keys` count; paths outside the root are left out.
        """
        parsed = parse_arguments(arguments)
        if not isinstance(parsed, dict):
            return []
        found: list[PurePath] = []
        for key in sorted(self.path_keys & parsed.keys()):
            value = parsed[key]
            values = value if isinstance(value, list) else [value]
            for item in values:
                if isinstance(item, str) and item:
                    relative = self._relative(item)
                    if relative is not None:
                        found.append(relative)
        return found

    def _relative(self, value: str) -> PurePath | None:
        path = PurePath(os.path.normpath(self.root / value))
        if not path.is_relative_to(self.root):
            return None
        return path.relative_to(self.root)

    async def read(self, directory: PurePath) -> InstructionFile | None:
        """The instruction file of `directory` (relative to the root), None when there is none.

        Reads at most `max_file_chars + 1` characters in a worker thread;
        undecodable bytes are replaced. A file that exists but cannot be read
        yields an `InstructionFile` whose `error` says why.
        """
        relative = directory / self.filename
        path = trio.Path(self.root / relative)
        try:
            async with await path.open(encoding="utf-8", errors="replace") as file:
                text = await file.read(self.max_file_chars + 1)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            return InstructionFile(label=relative.as_posix(), error=f"{type(exc).__name__}: {exc}")
        if not text.strip():
            return None
        return InstructionFile(label=relative.as_posix(), text=text)

    def compose(self, files: Sequence[InstructionFile]) -> str:
        """The message text for `files` (in order), "" when there are none.

        Each file is cut to `max_file_chars` and all together to
        `max_total_chars`; every cut and every file left out is stated in
        the text, never silent.
        """
        if not files:
            return ""
        parts = [INSTRUCTIONS_PREAMBLE]
        remaining = self.max_total_chars
        for file in files:
            if file.error is not None:
                parts.append(f"## {file.label}\n\n[{file.label} could not be read: {file.error}]")
                continue
            if remaining == 0:
                parts.append(
                    f"## {file.label}\n\n[{file.label} is left out: the {self.max_total_chars}-"
                    "character limit for all workspace instructions is used up]"
                )
                continue
            body = file.text[: self.max_file_chars]
            note = ""
            if len(file.text) > self.max_file_chars:
                note = (
                    f"\n\n[{file.label} is truncated: only its first {self.max_file_chars} "
                    "characters are shown (the limit per file)]"
                )
            if len(body) > remaining:
                body = body[:remaining]
                note = (
                    f"\n\n[{file.label} is truncated: only its first {remaining} characters are "
                    f"shown (the {self.max_total_chars}-character limit for all workspace "
                    "instructions)]"
                )
            remaining -= len(body)
            parts.append(f"## {file.label}\n\n{body}{note}")
        return "\n\n".join(parts)


def _ancestry(directory: PurePath) -> Iterable[PurePath]:
    yield directory
    yield from directory.parents


@attrs.define(eq=False)
class _WorkspaceState:
    """One installation's touched directories and view of the retained instructions."""

    config: WorkspaceInstructions
    session: Session
    retained: RetainedPluginMessage
    _directories: set[PurePath] = attrs.field(factory=lambda: {_ROOT}, init=False)

    async def pre_step(self, proposal: StepProposal, next: PreStepNext) -> StepDecision:
        decision = await next()
        entered = entered_step(proposal, decision)
        if entered is None:
            return decision
        for event in self.retained.catch_up(self.session):
            if isinstance(event.data, ToolCallRequested):
                for path in self.config.paths_of(event.data.arguments):
                    await self._touch(path)
        files = [
            file
            for directory in sorted(self._directories, key=lambda d: d.parts)
            if (file := await self.config.read(directory)) is not None
        ]
        message = self._message(files)
        if message is None:
            return decision
        messages = list(entered.messages)
        messages.insert(_position(messages, proposal), message)
        return Enter(messages=messages)

    async def _touch(self, path: PurePath) -> None:
        is_directory = await trio.Path(self.config.root / path).is_dir()
        self._directories.update(_ancestry(path if is_directory else path.parent))

    def _message(self, files: Sequence[InstructionFile]) -> Message | None:
        text = self.config.compose(files)
        retained = self.retained.snapshot_text
        if text:
            if text == retained:
                return None
            labels = tuple(file.label for file in files)
            return Message.user(
                text, PluginSource(plugin=WORKSPACE_PLUGIN, form=SNAPSHOT_FORM, sections=labels)
            )
        if retained:
            return Message.user(CLEARED_TEXT, PluginSource(plugin=WORKSPACE_PLUGIN))
        return None


def _position(messages: Sequence[Message], proposal: StepProposal) -> int:
    """Right after the last claimed message, else before the runtime context, else first."""
    claimed = [
        index
        for index, message in enumerate(messages)
        if any(message is mine for mine in proposal.messages)
    ]
    if claimed:
        return claimed[-1] + 1
    for index, message in enumerate(messages):
        if is_runtime_context(message):
            return index
    return 0
