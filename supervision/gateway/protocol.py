"""The wire: JSON-RPC 2.0 framing, error codes, and the one cattrs converter for params and results.

Frames are parsed into `Request` / `Notification` objects (or an `RpcError`
carrying the id it answers), params are structured into the typed classes of
`supervision.gateway.messages` through `converter` (camelCase on the wire,
snake_case in Python; `data.path` of an invalid-params error is a JSON
Pointer into the params), and results are unstructured through the same
converter. Nothing here touches a socket.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NOT_FOUND = -32002
FORBIDDEN = -33001
SESSION_BUSY = -33002
OVERLOADED = -33003
ASSEMBLY_FAILED = -33005
REBUILD_FAILED = -33006

MAX_BATCH = 32
"""Most messages one batch frame may hold."""

MAX_ID_LENGTH = 256
"""Longest string id accepted (a longer one is an invalid request)."""

MAX_MESSAGE = 1000
"""Longest error message sent; a longer one (quoting huge input) is cut, marked `…`."""

JsonId = str | int | None
"""A JSON-RPC id: a string, an integer, or null (for errors that cannot name one)."""

T = TypeVar("T")


class RpcError(Exception):
    """A JSON-RPC error answer: `code`, `message` (naming the offending thing) and `data`.

    Handlers raise it; the connection turns it into the error response of
    the request it answers (`id`, set by the framing when known).
    """

    def __init__(self, code: int, message: str, data: Any = None, *, id: JsonId = None) -> None:
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + "…"
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.id = id

    def to_json(self) -> dict[str, Any]:
        """The `error` member of the response."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_params(path: str, reason: str, message: str, **extra: Any) -> RpcError:
    """A -32602 error with `data: {path, reason, ...}`; `path` is a JSON Pointer into the params."""
    return RpcError(INVALID_PARAMS, message, {"path": path, "reason": reason, **extra})


def not_found(what: str) -> RpcError:
    """A -32002 error naming what was not found."""
    return RpcError(NOT_FOUND, f"{what} not found", {"reason": "not_found"})


@attrs.frozen(kw_only=True)
class Request:
    """A call that expects an answer."""

    id: str | int
    method: str
    params: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Notification:
    """A call without an id: never answered."""

    method: str
    params: Mapping[str, Any]


Incoming = Request | Notification | RpcError
"""One parsed message of a frame: a call, or the error answering a malformed one."""


@attrs.frozen(kw_only=True)
class Frame:
    """One parsed text frame: its messages, and whether it was a batch (answers go as a list)."""

    messages: tuple[Incoming, ...]
    batch: bool


def parse_frame(text: str) -> Frame:
    """Parse one text frame into calls and per-message errors; never raises.

    Malformed JSON (or nesting too deep to parse) is one -32700 answer; an
    empty or oversized batch one -32600; each malformed member of a batch
    its own -32600 (with its id when it has a usable one).
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Frame(
            messages=(RpcError(PARSE_ERROR, f"frame is not valid JSON: {exc}"),), batch=False
        )
    if isinstance(value, list):
        if not value:
            return Frame(
                messages=(RpcError(INVALID_REQUEST, "empty batch: a batch needs a message"),),
                batch=False,
            )
        if len(value) > MAX_BATCH:
            return Frame(
                messages=(
                    RpcError(
                        INVALID_REQUEST,
                        f"batch of {len(value)} messages; at most {MAX_BATCH} are accepted",
                    ),
                ),
                batch=False,
            )
        return Frame(messages=tuple(_message(item) for item in value), batch=True)
    return Frame(messages=(_message(value),), batch=False)


def _message(value: Any) -> Incoming:
    if not isinstance(value, dict):
        return RpcError(
            INVALID_REQUEST, f"a JSON-RPC message must be an object, got {type(value).__name__}"
        )
    raw_id = value.get("id")
    id_ok = _valid_id(raw_id)
    answer_id: JsonId = raw_id if id_ok else None
    if value.get("jsonrpc") != "2.0":
        return RpcError(INVALID_REQUEST, 'member "jsonrpc" must be "2.0"', id=answer_id)
    if "id" in value and not id_ok:
        return RpcError(
            INVALID_REQUEST,
            f'member "id" must be a string (at most {MAX_ID_LENGTH} characters) or an integer',
        )
    method = value.get("method")
    if not isinstance(method, str):
        if "result" in value or "error" in value:
            return RpcError(
                INVALID_REQUEST, "unexpected response: this server sends no requests", id=answer_id
            )
        return RpcError(INVALID_REQUEST, 'member "method" must be a string', id=answer_id)
    params = value.get("params", {})
    if not isinstance(params, dict):
        if "id" not in value or raw_id is None:
            return RpcError(INVALID_PARAMS, f"params of {clip(repr(method))} must be an object")
        return RpcError(
            INVALID_PARAMS,
            f"params of {method!r} must be an object",
            {"path": "", "reason": "not_an_object"},
            id=answer_id,
        )
    if "id" not in value:
        return Notification(method=method, params=params)
    if raw_id is None:
        return RpcError(INVALID_REQUEST, 'member "id" must not be null in a request')
    return Request(id=raw_id, method=method, params=params)


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and len(value) <= MAX_ID_LENGTH


# -- encoding -------------------------------------------------------------


MAX_QUOTED = 200
"""Longest piece of client input an error message quotes (longer input is cut, marked `…`)."""


def clip(text: str) -> str:
    """`text`, cut to `MAX_QUOTED` characters, so no answer echoes unbounded input."""
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "…"


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""What `dumps` uses: `json.dumps`'s compact, NaN-refusing encoder, built once, not per call."""


