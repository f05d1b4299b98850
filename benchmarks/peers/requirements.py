"""The peer frameworks, pinned, each in a virtualenv of its own under benchmarks/peers/.venvs/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

VENVS = Path(__file__).parent / ".venvs"

PEERS: dict[str, list[str]] = {
    "langgraph": ["langgraph==1.2.22", "langchain-openai==1.7.4"],
    "pydantic-ai": ["pydantic-ai-slim[openai]==2.68.0"],
    "openai-agents": ["openai-agents==0.24.0"],
    "autogen": ["autogen-agentchat==0.7.5", "autogen-ext[openai]==0.7.5"],
}
"""Each peer's pinned requirements (the versions the README's figures come from)."""


def python_of(peer: str) -> Path:
    """The interpreter of `peer`'s virtualenv."""
    return VENVS / peer / "bin" / "python"


def ensure_venv(peer: str) -> Path:
    """Create `peer`'s virtualenv and install its pins unless already done; its interpreter."""
    python = python_of(peer)
    stamp = VENVS / peer / ".installed"
    wanted = "\n".join(PEERS[peer])
    if stamp.exists() and stamp.read_text() == wanted:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENVS / peer)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS[peer]], check=True)
    stamp.write_text(wanted)
    return python


if __name__ == "__main__":
    for name in sys.argv[1:] or PEERS:
        print(f"{name}: {ensure_venv(name)}", flush=True)
