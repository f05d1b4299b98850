"""The chaos test: a real cluster loses a node, stalls one and gains one, and loses nothing.

PostgreSQL from Debian's binaries (tests/postgres.py), 3 `harness node`
processes and the cluster `harness serve` gateway run as real processes.
300 sessions run tool-calling turns one after another through the gateway
(ACP `session/prompt` over websockets), each session's log watched by a
supervisor (`_harness/log/subscribe` from seq 0, through the gateway).
While they run: one node is `kill -9`ed mid-turn; another is `SIGSTOP`ped
in the middle of a tool call, for longer than its leases and its death
timeout, then `SIGCONT`ed (it
wakes up with work in hand for sessions that other nodes took over); a
fourth node joins. Then, from PostgreSQL alone: every session's seqs are
contiguous and their checksums hold; every prompt's turn is in the log
exactly once, completed; every subscriber saw its session's whole log, in
order, without a gap or duplicate, each event byte-equal to the stored
one; and nothing the stalled node produced after it lost its leases
(the journal of the `chaos_step` tool names each result's process and
time) reached the log, its late commits counted as fenced.

Run by `make test-chaos` (not by `make test`), which `.ci/run` runs after
`make test`. Bounded: the whole run takes well under 3 minutes on a 2-core
machine.
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.chaos import logcheck
from tests.chaos.cluster import Cluster, open_cluster
from tests.chaos.tools import in_flight_at, owners_at, read_journal
from tests.chaos.workload import PromptRecord, Workload
from tests.postgres import PostgresServer

SESSIONS = 300
TOOL_SECONDS = 1.5
"""How long each `chaos_step` call takes: a signal often lands while tools run."""
DEAD_AFTER_SECONDS = 5.0
"""A node without a heartbeat for this long is dead to the gateway."""
LEASE_TTL_SECONDS = DEAD_AFTER_SECONDS
"""A node's lease length (as long as its heartbeat): a stalled node's leases expire after this."""
WARMUP_SECONDS = 8.0
RECOVER_SECONDS = 10.0
TAKEOVER_SECONDS = 13.0
"""Time for the other nodes to take a hundred sessions over (one node starts its agents one
at a time)."""
STOP_SECONDS = max(LEASE_TTL_SECONDS, DEAD_AFTER_SECONDS) + TAKEOVER_SECONDS
"""The stall: past its leases and its death timeout, with time for others to take over."""
MID_TOOL_CALLS = 10
MID_TOOL_TIMEOUT = 10.0
"""How long the stall waits for the node to be in the middle of `MID_TOOL_CALLS` tool calls."""
JOURNAL_POLL_SECONDS = 0.1
AFTER_RESUME_SECONDS = 4.0
AFTER_JOIN_SECONDS = 10.0
DRAIN_TIMEOUT = 90.0
CATCH_UP_TIMEOUT = 30.0
SHOWN = 12
"""Problems shown in a failure message (the count says how many there were)."""


@attrs.define
class Timeline:
    """When each fault happened (wall clock, seconds) and which process it hit."""

    started: float = 0.0
    killed_pid: int = 0
    killed_at: float = 0.0
    killed_in_flight: list[str] = attrs.field(factory=list)
    stopped_pid: int = 0
    stopped_at: float = 0.0
    resumed_at: float = 0.0
    in_flight_at_stop: list[str] = attrs.field(factory=list)
    leases_at_stop: dict[str, tuple[str | None, int]] = attrs.field(factory=dict)
    leases_at_resume: dict[str, tuple[str | None, int]] = attrs.field(factory=dict)
    joined_pid: int = 0
    joined_at: float = 0.0

    def relative(self) -> str:
        """The faults' times, in seconds from the start."""
        return (
            f"kill -9 pid {self.killed_pid} at +{self.killed_at - self.started:.1f} s "
            f"({len(self.killed_in_flight)} of its turns in flight); SIGSTOP pid "
            f"{self.stopped_pid} at +{self.stopped_at - self.started:.1f} s, SIGCONT at "
            f"+{self.resumed_at - self.started:.1f} s; pid {self.joined_pid} joined at "
            f"+{self.joined_at - self.started:.1f} s"
        )


async def journal_of(cluster: Cluster) -> list[dict[str, Any]]:
    """The tool journal of every node so far."""
    return await trio.to_thread.run_sync(read_journal, cluster.journal)


async def mid_tool(cluster: Cluster, pid: int) -> None:
    """Return once process `pid` runs `MID_TOOL_CALLS` `chaos_step`s (its journal says so),
    within `MID_TOOL_TIMEOUT`: the stall must catch work in hand, whose late results get
    fenced."""
    for _ in range(round(MID_TOOL_TIMEOUT / JOURNAL_POLL_SECONDS)):
        # The journal is another process's file: nothing to wait on but the next look.
        if in_flight_at(await journal_of(cluster), pid, time.time()) >= MID_TOOL_CALLS:
            return
        await trio.sleep(JOURNAL_POLL_SECONDS)


