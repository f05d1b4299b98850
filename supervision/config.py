"""The TOML deployment: one file describing the store, providers, agent profiles and gateway.

`load_config(path)` reads the file with the standard library's `tomllib`
and structures it into the frozen classes below with one strict cattrs
converter: an unknown key, a value of the wrong type, an unknown provider
or context name, an import path that does not resolve to a tool, or an
invalid `tool_order` raises `ConfigError` naming the key, its table and the
file. Secrets never live in the file: a provider names its key's
environment variable (`api_key_env`), a gateway token its variable
(`env`); `resolve_environment(config)` reads them, raising `ConfigError`
for a missing one, so commands that only read the store need no secret.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeAlias, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn

from actors.agent import Tool, function_tool
from actors.prompt import PromptError
from actors.prompt.tool_order import parse_tool_order

DEFAULT_STORE_PATH = ".harness/sessions.sqlite"
MAX_PORT = 65535
"""The largest TCP port number."""
"""Where sessions are stored when neither the config nor `--store` says."""
MEMORY_STORE = "memory"
"""The `[store] path` value that keeps sessions in memory only."""
DEFAULT_AGENT = "default"
"""The profile `session/new` and `harness run` use when none is named."""
DEFAULT_PERSONA = (
    "You are a careful assistant powered by {{model}}. Use the tools to look at files "
    "before answering questions about them, and answer in short paragraphs."
)
DEFAULT_TOOLS = (
    "supervision.workspace_tools:list_files",
    "supervision.workspace_tools:read_file",
)
"""The tools of the built-in `default` profile: read-only, confined to the start directory."""
DEEPSEEK_BASE_URL = "https://api.deepseek.com"
DEEPSEEK_KEY_ENV = "DEEPSEEK_API_KEY"

ProviderKind: TypeAlias = Literal["openai-compatible", "simulator"]
ContextName: TypeAlias = Literal["time", "workspace", "tmux", "compaction"]
"""Built-in context plugins an agent profile can name."""
SubagentTool: TypeAlias = Literal["subagent", "subagent_fork"]
"""`subagent` spawns a child from a fresh session, `subagent_fork` from a copy of the parent's."""
TokenScope: TypeAlias = Literal["observe", "control", "admin"]
ClusterNodes: TypeAlias = Literal["postgres"]
"""Where the cluster's node membership lives (the `harness_nodes` table of `[store] url`)."""
DEFAULT_CLUSTER_TOKEN_ENV = "HARNESS_CLUSTER_TOKEN"
"""The environment variable holding the secret gateways and nodes share, unless `[cluster]` names
another."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ConfigError(ValueError):
    """The deployment config is invalid; the message names the key, its table and the file."""


@attrs.frozen(kw_only=True)
class StoreConfig:
    """`[store]`: where sessions live.

    `path`: a SQLite file, or "memory"; or `url`: a `postgresql://` URL of
    the PostgreSQL database many node processes share (then `path` stays unset).
    """

    path: str = DEFAULT_STORE_PATH
    url: str | None = None


@attrs.frozen(kw_only=True)
class ProviderConfig:
    """`[providers.NAME]`: one model endpoint.

    `kind = "openai-compatible"` talks to `base_url` with the key read from
    the environment variable `api_key_env` (none: no key is sent);
    `kind = "simulator"` runs the bundled simulator in process on a loopback
    port (`token_rate` streamed tokens per second, 0 as fast as possible;
    `reply_tokens` the length of its filler replies). `max_in_flight` caps
    concurrent requests to this provider; `pools` spreads them over that
    many independent HTTP connection pools and `http2` speaks HTTP/2 only
    (`actors.providers.http_client`: each keeps a pool's per-request scan
    short with hundreds of requests in flight).
    """

    kind: ProviderKind
    base_url: str | None = None
    api_key_env: str | None = None
    max_in_flight: int = 16
    pools: int = 1
    http2: bool = False
    token_rate: float = 0.0
    reply_tokens: int = 24


@attrs.frozen(kw_only=True)
class ToolRef:
    """A tool named by import path (`"package.module:attribute"`), and the tool it resolved to."""

    path: str
    tool: Tool = attrs.field(eq=False, repr=False)


@attrs.frozen(kw_only=True)
class AgentConfig:
    """`[agents.NAME]`: an agent profile.

    `persona` becomes this profile's `deployment:persona` section (in each
    agent's own scope, shadowing the global one); `tools` are import paths of
    tools; `tool_order` the model-facing order of this profile's tools (one
    `"<unlisted-tools>"` entry where the rest go); `contexts` built-in context
    plugins; `subagents` the subagent tools the agent may delegate with, whose
    children take the persona and tools of `subagent_agent` (default: this
    profile) and run on this profile's provider and model.
    """

    provider: str = DEFAULT_AGENT
    model: str = "deepseek-chat"
    persona: str = DEFAULT_PERSONA
    tools: tuple[ToolRef, ...] = ()
    tool_order: tuple[str, ...] | None = None
    contexts: tuple[ContextName, ...] = ()
    max_steps: int | None = 50
    max_tokens: int | None = None
    temperature: float | None = None
    subagents: tuple[SubagentTool, ...] = ()
    subagent_agent: str | None = None

    def tool_names(self) -> tuple[str, ...]:
        """Every tool name this profile's agents have: its tools, then its subagent tools."""
        return (*(ref.tool.name for ref in self.tools), *self.subagents)


