"""Per-event checksums: what a store keeps beside each event's JSON and verifies on load."""

from __future__ import annotations

import zlib


def event_checksum(session_id: str, seq: int, text: str) -> int:
    """The CRC-32 of an event's stored JSON `text`, bound to its session and seq.

    Binding the session and seq means a row moved to another place in the
    log fails the check as surely as an edited one. CRC-32 detects accidental
    damage (a torn write, a flipped bit, a stray page); it is not a defence
    against someone who edits the file on purpose and recomputes it.
    """
    key = f"{session_id}\x00{seq}\x00".encode("utf-8", "surrogatepass")
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), zlib.crc32(key))