async def inflict(cluster: Cluster, workload: Workload, dsn: str, timeline: Timeline) -> None:
    """The faults, in order: kill -9 one node, stall another past its leases, add a fourth."""
    await trio.sleep(WARMUP_SECONDS)
    victim = cluster.nodes["n1"]
    owners = owners_at(await journal_of(cluster), time.time())
    timeline.killed_in_flight = [sid for sid in workload.in_flight if owners.get(sid) == victim.pid]
    timeline.killed_pid, timeline.killed_at = victim.pid, time.time()
    victim.kill()
    await victim.process.wait()

    await trio.sleep(RECOVER_SECONDS)
    stalled = cluster.nodes["n2"]
    await mid_tool(cluster, stalled.pid)
    stalled.pause()
    timeline.stopped_pid, timeline.stopped_at = stalled.pid, time.time()
    timeline.in_flight_at_stop = list(workload.in_flight)
    timeline.leases_at_stop = await trio.to_thread.run_sync(logcheck.read_leases, dsn)
    await trio.sleep(STOP_SECONDS)
    timeline.leases_at_resume = await trio.to_thread.run_sync(logcheck.read_leases, dsn)
    timeline.resumed_at = time.time()
    stalled.resume()

    await trio.sleep(AFTER_RESUME_SECONDS)
    joined = await cluster.add_node("n4")
    timeline.joined_pid, timeline.joined_at = joined.pid, time.time()
    await trio.sleep(AFTER_JOIN_SECONDS)


async def stop_all(cluster: Cluster) -> dict[str, int]:
    """SIGTERM the gateway, then every node still running, side by side; their exit statuses."""
    statuses: dict[str, int] = {}
    assert cluster.gateway is not None
    statuses["gateway"] = await cluster.gateway.stop()

    async def stop(name: str) -> None:
        statuses[name] = await cluster.nodes[name].stop()

    async with trio.open_nursery() as nursery:
        for name, child in cluster.nodes.items():
            if not child.killed:
                nursery.start_soon(stop, name)
    return statuses


def outcomes(records: list[PromptRecord]) -> collections.Counter[str]:
    """The failed prompts' outcomes with session ids blanked out, counted."""
    counts: collections.Counter[str] = collections.Counter()
    for record in records:
        text = re.sub(r"[0-9a-f]{32}", "SID", str(record.outcome))
        counts[re.sub(r"\d+(\.\d+)? s\b", "N s", text)[:400]] += 1
    return counts


def shown(problems: list[str]) -> str:
    """The first problems, and how many there were."""
    head = "\n  ".join(problems[:SHOWN])
    return f"{len(problems)} problems:\n  {head}"


def stale_writer_problems(
    journal: list[dict[str, Any]], log: logcheck.Log, timeline: Timeline, stats: Any
) -> tuple[list[str], int]:
    """The stalled node's late results are absent from the log and its commits were fenced.

    A late result: a `chaos_step` the stalled node started before the
    SIGSTOP and finished after the SIGCONT (so after its leases expired).
    Its session must have been taken over meanwhile (a higher lease epoch
    at the SIGCONT than at the SIGSTOP: its prompt was in flight, so the
    gateway had to move it), and then its nonce must be nowhere in the log.
    Returns the problems and the number of late results.
    """
    late = [
        entry
        for entry in journal
        if entry["phase"] == "end"
        and entry["pid"] == timeline.stopped_pid
        and float(entry["started"]) < timeline.stopped_at
        and float(entry["finished"]) > timeline.resumed_at
    ]
    problems = []
    if not late:
        problems.append(
            f"the stalled node (pid {timeline.stopped_pid}) finished no tool call after SIGCONT "
            "that it had started before SIGSTOP: the stall hit no turn mid-tool"
        )
    superseded = []
    for entry in late:
        session = str(entry["session"])
        before = timeline.leases_at_stop.get(session, (None, -1))
        after = timeline.leases_at_resume.get(session, (None, -1))
        if after[1] > before[1]:
            superseded.append(entry)
        else:  # its lease was never taken: its write is not stale, but failover failed
            problems.append(
                f"session {session}: not taken over during the stall although its turn was "
                f"in flight (lease {before} at SIGSTOP, {after} at SIGCONT)"
            )
    found = logcheck.nonces_in_log(log, (str(entry["nonce"]) for entry in superseded))
    for nonce, places in found.items():
        problems.append(
            f"stale write accepted: the stalled node's late result ok {nonce} is in the log at "
            f"(session, seq) {places} although its lease had been taken over"
        )
    fenced = stats.get("fencedCommits") if isinstance(stats, dict) else None
    if not isinstance(fenced, int) or fenced < 1:
        problems.append(
            f"the cluster's _harness/stats says fencedCommits = {fenced!r}; the stalled node's "
            "late writes should have been refused by fencing"
        )
    return problems, len(late)


