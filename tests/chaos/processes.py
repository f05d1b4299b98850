"""Child processes for the chaos test and the cluster benchmark, each handled by its PID.

`open_processes(log_dir)` yields a `ProcessGroup`; `group.start(name,
argv, ready=PATTERN)` starts one child with stdout and stderr on one pipe,
read by a task of the group's nursery, and waits until the child prints a
line matching `ready` (its readiness line, e.g. `harness node n1 listening
on ws://...`). A child can then be killed (`kill -9`), paused (`SIGSTOP`),
resumed (`SIGCONT`) or stopped (`SIGTERM`, then `SIGKILL` past a grace), all
by its PID; `cpu_seconds()` reads its user+system time from `/proc`.

Whatever happens inside the `async with` (a failed assertion, a
cancellation), on the way out every child still running is resumed,
terminated and waited for, so no process outlives the test. Each child's
output is kept (the last `MAX_LINES` lines; older ones are dropped and
counted) and written to `log_dir/NAME.log` when the group closes, so a
failure message can show what the process said.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

MAX_LINES = 4000
"""Output lines kept per child; older lines are dropped (and counted in `dropped_lines`)."""
STOP_GRACE_SECONDS = 20.0
"""How long a SIGTERMed child may take to exit before it is SIGKILLed."""
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (from /proc/PID/stat).

    Raises:
        ChildFailed: there is no such process (it has exited and been reaped).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise ChildFailed(f"process {pid} has exited") from None
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class ChildFailed(Exception):
    """A child exited early or never printed its readiness line; the message holds its output."""


@attrs.define(eq=False)
class Child:
    """One started child process, handled by its PID.

    Attributes:
        name: the name it was started under (its log file is `NAME.log`).
        process: the trio process.
        lines: the most recent output lines (at most `MAX_LINES`).
        dropped_lines: older output lines that were dropped.
        ready_match: the match of the readiness pattern, once printed.
    """

    name: str
    process: trio.Process
    ready: re.Pattern[str] | None
    lines: collections.deque[str] = attrs.field(factory=lambda: collections.deque(maxlen=MAX_LINES))
    dropped_lines: int = 0
    ready_match: re.Match[str] | None = None
    killed: bool = False
    _ready_event: trio.Event = attrs.field(factory=trio.Event)
    _closed_event: trio.Event = attrs.field(factory=trio.Event)

    @property
    def pid(self) -> int:
        """The child's PID."""
        return self.process.pid

    @property
    def running(self) -> bool:
        """True until the child has exited (a paused child is running)."""
        return self.process.poll() is None

    def output(self, last: int = 60) -> str:
        """The child's last `last` output lines, for failure messages."""
        tail = list(self.lines)[-last:]
        return f"--- {self.name} (pid {self.pid}) output, last {len(tail)} lines ---\n" + "\n".join(
            tail
        )

    def kill(self) -> None:
        """`kill -9` the child (no clean-up of any kind runs in it)."""
        self.killed = True
        self.process.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP the child: it keeps its sockets and leases but runs nothing."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused child."""
        self.process.send_signal(signal.SIGCONT)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the child has used so far (see `cpu_seconds_of`)."""
        return cpu_seconds_of(self.pid)

    async def wait_ready(self, timeout: float) -> re.Match[str]:
        """Wait until the readiness line was printed.

        Raises:
            ChildFailed: the child exited first, or `timeout` passed (with its output).
        """
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_set_when, self._closed_event, nursery.cancel_scope)
                await self._ready_event.wait()
                nursery.cancel_scope.cancel()
        if self.ready_match is not None:
            return self.ready_match
        if self._closed_event.is_set():  # its output ended: it exited or is exiting
            with trio.move_on_after(STOP_GRACE_SECONDS):
                await self.process.wait()
            state = f"exited with status {self.process.returncode}"
        else:
            pattern = self.ready.pattern if self.ready else None
            state = f"printed no line matching {pattern!r} within {timeout} s"
        raise ChildFailed(f"{self.name} (pid {self.pid}) {state}\n{self.output()}")

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> int:
        """Resume, SIGTERM, wait up to `grace` seconds, else SIGKILL; the exit status."""
        if self.running:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                return await self.process.wait()
            self.killed = True
            self.process.send_signal(signal.SIGKILL)
        return await self.process.wait()

    async def _read(self, stream: trio.abc.ReceiveStream) -> None:
        pending = b""
        try:
            while chunk := await stream.receive_some():
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    self._line(raw.decode(errors="replace"))
            if pending:
                self._line(pending.decode(errors="replace"))
        finally:
            self._closed_event.set()

    def _line(self, line: str) -> None:
        if len(self.lines) == MAX_LINES:
            self.dropped_lines += 1
        self.lines.append(line)
        if self.ready is not None and self.ready_match is None:
            match = self.ready.search(line)
            if match is not None:
                self.ready_match = match
                self._ready_event.set()


async def _set_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


@attrs.define(eq=False)
class ProcessGroup:
    """The children of one test run; see the module docstring."""

    nursery: trio.Nursery
    log_dir: Path
    env: Mapping[str, str]
    children: list[Child] = attrs.field(factory=list)

    async def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: str | None = None,
        timeout: float = 60.0,
        cwd: Path | None = None,
    ) -> Child:
        """Start `argv` as child `name`; with `ready`, wait for its readiness line.

        Raises:
            ChildFailed: it exited or printed no readiness line in `timeout` s.
        """
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(self.env),
            cwd=cwd,
        )
        child = Child(
            name=name, process=process, ready=None if ready is None else re.compile(ready)
        )
        self.children.append(child)
        assert process.stdout is not None
        self.nursery.start_soon(child._read, process.stdout)
        if ready is not None:
            await child.wait_ready(timeout)
        return child

    def outputs(self) -> str:
        """Every child's last output lines, for a failure message."""
        return "\n".join(child.output() for child in self.children)

    async def close(self) -> None:
        """Stop every child still running (by PID), wait for all, write their logs."""
        for child in self.children:
            if child.running:
                child.process.send_signal(signal.SIGCONT)
                child.process.send_signal(signal.SIGTERM)
        for child in self.children:
            await child.stop()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for child in self.children:
            text = "\n".join(child.lines)
            if child.dropped_lines:
                text = f"[{child.dropped_lines} earlier lines dropped]\n{text}"
            (self.log_dir / f"{child.name}.log").write_text(text + "\n")


@asynccontextmanager
async def open_processes(log_dir: Path, env: Mapping[str, str]) -> AsyncIterator[ProcessGroup]:
    """A `ProcessGroup` whose children are all stopped and waited for on the way out.

    An exception from the body leaves as it is (not wrapped in a group by the
    readers' nursery), after the children are stopped.
    """
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        group = ProcessGroup(nursery=nursery, log_dir=log_dir, env=env)
        try:
            yield group
        except BaseException as exc:
            failure = exc
        finally:
            with trio.CancelScope(shield=True):
                await group.close()
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
