"""The one cattrs converter for the JSON of the session log.

Tagged unions are written *as the union*, so their tag is part of the JSON:
content blocks and chunks by `type`, message sources by `kind`. Optional
fields that are unset are omitted. Unknown event types are refused on load
unless the event is marked `ignorable`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from actors.jsonvalue import thaw_json
from actors.messages import (
    Block,
    Message,
    PluginSource,
    ReasoningBlock,
    Source,
    TextBlock,
    ToolCallBlock,
    ToolSource,
    UserSource,
)
from actors.prompt.types import ToolSchema
from actors.providers.chunks import (
    Chunk,
    Failure,
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from actors.session.errors import SessionError, UnknownEventError
from actors.session.events import EVENT_TYPES, Event, RequestHeaderLogged, UnknownData
from actors.session.header import RequestHeader

converter = cattrs.Converter(omit_if_default=True, forbid_extra_keys=True)
"""The log's converter: events, messages, chunks, headers."""

_BLOCK_TAGS: dict[type, str] = {
    TextBlock: "text",
    ReasoningBlock: "reasoning",
    ToolCallBlock: "tool-call",
}
_SOURCE_TAGS: dict[type, str] = {UserSource: "user", ToolSource: "tool", PluginSource: "plugin"}
_CHUNK_TAGS: dict[type, str] = {
    TextDelta: "text",
    ReasoningDelta: "reasoning",
    ToolCallDelta: "tool-call-delta",
    UsageChunk: "usage",
    FinishChunk: "finish",
}


def _configure_union(union: Any, tags: Mapping[type, str], tag_name: str) -> None:
    """Structure `union` by its tag, and write the tag as the first key.

    Structuring takes a fast path for a well-formed object (a known tag and
    only the member's own keys besides it: the member's hook reads it in
    place, without the copy that removes the tag). Anything else goes
    through cattrs' tagged-union hook, which refuses it with its precise
    error; both accept exactly the same objects.
    """
    configure_tagged_union(union, converter, tag_generator=tags.__getitem__, tag_name=tag_name)
    checked = converter.get_structure_hook(union)
    by_tag: dict[str, tuple[type, Callable[[Any, type], Any], frozenset[str]]] = {
        tag: (
            cls,
            make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=False),
            frozenset(field.name for field in attrs.fields(cls)) | {tag_name},
        )
        for cls, tag in tags.items()
    }

    def structure(obj: Any, _: type) -> Any:
        tag = obj.get(tag_name) if type(obj) is dict else None
        member = by_tag.get(tag) if isinstance(tag, str) else None
        if member is not None and obj.keys() <= member[2]:
            try:
                return member[1](obj, member[0])
            except Exception:  # the checked path below raises the precise error
                pass
        return checked(obj, union)

    converter.register_structure_hook(union, structure)
    member_hooks: dict[type, Callable[[Any], dict[str, Any]]] = {
        cls: make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True) for cls in tags
    }

    def unstructure(value: Any) -> dict[str, Any]:
        cls = type(value)
        return {tag_name: tags[cls], **member_hooks[cls](value)}

    converter.register_unstructure_hook(union, unstructure)


# Counters and failure descriptions are always written, even at their defaults.
converter.register_unstructure_hook(
    Usage,
    make_dict_unstructure_fn(
        Usage,
        converter,
        _cattrs_omit_if_default=False,
        reasoning_tokens=override(omit_if_default=True),
    ),
)
converter.register_unstructure_hook(
    Failure,
    make_dict_unstructure_fn(
        Failure,
        converter,
        _cattrs_omit_if_default=False,
        status=override(omit_if_default=True),
        retry_after_ms=override(omit_if_default=True),
    ),
)


# Chunks embed Usage and Failure, so the unions are configured after those hooks.
_configure_union(Block, _BLOCK_TAGS, "type")
_configure_union(Source, _SOURCE_TAGS, "kind")
_configure_union(Chunk, _CHUNK_TAGS, "type")


def _unstructure_optional_source(source: Source | None) -> dict[str, Any] | None:
    return None if source is None else converter.unstructure(source, Source)


def _structure_optional_source(obj: Any, _: type) -> Source | None:
    return None if obj is None else converter.structure(obj, Source)  # type: ignore[arg-type]


converter.register_unstructure_hook(Source | None, _unstructure_optional_source)
converter.register_structure_hook(Source | None, _structure_optional_source)