@attrs.frozen(kw_only=True)
class TokenConfig:
    """`[[gateway.tokens]]`: a bearer token read from `env`, its scopes and session filter.

    `sessions` is `"*"` (every session), `"own"` (sessions the token created
    and their subagents) or a list of session ids.
    """

    env: str
    scopes: tuple[TokenScope, ...] = ("observe",)
    sessions: str | tuple[str, ...] = "*"


@attrs.frozen(kw_only=True)
class GatewayConfig:
    """`[gateway]`: where `harness serve` listens, allowed browser origins, its tokens.

    `origins = None` allows only the gateway's own origin.
    """

    host: str = "127.0.0.1"
    port: int = 8700
    origins: tuple[str, ...] | None = None
    tokens: tuple[TokenConfig, ...] = ()


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """`[cluster]`: sessions run on `harness node` processes sharing `[store] url`.

    `nodes = "postgres"`: nodes register in the store's database and
    gateways find them there. `token_env` names the environment variable
    holding the secret a gateway presents to every node (a node refuses any
    other caller).
    """

    nodes: ClusterNodes
    token_env: str = DEFAULT_CLUSTER_TOKEN_ENV
    node_ping_interval: float = 1.0
    """Seconds between a gateway's keep-alive pings on each node stream."""
    node_ping_timeout: float = 5.0
    """Seconds a node may stay silent after a ping (no pong, no other frame) before the
    gateway drops its stream."""


@attrs.frozen(kw_only=True)
class DeploymentConfig:
    """A whole deployment, validated: every reference inside it resolves.

    `source` is the file it came from (`"<defaults>"` for the embedded one).
    """

    source: str = "<defaults>"
    store: StoreConfig = attrs.field(factory=StoreConfig)
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=dict)
    agents: Mapping[str, AgentConfig] = attrs.field(factory=dict)
    gateway: GatewayConfig = attrs.field(factory=GatewayConfig)
    cluster: ClusterConfig | None = None
    """None: one process hosts every session (no `[cluster]` table)."""

    def agent(self, name: str) -> AgentConfig:
        """The profile `name`.

        Raises:
            ConfigError: there is no such profile (the message lists them).
        """
        try:
            return self.agents[name]
        except KeyError:
            raise ConfigError(
                f"unknown agent profile {name!r} in {self.source}; "
                f"profiles: {', '.join(sorted(self.agents))}"
            ) from None


