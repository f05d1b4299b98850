"""One benchmark level in a child process of its own, so RSS figures start clean.

`python -m supervision.bench.level_process URL SETTINGS_JSON` runs
`run_level` with a live progress bar (steps done, steps/s) on stderr and
prints the `LevelResult` as one JSON line on stdout.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence

import attrs
import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from supervision.bench.harness_run import LevelSettings, run_level


class StepProgress:
    """A bar of steps done and steps per second, redrawn at most every `interval` seconds.

    Steps are counted in one integer; the bar is updated only when it is
    redrawn, and rich keeps its rate samples for one second. So a burst of
    steps leaves at most a second of redraws behind (about ten samples), not
    a record per step: a level reads RSS after its burst, and records
    allocated during it would stay in that figure, keeping the allocator's
    arenas of the burst in use.
    """

    def __init__(self, progress: Progress, *, total: int, interval: float = 0.1) -> None:
        self._progress = progress
        self._task = progress.add_task("steps", total=total, rate=0.0)
        self._interval = interval
        self._done = 0
        self._shown = -math.inf

    @property
    def done(self) -> int:
        """Steps counted so far."""
        return self._done

    def on_step(self, count: int) -> None:
        """Count `count` steps; redraw if the last redraw is `interval` old."""
        self._done += count
        now = self._progress.get_time()
        if now - self._shown >= self._interval:
            self._shown = now
            self.show()

    def show(self) -> None:
        """Update the bar to the steps counted, with the rate over the last second, and draw it."""
        self._progress.update(self._task, completed=self._done)
        speed = next(task.speed for task in self._progress.tasks if task.id == self._task)
        self._progress.update(self._task, rate=speed or 0.0)
        self._progress.refresh()


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
        speed_estimate_period=1.0,
    )
    steps = StepProgress(progress, total=total)
    with progress:
        result = trio.run(lambda: run_level(url, settings, on_step=steps.on_step))
        steps.show()
    print(json.dumps(attrs.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
