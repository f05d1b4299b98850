"""A writer process for the two-process tests: `python -m tests.session.postgres_writer DSN ID TTL`.

Takes the session's lease as owner `child`, then appends one `turn/start`
(turn 0, 1, 2, ...) every 20 ms, printing `durable SEQ` once each is
durable. Exits 3 printing `fenced` when its writes are refused because the
lease was taken over, and 4 printing `lost` when its commit failed for
another reason.
"""

from __future__ import annotations

import sys

import trio

from actors.session import Event, PostgresStore, SessionError, SessionFencedError
from actors.session.events import TurnStart


async def main(dsn: str, session_id: str, ttl: float) -> int:
    store = PostgresStore(dsn, lease_ttl=ttl)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        lease = await store.acquire_lease(session_id, owner="child")
        seq = len(await store.load(session_id))
        print("leased", flush=True)
        try:
            while True:
                event = Event(type="turn/start", seq=seq, time=0, data=TurnStart(turn=seq))
                await store.append(session_id, [event], lease=lease)
                await store.flush(session_id)
                print(f"durable {seq}", flush=True)
                seq += 1
                await trio.sleep(0.02)
        except SessionFencedError:
            print("fenced", flush=True)
            return 3
        except SessionError as exc:
            print(f"lost {exc}", flush=True)
            return 4
        finally:
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3])))
