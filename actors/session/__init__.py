"""The session log: events, the model-visible surface, request headers, stores, replay.

`PostgresStore` needs the optional `postgres` extra (psycopg), so it is
imported on first use rather than with the package.
"""

from typing import TYPE_CHECKING

from actors.session.codec import event_from_json as event_from_json
from actors.session.codec import event_to_json as event_to_json
from actors.session.durability import DurableChanges as DurableChanges
from actors.session.errors import ReplacementError as ReplacementError
from actors.session.errors import SessionError as SessionError
from actors.session.errors import SessionHibernatingError as SessionHibernatingError
from actors.session.errors import UnknownEventError as UnknownEventError
from actors.session.events import EVENT_TYPES as EVENT_TYPES
from actors.session.events import Event as Event
from actors.session.header import RequestHeader as RequestHeader
from actors.session.header import canonical_header as canonical_header
from actors.session.header import header_equals as header_equals
from actors.session.lease import Lease as Lease
from actors.session.lease import SessionBusyError as SessionBusyError
from actors.session.lease import SessionFencedError as SessionFencedError
from actors.session.reducers import derive_messages as derive_messages
from actors.session.reducers import fold_request_header as fold_request_header
from actors.session.replay import rebuild_request as rebuild_request
from actors.session.replay import request_attempts as request_attempts
from actors.session.session import Session as Session
from actors.session.sqlite_store import SQLiteStore as SQLiteStore
from actors.session.store import MemoryStore as MemoryStore
from actors.session.store import SessionExistsError as SessionExistsError
from actors.session.store import SessionStore as SessionStore
from actors.session.store import UnknownSessionError as UnknownSessionError

if TYPE_CHECKING:
    from actors.session.postgres_store import PostgresStore as PostgresStore


def __getattr__(name: str) -> object:
    if name == "PostgresStore":
        from actors.session.postgres_store import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'actors.session' has no attribute {name!r}")