@attrs.frozen(kw_only=True)
class _Document:
    """The top level of the TOML file."""

    store: StoreConfig = attrs.field(factory=StoreConfig)
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=dict)
    agents: Mapping[str, AgentConfig] = attrs.field(factory=dict)
    gateway: GatewayConfig = attrs.field(factory=GatewayConfig)
    cluster: ClusterConfig | None = None


@attrs.frozen(kw_only=True)
class ResolvedToken:
    """A gateway token with its secret read from the environment."""

    value: str = attrs.field(repr=False)
    scopes: tuple[TokenScope, ...]
    sessions: str | tuple[str, ...]


@attrs.frozen(kw_only=True)
class Environment:
    """The secrets a deployment named, read from the environment at start-up."""

    api_keys: Mapping[str, str | None] = attrs.field(repr=False)
    """Provider name → its API key (None: the provider sends none)."""
    tokens: tuple[ResolvedToken, ...] = ()


# -- the converter --------------------------------------------------------


def _strict(kind: type, name: str) -> Callable[[Any, type], Any]:
    def structure(value: Any, _: type) -> Any:
        # TOML has no implicit conversions: an int is not a string, a bool not an int.
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {name}, got a boolean ({value!r})")
        if not isinstance(value, kind):
            raise TypeError(f"expected {name}, got {type(value).__name__} {value!r}")
        return value

    return structure


def _structure_float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _structure_literal(value: Any, kind: Any) -> Any:
    allowed = get_args(kind)
    if value not in allowed or isinstance(value, bool):
        raise ValueError(f"{value!r} is not one of {', '.join(repr(a) for a in allowed)}")
    return value


def _structure_sessions(value: Any, _: type) -> str | tuple[str, ...]:
    if isinstance(value, str):
        if value not in ("*", "own"):
            raise ValueError(f"expected '*', 'own' or a list of session ids, got {value!r}")
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"expected '*', 'own' or a list of session ids, got {value!r}")


def _resolve_tool(path: str) -> Tool:
    if not _IMPORT_PATH.match(path):
        raise ValueError(f"tool {path!r} is not an import path of the form 'package.module:name'")
    module_name, attribute = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"tool {path!r}: cannot import module {module_name!r} ({exc})") from None
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"tool {path!r}: module {module_name!r} has no {attribute!r}") from None
    return as_tool(value, path)


def as_tool(value: object, path: str) -> Tool:
    """The `Tool` an import path names: a `Tool` as it is, a function made one by `function_tool`.

    Raises:
        ValueError: `value` is neither a tool nor a function, or `function_tool`
            refused it (an unsupported annotation); the message names `path`.
    """
    if isinstance(value, Tool):
        return value
    if inspect.isfunction(value):
        try:
            return function_tool(value)
        except TypeError as exc:
            raise ValueError(f"tool {path!r}: {exc}") from None
    raise ValueError(f"tool {path!r} names a {type(value).__name__}, not a Tool or a function")


def _structure_tool_ref(value: Any, _: type) -> ToolRef:
    if not isinstance(value, str):
        raise TypeError(f"expected an import path string, got {type(value).__name__} {value!r}")
    return ToolRef(path=value, tool=_resolve_tool(value))


class _At(str):
    """A note on a nested error: the key or list index where it happened."""

    part: str | int

    def __new__(cls, part: str | int) -> _At:
        note = super().__new__(cls, f"at {part!r}")
        note.part = part
        return note


def _located(errors: list[tuple[str | int, Exception]], what: str) -> None:
    if errors:
        located = []
        for part, exc in errors:
            exc.add_note(_At(part))
            located.append(exc)
        raise ExceptionGroup(f"invalid {what}", located)


