"""A running deployment: the runtime, store and providers a `DeploymentConfig` describes.

`open_deployment(config)` is what `harness serve`, `harness run` and
`harness inspect` start: it reads the deployment's secrets (failing with
`ConfigError` before anything starts), serves each simulator provider in
process on a loopback port, opens the store and the runtime, and yields a
`Deployment` whose `start_agent(profile)` starts an agent of that profile:
its persona as the `deployment:persona` section of the agent's own scope
(shadowing the global one), its tools in its profile's `tool_order`, its
context plugins, and its subagent tools, whose children take the persona
and tools of the profile's `subagent_agent`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio

from actors.agent import Agent, AgentOptions, Tool
from actors.context import Compaction, TimeContext, TmuxContext, WorkspaceInstructions
from actors.prompt import (
    PERSONA_ORDER,
    PERSONA_SECTION,
    AssembleContext,
    PromptAssembly,
    PromptSection,
    SystemPrompt,
)
from actors.prompt.tool_order import order_tools, parse_tool_order
from actors.prompt.types import AssembleListener, NextListener
from actors.providers import Provider
from actors.providers.actor import ProviderActor
from actors.providers.openai_compat import OpenAICompatProvider
from actors.providers.simulator import SimulatorConfig, SimulatorEngine, serve_simulator
from actors.scope import Registration, Scope
from actors.session import MemoryStore, SessionStore, SQLiteStore
from supervision.config import (
    MEMORY_STORE,
    AgentConfig,
    ConfigError,
    DeploymentConfig,
    Environment,
    resolve_environment,
)
from supervision.runtime import Runtime, open_runtime
from supervision.subagents import ForkProvider, SpawnProvider, SubagentProvider
from supervision.supervisor import Child

ChildListener = Callable[[Agent, str, str], None]
"""`listener(child_agent, parent_session_id, profile)`, called as a subagent starts."""


@attrs.frozen(kw_only=True)
class AgentSpec:
    """What starting an agent of one profile takes (the arguments of `Runtime.start_agent`)."""

    options: AgentOptions
    tools: tuple[Tool, ...]
    subagents: tuple[SubagentProvider, ...]
    setup: Callable[[Agent], None]
    """Registers the profile's persona, tool order and contexts in the agent's scope."""
    child_setup: Callable[[Agent], None]
    """The same for each subagent, with the subagent profile's persona, tools and contexts."""


@attrs.define(eq=False)
class Deployment:
    """A running deployment: its config, its environment and the runtime it opened."""

    config: DeploymentConfig
    environment: Environment
    runtime: Runtime
    root: Path
    """The workspace directory (`workspace` contexts read instructions from here)."""
    store_path: str
    """Where sessions are stored: a SQLite path, "memory", or a PostgreSQL URL (no password)."""
    _profiles: dict[str, str] = attrs.field(factory=dict)
    _parents: dict[str, str] = attrs.field(factory=dict)
    _scopes: dict[Scope, str] = attrs.field(factory=dict)
    _child_listeners: list[ChildListener] = attrs.field(factory=list)

    def profile_of(self, session_id: str) -> str | None:
        """The profile name of an agent this deployment started for `session_id`."""
        return self._profiles.get(session_id)

    def parent_of(self, session_id: str) -> str | None:
        """The session that delegated to `session_id`, for subagents of this deployment."""
        return self._parents.get(session_id)

    def on_child(self, listener: ChildListener) -> Callable[[], None]:
        """Call `listener(child_agent, parent_id, profile)` as each subagent starts.

        It runs synchronously in the child's setup, before the child's first
        step. Returns a function that removes the listener.
        """
        self._child_listeners.append(listener)
        return lambda: self._child_listeners.remove(listener)

    async def start_agent(
        self, profile: str = "default", *, session_id: str | None = None
    ) -> Child[Agent]:
        """Start an agent of `profile` under the runtime's supervisor (resuming `session_id`).

        Cancellation: cancellable while the agent starts (nothing is kept).

        Raises:
            ConfigError: there is no such profile.
            ChildStartError: the agent failed to start (e.g. the session is
                held by another process).
        """
        spec = self.spec(profile)
        child = await self.runtime.start_agent(
            options=spec.options,
            session_id=session_id,
            tools=spec.tools,
            subagents=spec.subagents,
            setup=spec.setup,
            child_setup=spec.child_setup,
        )
        return child

    def spec(self, profile: str) -> AgentSpec:
        """How to start an agent of `profile` (for `start_agent`, or another starter such as the
        gateway's session directory).

        Raises:
            ConfigError: there is no such profile.
        """
        agent_config = self.config.agent(profile)
        subagent_config = self.config.agent(agent_config.subagent_agent or profile)
        providers: list[SubagentProvider] = []
        if "subagent" in agent_config.subagents:
            providers.append(SpawnProvider())
        if "subagent_fork" in agent_config.subagents:
            providers.append(ForkProvider())
        return AgentSpec(
            options=agent_options(agent_config),
            tools=tools_of(agent_config),
            subagents=tuple(providers),
            setup=self._setup(agent_config),
            child_setup=self._setup(subagent_config, child_of=profile),
        )

    def _setup(
        self, profile: AgentConfig, *, child_of: str | None = None
    ) -> Callable[[Agent], None]:
        """The setup of an agent of `profile` (a subagent when `child_of` names its parent's)."""
        system_prompt = self.runtime.system_prompt
        root = self.root
        profile_name = next(n for n, p in self.config.agents.items() if p is profile)

        def setup(agent: Agent) -> None:
            session_id = agent.session.id
            self._scopes[agent.scope] = session_id
            scope = agent.scope

            def forget() -> None:
                self._scopes.pop(scope, None)

            scope.own(Registration(remove=forget))
            self._profiles[session_id] = profile_name
            if child_of is not None:
                for tool in tools_of(profile):
                    if agent.tools.get(tool.name) is None:
                        agent.tools.add(tool)
                parent = self._scopes.get(agent.scope.parent) if agent.scope.parent else None
                if parent is not None:
                    self._parents[session_id] = parent
                    for listener in list(self._child_listeners):
                        listener(agent, parent, profile_name)
            system_prompt.section(
                PromptSection(name=PERSONA_SECTION, order=PERSONA_ORDER, text=profile.persona),
                scope=agent.scope,
            )
            system_prompt.on_assemble(_profile_tools(profile, agent.scope), scope=agent.scope)
            for name in profile.contexts:
                if name == "time":
                    TimeContext().install(agent)
                elif name == "workspace":
                    WorkspaceInstructions(root=root).install(agent)
                elif name == "tmux":
                    TmuxContext().install(agent)
                else:
                    Compaction().install(agent)

        return setup


