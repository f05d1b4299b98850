"""The read-only workspace tools of the default profile: `list_files` and `read_file`.

Both are confined to a root directory (for the module-level tools: the
working directory the process started in): a path that resolves outside it,
through `..` or a symlink, is refused with an error naming it.
"""

from __future__ import annotations

from pathlib import Path

from actors.agent import Tool, function_tool

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


def workspace_tools(root: Path) -> tuple[Tool, Tool]:
    """`(list_files, read_file)` confined to `root`, as function tools (run in a worker thread)."""
    base = root.resolve()

    def list_files(path: str = ".") -> str:
        """List the entries of a workspace directory (directories end in '/').

        Args:
            path: A directory, relative to the workspace root.
        """
        directory = _inside(base, path)
        if not directory.is_dir():
            raise WorkspaceToolError(f"{path!r} is not a directory of the workspace")
        entries = sorted(directory.iterdir())
        if len(entries) > MAX_LIST_ENTRIES:
            raise WorkspaceToolError(
                f"{path!r} holds {len(entries)} entries, more than {MAX_LIST_ENTRIES}; "
                "list a subdirectory"
            )
        return "\n".join(e.name + ("/" if e.is_dir() else "") for e in entries)

    def read_file(path: str) -> str:
        """Read a UTF-8 text file of the workspace and return its contents.

        Args:
            path: A file, relative to the workspace root.
        """
        file = _inside(base, path)
        if not file.is_file():
            raise WorkspaceToolError(f"{path!r} is not a file of the workspace")
        size = file.stat().st_size
        if size > MAX_READ_BYTES:
            raise WorkspaceToolError(
                f"{path!r} has {size} bytes, more than the {MAX_READ_BYTES} read_file returns"
            )
        return file.read_text(encoding="utf-8", errors="replace")

    return function_tool(list_files), function_tool(read_file)


list_files, read_file = workspace_tools(Path.cwd())
