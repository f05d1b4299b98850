"""One benchmark level in a child process of its own, so RSS figures start clean.

`python -m supervision.bench.level_process URL SETTINGS_JSON` runs
`run_level` with a live progress bar (steps done, steps/s) on stderr and
prints the `LevelResult` as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Sequence

import attrs
import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from supervision.bench.harness_run import LevelSettings, run_level


def main(argv: Sequence[str] | None = None) -> None:
    """Run one level and print its result as JSON."""
    url, raw = list(sys.argv[1:] if argv is None else argv)
    settings = LevelSettings(**json.loads(raw))
    # The warm-up turns (2 x 2 steps) and the sequential ones also count steps.
    total = 2 * (settings.sessions + 3 + settings.sequential_turns)
    progress = Progress(
        TextColumn(f"harness, {settings.sessions:,} sessions"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TextColumn("{task.fields[rate]:>8.0f} steps/s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        # Refreshed from the steps themselves: rich's auto-refresh would run a thread.
        auto_refresh=False,
    )
    task = progress.add_task("steps", total=total, rate=0.0)
    window: deque[float] = deque()
    shown = [0.0]

    def on_step(count: int) -> None:
        now = trio.current_time()
        window.append(now)
        while now - window[0] > 1.0:
            window.popleft()
        progress.update(task, advance=count, rate=float(len(window)))
        if now - shown[0] >= 0.1:
            shown[0] = now
            progress.refresh()

    with progress:
        result = trio.run(lambda: run_level(url, settings, on_step=on_step))
        progress.refresh()
    print(json.dumps(attrs.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
