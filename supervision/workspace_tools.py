"""The read-only workspace tools of the default profile: `list_files` and `read_file`.

Both are confined to a root directory (for the module-level tools: the
working directory the process started in): a path that resolves outside it,
through `..` or a symlink, is refused with an error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from actors.agent import Tool

MAX_READ_BYTES = 256 * 1024
"""The most bytes `read_file` returns; a larger file is refused, never cut."""
MAX_LIST_ENTRIES = 1000
"""The most entries `list_files` returns; a larger directory is refused, never cut."""


class WorkspaceToolError(ValueError):
    """A workspace tool was given a path outside its root, or an unreadable one."""


def _inside(root: Path, relative: object) -> Path:
    if not isinstance(relative, str):
        raise WorkspaceToolError(f"path must be a string, got {relative!r}")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise WorkspaceToolError(f"path {relative!r} is outside the workspace {str(root)!r}")
    return target


def _arguments(arguments: dict[str, Any] | str, tool: str) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise WorkspaceToolError(f"{tool} takes a JSON object, got {arguments!r}")
    return arguments


def workspace_tools(root: Path) -> tuple[Tool, Tool]:
    """`(list_files, read_file)` confined to `root`."""
    base = root.resolve()

    def list_sync(relative: object) -> str:
        directory = _inside(base, relative)
        if not directory.is_dir():
            raise WorkspaceToolError(f"{relative!r} is not a directory of the workspace")
        entries = sorted(directory.iterdir())
        if len(entries) > MAX_LIST_ENTRIES:
            raise WorkspaceToolError(
                f"{relative!r} holds {len(entries)} entries, more than {MAX_LIST_ENTRIES}; "
                "list a subdirectory"
            )
        return "\n".join(e.name + ("/" if e.is_dir() else "") for e in entries)

    def read_sync(relative: object) -> str:
        file = _inside(base, relative)
        if not file.is_file():
            raise WorkspaceToolError(f"{relative!r} is not a file of the workspace")
        size = file.stat().st_size
        if size > MAX_READ_BYTES:
            raise WorkspaceToolError(
                f"{relative!r} has {size} bytes, more than the {MAX_READ_BYTES} read_file returns"
            )
        return file.read_text(encoding="utf-8", errors="replace")

    async def list_files(arguments: dict[str, Any] | str, call: object) -> str:
        relative = _arguments(arguments, "list_files").get("path", ".")
        return await trio.to_thread.run_sync(list_sync, relative)

    async def read_file(arguments: dict[str, Any] | str, call: object) -> str:
        args = _arguments(arguments, "read_file")
        if "path" not in args:
            raise WorkspaceToolError("read_file needs a 'path'")
        return await trio.to_thread.run_sync(read_sync, args["path"])

    path_schema = {"type": "string", "description": "A path relative to the workspace root."}
    return (
        Tool(
            name="list_files",
            description="List the entries of a workspace directory (directories end in '/').",
            parameters={"type": "object", "properties": {"path": path_schema}},
            execute=list_files,
        ),
        Tool(
            name="read_file",
            description="Read a UTF-8 text file of the workspace and return its contents.",
            parameters={
                "type": "object",
                "properties": {"path": path_schema},
                "required": ["path"],
            },
            execute=read_file,
        ),
    )


list_files, read_file = workspace_tools(Path.cwd())