def agent_options(profile: AgentConfig) -> AgentOptions:
    """The model options of an agent of `profile`."""
    return AgentOptions(
        model=profile.model,
        provider_name=profile.provider,
        max_tokens=profile.max_tokens,
        temperature=profile.temperature,
        max_steps=profile.max_steps,
    )


def tools_of(profile: AgentConfig) -> tuple[Tool, ...]:
    """The tools `profile` names, in the order the config lists them."""
    return tuple(ref.tool for ref in profile.tools)


def _profile_tools(profile: AgentConfig, scope: Scope) -> AssembleListener:
    """A waterfall listener showing an agent exactly its profile's tools, in its `tool_order`.

    It acts only on assemblies of the agent's own scope (a child agent's
    scope descends from its parent's, and the child has a profile of its
    own): tools of other profiles that reach the scope through its ancestors
    are hidden, and a name seen twice is shown once.
    """
    names = set(profile.tool_names())
    order = None if profile.tool_order is None else parse_tool_order(profile.tool_order)

    async def listener(
        assembly: PromptAssembly, ctx: AssembleContext, next: NextListener
    ) -> PromptAssembly:
        result = await next()
        if ctx.scope is not scope:
            return result
        seen: set[str] = set()
        mine = []
        for schema in result.tools:
            if schema.name in names and schema.name not in seen:
                seen.add(schema.name)
                mine.append(schema)
        result.tools = order_tools(mine, order=order, known_names=names)
        return result

    return listener


def session_store(path: str, url: str | None) -> SessionStore:
    """The store `[store]` names: PostgreSQL at `url`, else SQLite at `path` (or memory).

    Raises:
        ConfigError: `url` is set but psycopg is not installed.
    """
    if url is not None:
        try:
            from actors.session.postgres_store import PostgresStore
        except ImportError as exc:
            raise ConfigError(
                f"[store] url needs psycopg, which is not installed ({exc}); "
                "install the extra: pip install 'harness[postgres]'"
            ) from exc
        return PostgresStore(url)
    if path == MEMORY_STORE:
        return MemoryStore()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(Path(path))


def _redacted(url: str) -> str:
    """`url` without its password, to show where sessions are stored."""
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at:
        return url
    user = credentials.partition(":")[0]
    return f"{scheme}://{user}@{host}"


@asynccontextmanager
async def open_deployment(
    config: DeploymentConfig,
    *,
    store_path: str | None = None,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    store: SessionStore | None = None,
) -> AsyncIterator[Deployment]:
    """Start what `config` describes and yield the running `Deployment`.

    `store_path` overrides `[store] path` and `url`; `store` is the session
    store itself, built by the caller from `[store]` (a cluster node sets its
    lease length and owner name); `root` is the workspace directory
    (default: the working directory); `environ` the environment secrets are
    read from (default: the process's).

    Leaving the context stops the runtime (live turns end aborted, cause
    "disposed", and the store is flushed), then the simulators.

    Raises:
        ConfigError: a secret the config names is not set (before anything
            starts).
    """
    environment = resolve_environment(config, environ)
    url = None if store_path else config.store.url
    path = store_path or config.store.path
    if store is None:
        store = session_store(path, url)
    async with trio.open_nursery() as nursery:
        providers: dict[str, Provider] = {}
        for name, provider in config.providers.items():
            if provider.kind == "simulator":
                engine = SimulatorEngine(
                    SimulatorConfig(
                        token_rate=provider.token_rate, reply_tokens=provider.reply_tokens
                    )
                )
                base_url: str = await nursery.start(serve_simulator, engine)
                api_key = engine.config.api_key
            else:
                assert provider.base_url is not None
                base_url, api_key = provider.base_url, environment.api_keys[name]
            providers[name] = ProviderActor(
                name=name,
                factory=_factory(base_url, api_key),
                max_in_flight=provider.max_in_flight,
                pools=provider.pools,
                http2=provider.http2,
            )
        async with open_runtime(
            system_prompt=SystemPrompt(), store=store, providers=providers, name="harness"
        ) as runtime:
            yield Deployment(
                config=config,
                environment=environment,
                runtime=runtime,
                root=(root or Path.cwd()).resolve(),
                store_path=path if url is None else _redacted(url),
            )
        nursery.cancel_scope.cancel()


def _factory(base_url: str, api_key: str | None) -> Callable[[httpx.AsyncClient], Provider]:
    def factory(client: httpx.AsyncClient) -> Provider:
        return OpenAICompatProvider(client, base_url=base_url, api_key=api_key)

    return factory