def dumps(message: Any) -> str:
    """Compact JSON text of one outgoing message (or batch), ASCII-only.

    ASCII escapes keep any text encodable, even a lone surrogate a client
    sent in a method name that an error message now quotes.
    """
    return _ENCODER.encode(message)


def encode(message: Any) -> bytes:
    """`dumps(message)` as the bytes of a frame (ASCII, hence UTF-8)."""
    return dumps(message).encode()


def response(id: JsonId, result: Any) -> dict[str, Any]:
    """A success response."""
    return {"jsonrpc": "2.0", "id": id, "result": result}


def error_response(id: JsonId, error: RpcError) -> dict[str, Any]:
    """An error response."""
    return {"jsonrpc": "2.0", "id": id, "error": error.to_json()}


def notification(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A notification."""
    return {"jsonrpc": "2.0", "method": method, "params": params}


# -- the converter ---------------------------------------------------------

_CAMEL_BOUNDARY = re.compile(r"_([a-z0-9])")


def camel(name: str) -> str:
    """`from_seq` → `fromSeq`; `meta` → `_meta` (ACP's extension member)."""
    if name == "meta":
        return "_meta"
    return _CAMEL_BOUNDARY.sub(lambda m: m.group(1).upper(), name)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(omit_if_default=False)

    def unstructure_factory(cls: type[Any]) -> Any:
        overrides: dict[str, Any] = {
            a.name: override(rename=camel(a.alias or a.name), omit_if_default=a.default is None)
            for a in attrs.fields(cls)
        }
        return make_dict_unstructure_fn(cls, conv, **overrides)

    def structure_factory(cls: type[Any]) -> Any:
        overrides: dict[str, Any] = {
            a.name: override(rename=camel(a.alias or a.name)) for a in attrs.fields(cls)
        }
        # Strict unless the class says it is extensible (ACP params: see `messages`).
        strict = not getattr(cls, "EXTENSIBLE", False)
        return make_dict_structure_fn(
            cls,
            conv,
            _cattrs_detailed_validation=True,
            _cattrs_forbid_extra_keys=strict,
            **overrides,
        )

    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    conv.register_structure_hook_factory(attrs.has, structure_factory)

    def structure_int(value: Any, _: type) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return value

    def structure_str(value: Any, _: type) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return value

    def structure_bool(value: Any, _: type) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected a boolean, got {type(value).__name__}")
        return value

    def structure_any(value: Any, _: type) -> Any:
        return value

    conv.register_structure_hook(int, structure_int)
    conv.register_structure_hook(str, structure_str)
    conv.register_structure_hook(bool, structure_bool)
    conv.register_structure_hook(Any, structure_any)
    return conv


converter = _make_converter()
"""The wire's one converter: params in, results out (camelCase keys)."""


def structure_params(method: str, params: Mapping[str, Any], cls: type[T]) -> T:
    """`params` as `cls`, or a -32602 naming the method, the field (as a JSON Pointer) and why.

    `data.reason` is `unknown_member` for a member the params object does
    not have (the pointer names it, the message lists the allowed ones),
    else `invalid`.
    """
    try:
        return converter.structure(dict(params), cls)
    except Exception as exc:  # cattrs raises a tree of validation errors
        path, code, reason = _first_failure(exc)
        path, reason = clip(path), clip(reason)
        raise invalid_params(
            path, code, f"invalid params of {method!r} at {path or '/'}: {reason}"
        ) from None


def unstructure(value: Any) -> Any:
    """`value` (attrs results, lists, dicts) as JSON-ready data."""
    return converter.unstructure(value)


def _first_failure(exc: BaseException, path: str = "") -> tuple[str, str, str]:
    """(JSON Pointer, `data.reason`, message) of the first failure in a cattrs error tree."""
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            step = ""
            for note in getattr(sub, "__notes__", ()):
                name = getattr(note, "name", None)
                index = getattr(note, "index", None)
                if name is not None:
                    step = "/" + camel(str(name))
                elif index is not None:
                    step = f"/{index}"
            return _first_failure(sub, path + step)
        return path, "invalid", str(exc)
    if isinstance(exc, ForbiddenExtraKeysError):
        unknown = sorted(exc.extra_fields)
        allowed = ", ".join(camel(a.alias or a.name) for a in attrs.fields(exc.cl))
        names = ", ".join(repr(key) for key in unknown)
        return (
            f"{path}/{_pointer_token(unknown[0])}",
            "unknown_member",
            f"unknown member{'s' if len(unknown) > 1 else ''} {names}; allowed: {allowed}",
        )
    if isinstance(exc, KeyError):
        return path, "invalid", "required field is missing"
    return path, "invalid", str(exc) or type(exc).__name__


def _pointer_token(key: str) -> str:
    """`key` as one JSON Pointer reference token (RFC 6901: `~` is `~0`, `/` is `~1`)."""
    return key.replace("~", "~0").replace("/", "~1")