def _unstructure_tool(schema: ToolSchema) -> dict[str, Any]:
    return {
        "name": schema.name,
        "description": schema.description,
        "parameters": thaw_json(schema.parameters),
    }


_TOOLS_CACHE_SIZE = 64
_tools_cache: OrderedDict[tuple[int, ...], tuple[tuple[ToolSchema, ...], str, list[Any]]] = (
    OrderedDict()
)


def _tools_entry(tools: tuple[ToolSchema, ...]) -> tuple[tuple[ToolSchema, ...], str, list[Any]]:
    """The cached (schemas, compact JSON text, decoded JSON) of a tool list.

    Keyed by the identity of its schemas: assemblies share frozen
    `ToolSchema` objects, so every session of a deployment logs the same
    tool list, and decoding one cached text is much cheaper than rebuilding
    each schema's dicts. The entry keeps the schemas alive, so an id in a
    key is never reused while its entry exists.
    """
    key = tuple(map(id, tools))
    hit = _tools_cache.get(key)
    if hit is not None:
        _tools_cache.move_to_end(key)
        return hit
    text = json.dumps(
        [_unstructure_tool(tool) for tool in tools], separators=(",", ":"), ensure_ascii=False
    )
    entry = (tools, text, json.loads(text))
    _tools_cache[key] = entry
    _tools_by_shared_json[id(entry[2])] = entry
    if len(_tools_cache) > _TOOLS_CACHE_SIZE:
        _, evicted = _tools_cache.popitem(last=False)
        del _tools_by_shared_json[id(evicted[2])]
    return entry


_tools_by_shared_json: dict[int, tuple[tuple[ToolSchema, ...], str, list[Any]]] = {}
"""The cache entries by the identity of their shared decoded list (alive while cached)."""


def _tools_text(tools: tuple[ToolSchema, ...]) -> str:
    """The compact JSON text of a tool list (cached, see `_tools_entry`)."""
    return _tools_entry(tools)[1]


def _unstructure_header(header: RequestHeader) -> dict[str, Any]:
    tools = json.loads(_tools_text(header.tools)) if header.tools else []
    return _header_json(header, thaw_json(header.config), tools)


def _header_json(header: RequestHeader, config: Any, tools: list[Any]) -> dict[str, Any]:
    """A header's JSON from its config's and tools' JSON: one key order for every form."""
    out: dict[str, Any] = {"config": config}
    if header.system:
        out["system"] = header.system
    if header.tools:
        out["tools"] = tools
    return out


def _structure_header(obj: Any, _: type) -> RequestHeader:
    if not isinstance(obj, Mapping) or "config" not in obj:
        raise SessionError(f"a request header must be an object with 'config', got {obj!r}")
    extra = set(obj) - {"config", "system", "tools"}
    if extra:
        raise SessionError(f"a request header has unknown fields {sorted(extra)}")
    tools_json = obj.get("tools", ())
    shared = _tools_by_shared_json.get(id(tools_json))
    if shared is not None and shared[2] is tools_json:
        # A shared list (`event_to_shared_json`) comes from these very schemas.
        tools = shared[0]
    else:
        tools = tuple(converter.structure(tool, ToolSchema) for tool in tools_json)
    return RequestHeader(config=obj["config"], system=obj.get("system"), tools=tools)


converter.register_unstructure_hook(ToolSchema, _unstructure_tool)
converter.register_unstructure_hook(RequestHeader, _unstructure_header)
converter.register_structure_hook(RequestHeader, _structure_header)
converter.register_unstructure_hook(UnknownData, lambda data: thaw_json(data.raw))


_DATA_UNSTRUCTURE: dict[type, Callable[[Any], Any]] = {}
"""Each event data class's unstructure hook (filled below, once every hook is registered)."""
_DATA_STRUCTURE: dict[str, tuple[type, Callable[[Any, type], Any]]] = {}
"""Each event type's data class and structure hook (filled below, likewise)."""


def _unstructure_event(event: Event, data_json: dict[str, Any] | None = None) -> dict[str, Any]:
    """The event's JSON; `data_json` (when given) is its data's, already unstructured."""
    if data_json is None:
        data = event.data
        hook = _DATA_UNSTRUCTURE.get(type(data))
        data_json = converter.unstructure(data) if hook is None else hook(data)
    out: dict[str, Any] = {
        "type": event.type,
        "seq": event.seq,
        "time": event.time,
        "data": data_json,
    }
    if event.surface_op is not None:
        out["surface_op"] = event.surface_op
        out["source_event_seqs"] = list(event.source_event_seqs or ())
    if event.ignorable:
        out["ignorable"] = True
    return out