async def test_a_cluster_loses_stalls_and_gains_nodes_and_the_log_loses_nothing(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    dsn = postgres_server.new_schema()
    started = time.monotonic()
    timeline = Timeline(started=time.time())
    async with (
        open_cluster(tmp_path, dsn, nodes=3, tool_seconds=TOOL_SECONDS) as cluster,
        AsyncExitStack() as clients,
    ):
        try:
            workload = Workload(
                cluster.url,
                cluster.token,
                sessions=SESSIONS,
                driver_connections=10,
                subscriber_connections=10,
            )
            await workload.connect(clients)
            await workload.create()
            assert len(workload.session_ids) == SESSIONS
            ready = time.monotonic()
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(workload.run, stop, 2)
                await inflict(cluster, workload, dsn, timeline)
                stop.set()  # each session ends after the turn it is in
                nursery.cancel_scope.deadline = trio.current_time() + DRAIN_TIMEOUT
            ran = time.monotonic()
            stuck = [record for record in workload.prompts if record.outcome is None]
            stats = await workload.driver(0).call("_harness/stats", {})
            log = await trio.to_thread.run_sync(logcheck.read_log, dsn)
            heads = {sid: len(events) - 1 for sid, events in log.items()}
            behind = await workload.wait_caught_up(heads, CATCH_UP_TIMEOUT)
            journal = await journal_of(cluster)
            statuses = await stop_all(cluster)
        except BaseException:
            print(cluster.outputs())
            raise
        finally:
            (tmp_path / "timeline.json").write_text(json.dumps(attrs.asdict(timeline), default=str))
        outputs = cluster.outputs()
    assert not stuck, f"{len(stuck)} prompts unanswered {DRAIN_TIMEOUT} s after the end\n{outputs}"

    verdicts: dict[str, list[str]] = {}
    failed = workload.failed_prompts()
    verdicts["prompts answered end_turn"] = [
        f"{n} x {outcome}" for outcome, n in outcomes(failed).most_common()
    ]
    verdicts["seqs contiguous, checksums hold"] = logcheck.check_contiguous(log)
    problems, repeated = logcheck.check_prompts(log, workload.prompts_by_session())
    verdicts["each prompt's turn once, completed"] = problems
    problems = list(behind)
    if len(workload.subscriptions) != SESSIONS:
        problems.append(f"{len(workload.subscriptions)} subscriptions, not {SESSIONS}")
    for sub in workload.subscriptions.values():
        problems += logcheck.check_subscriber(
            sub.subscription, sub.session_id, sub.from_seq, sub.events, log
        )
    verdicts["subscribers gap-free, duplicate-free, byte-equal"] = problems
    verdicts["a turn in flight on the killed node"] = (
        [] if timeline.killed_in_flight else ["the killed node had no turn in flight"]
    )
    problems, late = stale_writer_problems(journal, log, timeline, stats)
    verdicts["the stale writer's writes refused"] = problems
    verdicts["clean exit on SIGTERM"] = [
        f"{name} exited with status {status}" for name, status in statuses.items() if status != 0
    ]
    joined = [e for e in journal if e["phase"] == "end" and e["pid"] == timeline.joined_pid]
    verdicts["the joining node took sessions"] = (
        [] if joined else ["the joining node ran no tool call: no session moved to it"]
    )

    owners = owners_at(journal, timeline.killed_at)
    held = [sid for sid, pid in owners.items() if pid == timeline.killed_pid]
    recovery = []
    for sid in held:
        at = logcheck.first_step_end_after(log[sid], int(timeline.killed_at * 1000))
        if at is not None:
            recovery.append(at / 1000 - timeline.killed_at)
    summary = {
        "sessions": SESSIONS,
        "prompts": len(workload.prompts),
        "failedPrompts": len(failed),
        "events": sum(len(events) for events in log.values()),
        "repeatedTurns": repeated,
        "killedInFlight": len(timeline.killed_in_flight),
        "staleLateResults": late,
        "toolsInFlightAtStop": in_flight_at(journal, timeline.stopped_pid, timeline.stopped_at),
        "promptsInFlightAtStopOnItsSessions": sum(
            1
            for sid in timeline.in_flight_at_stop
            if f"pid {timeline.stopped_pid} " in str(timeline.leases_at_stop.get(sid, ("",))[0])
        ),
        "fencedCommits": stats.get("fencedCommits") if isinstance(stats, dict) else None,
        "joinedToolCalls": len(joined),
        "recoveryS": {
            "sessions": len(recovery),
            "p50": statistics.median(recovery) if recovery else None,
            "max": max(recovery) if recovery else None,
        },
        "setupS": ready - started,
        "runS": ran - ready,
        "totalS": time.monotonic() - started,
    }
    print("chaos summary:", json.dumps(summary))
    (tmp_path / "summary.json").write_text(json.dumps({"summary": summary, "stats": stats}))
    print(timeline.relative())
    broken = {name: problems for name, problems in verdicts.items() if problems}
    assert not broken, (
        "\n".join(f"{name}: {shown(problems)}" for name, problems in broken.items())
        + f"\n{timeline.relative()}\nexit statuses {statuses}\n{outputs}"
    )
