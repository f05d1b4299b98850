"""A second process touching a session of a running runtime (run by `test_hosted_agents.py`).

Usage: python lease_probe.py STORE SESSION

Tries to take the write lease of SESSION in the SQLite store STORE and
prints `busy HOLDER` (another live writer has it) or `acquired EPOCH`
(then gives it back at once).
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from actors.session import SQLiteStore
from actors.session.lease import SessionBusyError


async def main(store_path: Path, session_id: str) -> None:
    store = SQLiteStore(store_path)
    try:
        lease = await store.acquire_lease(session_id, owner="the probe")
    except SessionBusyError as busy:
        print(f"busy {busy.holder}", flush=True)
        return
    print(f"acquired {lease.epoch}", flush=True)
    await store.release_lease(lease)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2])
