"""The two read-only workspace tools `harness serve` offers with no config: list_files, read_file.

Both are confined to one root directory (the directory the server started
in): a path that resolves outside it (`..`, an absolute path, a symlink out)
is refused with an error naming the path, never read. Files are read in a
worker thread (blocking I/O) and must be UTF-8 text of at most 256 KiB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from actors.agent import Tool

MAX_FILE_BYTES = 256 * 1024
MAX_LISTED = 500


def _resolve(root: Path, arguments: dict[str, Any] | str, tool: str, default: str | None) -> Path:
    if not isinstance(arguments, dict):
        raise ValueError(f"{tool} needs a JSON object with a string 'path', got {arguments!r}")
    raw = arguments.get("path", default)
    if not isinstance(raw, str):
        raise ValueError(f"{tool} needs a string 'path', got {raw!r}")
    target = (root / raw).resolve()
    if target != root and root not in target.parents:
        raise PermissionError(f"{tool}: {raw!r} is outside the workspace {str(root)!r}")
    return target


def workspace_tools(root: Path) -> tuple[Tool, Tool]:
    """`list_files(path=".")` and `read_file(path)` confined to `root`."""
    base = root.resolve()

    def list_sync(target: Path) -> str:
        if not target.is_dir():
            raise NotADirectoryError(
                f"list_files: {str(target.relative_to(base))!r} is not a directory"
            )
        names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in target.iterdir())
        shown = names[:MAX_LISTED]
        more = f"\n... and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
        return "\n".join(shown) + more

    def read_sync(target: Path) -> str:
        size = target.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(
                f"read_file: {target.name!r} has {size} bytes; at most {MAX_FILE_BYTES}"
            )
        return target.read_text(encoding="utf-8")

    async def list_files(arguments: dict[str, Any] | str, call: object) -> str:
        return await trio.to_thread.run_sync(
            list_sync, _resolve(base, arguments, "list_files", ".")
        )

    async def read_file(arguments: dict[str, Any] | str, call: object) -> str:
        return await trio.to_thread.run_sync(
            read_sync, _resolve(base, arguments, "read_file", None)
        )

    return (
        Tool(
            name="list_files",
            description="List the files and directories under a workspace path.",
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Directory; default '.'"}},
            },
            execute=list_files,
        ),
        Tool(
            name="read_file",
            description="Read a UTF-8 text file from the workspace.",
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Workspace path."}},
                "required": ["path"],
            },
            execute=read_file,
        ),
    )