def _structure_tuple_factory(kind: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    (item,) = {a for a in get_args(kind) if a is not Ellipsis}

    def structure(value: Any, _: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__} {value!r}")
        out: list[Any] = []
        errors: list[tuple[str | int, Exception]] = []
        for index, entry in enumerate(value):
            try:
                out.append(converter.structure(entry, item))
            except Exception as exc:
                errors.append((index, exc))
        _located(errors, "list")
        return tuple(out)

    return structure


def _structure_mapping_factory(kind: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    _, item = get_args(kind)

    def structure(value: Any, _: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {type(value).__name__} {value!r}")
        out: dict[str, Any] = {}
        errors: list[tuple[str | int, Exception]] = []
        for key, entry in value.items():
            try:
                out[key] = converter.structure(entry, item)
            except Exception as exc:
                errors.append((key, exc))
        _located(errors, "table")
        return out

    return structure


def _structure_attrs_factory(kind: type, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    inner: Callable[[Any, Any], Any] = make_dict_structure_fn(kind, converter)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {type(value).__name__} {value!r}")
        return inner(value, kind)

    return structure


def _is_literal(kind: Any) -> bool:
    return bool(get_origin(kind) == Literal)


def _is_tuple(kind: Any) -> bool:
    return get_origin(kind) is tuple


def _is_mapping(kind: Any) -> bool:
    return get_origin(kind) in (Mapping, dict)


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str, _strict(str, "a string"))
    converter.register_structure_hook(int, _strict(int, "an integer"))
    converter.register_structure_hook(bool, _strict(bool, "a boolean"))
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook_func(_is_literal, _structure_literal)
    converter.register_structure_hook(ToolRef, _structure_tool_ref)
    converter.register_structure_hook(str | tuple[str, ...], _structure_sessions)
    converter.register_structure_hook_factory(_is_tuple, _structure_tuple_factory)
    converter.register_structure_hook_factory(_is_mapping, _structure_mapping_factory)
    converter.register_structure_hook_factory(attrs.has, _structure_attrs_factory)
    return converter


_CONVERTER = _make_converter()
"""The one converter of the config boundary (TOML document → `DeploymentConfig`)."""


# -- error messages ---------------------------------------------------------


def _table(path: tuple[str | int, ...]) -> str:
    """The TOML table holding the value at `path`, e.g. `[agents.default]`, `[[gateway.tokens]]`."""
    parts = list(path)
    while parts and isinstance(parts[-1], int):
        parts.pop()
    parts = parts[:-1]
    if not parts:
        return "the top level"
    if isinstance(parts[-1], int):
        index = parts.pop()
        return f"[[{'.'.join(str(p) for p in parts)}]] entry {index}"
    return f"[{'.'.join(str(p) for p in parts)}]"


def _key(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _step(exc: BaseException) -> tuple[str | int, ...]:
    for note in getattr(exc, "__notes__", []):
        if isinstance(note, _At):
            return (note.part,)
        name = getattr(note, "name", None)
        if isinstance(name, str):
            return (name,)
    return ()


def _messages(exc: BaseException, path: tuple[str | int, ...]) -> list[str]:
    if isinstance(exc, ForbiddenExtraKeysError):
        table = _table((*path, "?"))
        fields = sorted(f.name for f in attrs.fields(exc.cl))
        return [
            f"unknown key {name!r} in {table}; allowed: {', '.join(fields)}"
            for name in sorted(exc.extra_fields)
        ]
    if isinstance(exc, BaseExceptionGroup):
        return [m for sub in exc.exceptions for m in _messages(sub, path + _step(sub))]
    if isinstance(exc, KeyError):
        return [f"missing required key {_key(path)} in {_table(path)}"]
    return [f"{_key(path)} (in {_table(path)}): {exc}"]


def _fail(source: str, problems: list[str]) -> ConfigError:
    return ConfigError(f"{source}: {'; '.join(problems)}")


# -- loading ------------------------------------------------------------------


def _check_references(config: DeploymentConfig) -> list[str]:
    problems: list[str] = []
    if not config.agents:
        problems.append("no agent profiles: add an [agents.NAME] table")
    if config.store.url is not None and not config.store.url.startswith(
        ("postgresql://", "postgres://")
    ):
        problems.append(
            "store.url (in [store]) must be a postgresql:// URL, got "
            f"{config.store.url.partition('://')[0]!r}:// "
        )
    if not 0 <= config.gateway.port <= MAX_PORT:
        problems.append(
            f"gateway.port (in [gateway]) must be 0-{MAX_PORT} (0: any free one), "
            f"got {config.gateway.port}"
        )
    if config.cluster is not None:
        if config.store.url is None:
            problems.append(
                '[cluster] nodes = "postgres" needs [store] url = "postgresql://...": '
                "the nodes share that database"
            )
        if not _ENV_NAME.match(config.cluster.token_env):
            problems.append(
                "cluster.token_env (in [cluster]) must be an environment variable name, "
                f"got {config.cluster.token_env!r}"
            )
        for key in ("node_ping_interval", "node_ping_timeout"):
            seconds = getattr(config.cluster, key)
            if not 0 < seconds < float("inf"):
                problems.append(
                    f"cluster.{key} (in [cluster]) must be a positive number of seconds, "
                    f"got {seconds}"
                )
    for name, provider in config.providers.items():
        where = f"[providers.{name}]"
        if provider.kind == "openai-compatible" and provider.base_url is None:
            problems.append(f"providers.{name}.base_url is required for kind 'openai-compatible'")
        if provider.kind == "simulator" and provider.base_url is not None:
            problems.append(
                f"providers.{name}.base_url (in {where}): a simulator provider runs in process "
                "and takes no base_url"
            )
        if provider.api_key_env is not None and not _ENV_NAME.match(provider.api_key_env):
            problems.append(
                f"providers.{name}.api_key_env (in {where}) must be an environment variable "
                f"name, got {provider.api_key_env!r}"
            )
        if provider.max_in_flight < 1:
            problems.append(f"providers.{name}.max_in_flight (in {where}) must be >= 1")
        if provider.pools < 1:
            problems.append(
                f"providers.{name}.pools (in {where}) must be >= 1, got {provider.pools}"
            )
        if provider.reply_tokens < 1 or provider.token_rate < 0:
            problems.append(
                f"providers.{name} (in {where}): reply_tokens must be >= 1 and token_rate >= 0"
            )
    for name, agent in config.agents.items():
        where = f"[agents.{name}]"
        if agent.provider not in config.providers:
            problems.append(
                f"agents.{name}.provider (in {where}) names unknown provider "
                f"{agent.provider!r}; providers: {', '.join(sorted(config.providers)) or '(none)'}"
            )
        names = agent.tool_names()
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            problems.append(f"agents.{name}.tools (in {where}) repeat tool names: {duplicates}")
        if agent.tool_order is not None:
            try:
                order = parse_tool_order(agent.tool_order)
            except PromptError as exc:
                problems.append(f"agents.{name}.tool_order (in {where}): {exc}")
            else:
                unknown = [t for t in order.listed if t not in names]
                if unknown:
                    problems.append(
                        f"agents.{name}.tool_order (in {where}) lists {unknown}, which are not "
                        f"tools of this profile; its tools: {list(names)}"
                    )
        if agent.max_steps is not None and agent.max_steps < 1:
            problems.append(f"agents.{name}.max_steps (in {where}) must be >= 1")
        if agent.subagent_agent is not None:
            child = config.agents.get(agent.subagent_agent)
            if child is None:
                problems.append(
                    f"agents.{name}.subagent_agent (in {where}) names unknown profile "
                    f"{agent.subagent_agent!r}"
                )
            elif (child.provider, child.model) != (agent.provider, agent.model):
                problems.append(
                    f"agents.{name}.subagent_agent (in {where}): profile "
                    f"{agent.subagent_agent!r} must use this profile's provider and model "
                    "(children run on their parent's model)"
                )
            if not agent.subagents:
                problems.append(
                    f'agents.{name}.subagent_agent (in {where}) needs subagents = ["subagent"]'
                )
    for index, token in enumerate(config.gateway.tokens):
        if not _ENV_NAME.match(token.env):
            problems.append(
                f"gateway.tokens[{index}].env must be an environment variable name, "
                f"got {token.env!r}"
            )
    return problems


_SIMULATOR_ONLY = ("token_rate", "reply_tokens")
"""Provider keys only the in-process simulator reads."""


def _check_given_keys(document: Mapping[str, Any]) -> list[str]:
    """Problems only the keys as written show (a default value cannot tell them)."""
    problems: list[str] = []
    store = document.get("store", {})
    if "path" in store and "url" in store:
        problems.append("[store] takes either path (SQLite) or url (PostgreSQL), not both")
    for name, provider in document.get("providers", {}).items():
        if provider.get("kind") == "openai-compatible":
            problems.extend(
                f"providers.{name}.{key} (in [providers.{name}]): only a simulator provider "
                "reads it; kind 'openai-compatible' does not"
                for key in _SIMULATOR_ONLY
                if key in provider
            )
    return problems


def parse_config(document: Mapping[str, Any], source: str) -> DeploymentConfig:
    """Structure and validate a parsed TOML document from `source`.

    Raises:
        ConfigError: every problem found, each naming its key and table.
    """
    try:
        parsed = _CONVERTER.structure(dict(document), _Document)
    except Exception as exc:
        raise _fail(source, _messages(exc, ())) from None
    config = DeploymentConfig(
        source=source,
        store=parsed.store,
        providers=parsed.providers,
        agents=parsed.agents,
        gateway=parsed.gateway,
        cluster=parsed.cluster,
    )
    problems = _check_given_keys(document) + _check_references(config)
    if problems:
        raise _fail(source, problems)
    return config


def load_config(path: Path | None) -> DeploymentConfig:
    """The deployment in the TOML file `path`, or the embedded defaults when None.

    Raises:
        ConfigError: the file is missing or not TOML, or the deployment is
            invalid (see `parse_config`).
    """
    if path is None:
        return default_config()
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(document, str(path))


def default_config(environ: Mapping[str, str] | None = None) -> DeploymentConfig:
    """The embedded deployment: one `default` profile, the SQLite store under `.harness/`.

    The profile runs on the bundled simulator, or on DeepSeek when
    `DEEPSEEK_API_KEY` is set (and non-empty) in `environ` (default: the
    process environment), with the read-only workspace tools.
    """
    environ = os.environ if environ is None else environ
    if environ.get(DEEPSEEK_KEY_ENV):
        provider: dict[str, Any] = {
            "kind": "openai-compatible",
            "base_url": DEEPSEEK_BASE_URL,
            "api_key_env": DEEPSEEK_KEY_ENV,
        }
    else:
        provider = {"kind": "simulator"}
    document = {
        "providers": {DEFAULT_AGENT: provider},
        "agents": {DEFAULT_AGENT: {"tools": list(DEFAULT_TOOLS)}},
    }
    return parse_config(document, "<defaults>")


def resolve_environment(
    config: DeploymentConfig, environ: Mapping[str, str] | None = None
) -> Environment:
    """Read every secret the deployment names from `environ` (default: the process's).

    Raises:
        ConfigError: a named variable is unset or empty (the message names
            the key, the variable and the file).
    """
    environ = os.environ if environ is None else environ
    problems: list[str] = []
    keys: dict[str, str | None] = {}
    for name, provider in config.providers.items():
        if provider.api_key_env is None:
            keys[name] = None
            continue
        value = environ.get(provider.api_key_env)
        if not value:
            problems.append(
                f"providers.{name}.api_key_env names environment variable "
                f"{provider.api_key_env!r}, which is not set"
            )
        keys[name] = value or None
    tokens: list[ResolvedToken] = []
    for index, token in enumerate(config.gateway.tokens):
        value = environ.get(token.env)
        if not value:
            problems.append(
                f"gateway.tokens[{index}].env names environment variable {token.env!r}, "
                "which is not set"
            )
            continue
        tokens.append(ResolvedToken(value=value, scopes=token.scopes, sessions=token.sessions))
    if problems:
        raise _fail(config.source, problems)
    return Environment(api_keys=keys, tokens=tuple(tokens))