def _structure_event(obj: Any, _: type) -> Event:
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise SessionError(f"an event must be a JSON object, got {type(obj).__name__}")
    type_ = obj.get("type")
    seq = obj.get("seq")
    known = _DATA_STRUCTURE.get(type_) if isinstance(type_, str) else None
    try:
        if known is None:
            if not obj.get("ignorable", False):
                raise UnknownEventError(
                    f"event seq {seq} has unknown type {type_!r} and is not marked ignorable; "
                    f"known types: {', '.join(EVENT_TYPES)}"
                )
            data: Any = UnknownData(raw=obj.get("data", {}))
        else:
            data_cls, structure = known
            data = structure(obj["data"], data_cls)
        if len(obj) == 4:  # no optional key (the common case): only the envelope's four
            return Event(type=str(type_), seq=obj["seq"], time=obj["time"], data=data)
        return Event(
            type=str(type_),
            seq=obj["seq"],
            time=obj["time"],
            data=data,
            surface_op=obj.get("surface_op"),
            source_event_seqs=obj.get("source_event_seqs"),
            ignorable=bool(obj.get("ignorable", False)),
        )
    except SessionError:
        raise
    except (KeyError, TypeError, ValueError, cattrs.BaseValidationError) as exc:
        raise SessionError(f"event seq {seq} ({type_}) is malformed: {exc!r}") from exc


converter.register_unstructure_hook(Event, _unstructure_event)
converter.register_structure_hook(Event, _structure_event)
# Every hook is registered: look each event data class's hooks up once, not per event.
_DATA_UNSTRUCTURE.update({cls: converter.get_unstructure_hook(cls) for cls in EVENT_TYPES.values()})
_DATA_STRUCTURE.update(
    {name: (cls, converter.get_structure_hook(cls)) for name, cls in EVENT_TYPES.items()}
)


def event_to_json(event: Event) -> dict[str, Any]:
    """The durable JSON form of one event."""
    return _unstructure_event(event)


def event_to_shared_json(event: Event) -> dict[str, Any]:
    """`event_to_json`, except that a request header's `tools` list and `config` are shared.

    Every header logging the same tool list (the same `ToolSchema` objects)
    gets the same decoded list, and every header logging the same config
    object (agents with equal options share one) the same decoded config,
    so a store that keeps events as JSON (the `MemoryStore`) holds one copy
    of a deployment's tool schemas and config instead of one per session.
    The shared values must never be mutated: only stores that treat their
    JSON as read-only may use this form.
    """
    data = event.data
    if not isinstance(data, RequestHeaderLogged) or not data.header.tools:
        return event_to_json(event)
    header = data.header
    shared = _header_json(header, _shared_config_json(header.config), _tools_entry(header.tools)[2])
    return _unstructure_event(event, {"header": shared, "reason": data.reason})


_CONFIGS_CACHE_SIZE = 64
_configs_cache: OrderedDict[int, tuple[Mapping[str, Any], dict[str, Any]]] = OrderedDict()


def _shared_config_json(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoded JSON of a header's config, one per config object (a few are kept).

    Keyed by identity; the entry keeps the config alive, so an id in a key
    is never reused while its entry exists.
    """
    hit = _configs_cache.get(id(config))
    if hit is not None:
        _configs_cache.move_to_end(id(config))
        return hit[1]
    decoded: dict[str, Any] = thaw_json(config)
    _configs_cache[id(config)] = (config, decoded)
    if len(_configs_cache) > _CONFIGS_CACHE_SIZE:
        _configs_cache.popitem(last=False)
    return decoded


def event_from_json(obj: Any) -> Event:
    """Load one event from its JSON form.

    Raises:
        UnknownEventError: an unknown type that is not marked ignorable.
        SessionError: anything else malformed; the message names the seq and type.
    """
    return _structure_event(obj, Event)


def unstructure_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages as JSON, in order."""
    return [converter.unstructure(message, Message) for message in messages]


def unstructure_tools(tools: Iterable[ToolSchema]) -> list[dict[str, Any]]:
    """Tool schemas as JSON `{"name", "description", "parameters"}`, in order."""
    return [_unstructure_tool(tool) for tool in tools]
