"""Parallel sessions through the runtime, against the simulator in its own process.

1,000 sessions (by default also 100 and 10,000), each running one turn of
two steps: the user message makes the model call `echo`, the tool result
goes back, the model answers. A 12-paragraph system prompt, 40 tools with
two parameters each, and the time as a context snapshot. Prints a table and
writes benchmarks/results/parallel_sessions.json and
benchmarks/parallel_sessions.png (see benchmarks/README.md).

Run: .venv/bin/python benchmarks/parallel_sessions.py [--sessions 100 1000 10000]
     [--latency 0.05] [--reply-tokens 24] [--http 2|1.1] [--pools K] [--store memory|sqlite]
"""

from __future__ import annotations

import sys
from pathlib import Path

from supervision.bench.parallel import main

RESULTS = Path(__file__).parent / "results"

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--json" not in argv:
        argv += ["--json", str(RESULTS / "parallel_sessions.json")]
    if "--plot" not in argv:
        argv += ["--plot", str(Path(__file__).parent / "parallel_sessions.png")]
    sys.exit(main(argv))
