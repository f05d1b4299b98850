"""The TOML deployment: the example parses, every kind of mistake is named with its key and file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

import supervision.deployment as deployment_module
from actors.agent import Agent, Tool
from actors.context import Compaction
from actors.providers.actor import ProviderActor
from actors.scope import Registration
from supervision.config import (
    DEFAULT_TOOLS,
    ConfigError,
    default_config,
    load_config,
    resolve_environment,
)
from supervision.deployment import agent_options, open_deployment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "orchestrator.toml"

MINIMAL = """
[providers.local]
kind = "simulator"

[agents.default]
provider = "local"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    return message


def test_the_example_file_parses_with_every_profile() -> None:
    config = load_config(EXAMPLE)
    assert set(config.agents) == {"orchestrator", "worker", "default"}
    orchestrator = config.agent("orchestrator")
    assert orchestrator.subagents == ("subagent",)
    assert orchestrator.subagent_agent == "worker"
    assert orchestrator.tool_order == ("subagent", "<unlisted-tools>")
    assert orchestrator.contexts == ("time",)
    worker = config.agent("worker")
    assert [ref.tool.name for ref in worker.tools] == ["list_files", "read_file"]
    assert all(isinstance(ref.tool, Tool) for ref in worker.tools)
    assert config.providers["local"].kind == "simulator"
    assert config.source == str(EXAMPLE)


def test_the_reference_example_in_the_docs_parses(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "config.md").read_text()
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    # The reference names a tool module of the user's own; give it one.
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(
        "from supervision.workspace_tools import list_files as search\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        config = load_config(write(tmp_path, block))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mypkg.tools", None)
        sys.modules.pop("mypkg", None)
    assert config.providers["deepseek"].api_key_env == "DEEPSEEK_API_KEY"
    assert config.gateway.tokens[0].scopes == ("observe", "control", "admin")


def test_unknown_key_names_the_key_the_table_and_the_file(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'modle = "x"\n')
    assert "unknown key 'modle' in [agents.default]" in message
    assert "allowed:" in message and "model" in message


def test_unknown_top_level_table_is_an_error(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + "[agent]\nx = 1\n")
    assert "unknown key 'agent' in the top level" in message


def test_unknown_key_in_an_array_of_tables_names_the_entry(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + '[[gateway.tokens]]\nenv = "T"\nscope = ["observe"]\n')
    assert "unknown key 'scope' in [[gateway.tokens]] entry 0" in message


def test_wrong_type_is_never_coerced(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + "model = 3\n")
    assert "agents.default.model (in [agents.default]): expected a string, got int 3" in message


def test_a_string_where_a_list_belongs_is_refused(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'tools = "supervision.workspace_tools:read_file"\n')
    assert "agents.default.tools (in [agents.default]): expected a list" in message


def test_a_bool_is_not_an_integer(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + "max_steps = true\n")
    assert "agents.default.max_steps" in message and "boolean" in message


def test_value_outside_its_choices_lists_them(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL.replace('"simulator"', '"simulater"'))
    assert "providers.local.kind (in [providers.local])" in message
    assert "'openai-compatible', 'simulator'" in message


def test_unknown_context_plugin(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'contexts = ["time", "weather"]\n')
    assert "agents.default.contexts[1]" in message and "'weather'" in message


def test_missing_required_key(tmp_path: Path) -> None:
    message = error_of(tmp_path, "[providers.local]\n[agents.default]\nprovider = 'local'\n")
    assert "missing required key providers.local.kind in [providers.local]" in message


def test_unresolvable_import_path_names_the_module(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'tools = ["nosuch.module:tool"]\n')
    assert "agents.default.tools[0]" in message
    assert "cannot import module 'nosuch.module'" in message


def test_import_path_to_a_missing_attribute(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'tools = ["supervision.workspace_tools:nope"]\n')
    assert "module 'supervision.workspace_tools' has no 'nope'" in message


def test_import_path_to_something_that_is_not_a_tool(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'tools = ["supervision.config:DEFAULT_AGENT"]\n')
    assert "'supervision.config:DEFAULT_AGENT' names a str, not a Tool or a function" in message


def test_malformed_import_path(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'tools = ["supervision.workspace_tools.read_file"]\n')
    assert "not an import path of the form 'package.module:name'" in message


def test_tool_order_without_the_rest_marker(tmp_path: Path) -> None:
    message = error_of(
        tmp_path, MINIMAL + f'tools = {json.dumps(DEFAULT_TOOLS)}\ntool_order = ["read_file"]\n'
    )
    assert "agents.default.tool_order (in [agents.default])" in message
    assert "'<unlisted-tools>' exactly once" in message


def test_tool_order_with_a_duplicate(tmp_path: Path) -> None:
    message = error_of(
        tmp_path,
        MINIMAL + f"tools = {json.dumps(DEFAULT_TOOLS)}\n"
        'tool_order = ["read_file", "<unlisted-tools>", "read_file"]\n',
    )
    assert "lists tool 'read_file' more than once" in message


def test_tool_order_naming_a_tool_the_profile_lacks(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'tool_order = ["grep", "<unlisted-tools>"]\n')
    assert "agents.default.tool_order" in message and "['grep']" in message


def test_unknown_provider_reference(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL.replace('provider = "local"', 'provider = "remote"'))
    assert (
        "agents.default.provider (in [agents.default]) names unknown provider 'remote'" in message
    )


def test_subagent_profile_on_another_model_is_refused(tmp_path: Path) -> None:
    text = MINIMAL + 'subagents = ["subagent"]\nsubagent_agent = "w"\n'
    text += '[agents.w]\nprovider = "local"\nmodel = "other"\n'
    message = error_of(tmp_path, text)
    assert "agents.default.subagent_agent" in message and "provider and model" in message


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    message = error_of(tmp_path, "[agents.default\n")
    assert "not valid TOML" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + 'modle = "x"\nmax_steps = "many"\n')
    assert "modle" in message and "max_steps" in message


def test_missing_environment_variable_names_key_variable_and_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[providers.ds]\nkind = "openai-compatible"\nbase_url = "https://example.invalid"\n'
        'api_key_env = "HARNESS_TEST_KEY"\n[agents.default]\nprovider = "ds"\n'
        '[[gateway.tokens]]\nenv = "HARNESS_TEST_TOKEN"\n',
    )
    config = load_config(path)  # reading the file needs no secret
    with pytest.raises(ConfigError) as info:
        resolve_environment(config, {})
    message = str(info.value)
    assert str(path) in message
    assert "providers.ds.api_key_env names environment variable 'HARNESS_TEST_KEY'" in message
    assert "gateway.tokens[0].env names environment variable 'HARNESS_TEST_TOKEN'" in message
    env = resolve_environment(config, {"HARNESS_TEST_KEY": "k", "HARNESS_TEST_TOKEN": "t"})
    assert env.api_keys == {"ds": "k"}
    assert env.tokens[0].value == "t" and env.tokens[0].scopes == ("observe",)


def test_defaults_use_the_simulator_without_a_key_and_deepseek_with_one() -> None:
    assert default_config({}).providers["default"].kind == "simulator"
    with_key = default_config({"DEEPSEEK_API_KEY": "sk-x"})
    assert with_key.providers["default"].kind == "openai-compatible"
    assert with_key.providers["default"].api_key_env == "DEEPSEEK_API_KEY"
    tools = [ref.tool.name for ref in default_config({}).agent("default").tools]
    assert tools == ["list_files", "read_file"]


def test_unknown_profile_lists_the_profiles() -> None:
    with pytest.raises(ConfigError, match=r"unknown agent profile .x..*profiles: default"):
        default_config({}).agent("x")


async def test_profiles_get_their_persona_tools_and_order_and_children_theirs() -> None:
    config = load_config(EXAMPLE)
    async with open_deployment(config, store_path="memory") as deployment:
        child = await deployment.start_agent("orchestrator")
        agent = child.value
        agent.followup('go\ncall subagent {"prompt": "look\\ncall list_files {}"}')
        with trio.fail_after(30):
            await agent.when_idle()
        log = agent.session.to_json()
        header = next(e for e in log if e["type"] == "request/header")["data"]["header"]
        assert "You are the orchestrator, powered by deepseek-chat." in header["system"]
        assert [t["name"] for t in header["tools"]] == ["subagent", "list_files"]
        result = next(e for e in log if e["type"] == "tool/result")["data"]
        assert result["is_error"] is False
        store = deployment.runtime.store
        (child_id,) = [s for s in await store.list_sessions() if s != agent.session.id]
        child_log = [e for e in await store.load(child_id)]
        child_header = next(e.data for e in child_log if e.type == "request/header")
        assert "You are a worker" in (child_header.header.system or "")
        assert [t.name for t in child_header.header.tools] == ["list_files", "read_file"]
        assert deployment.profile_of(agent.session.id) == "orchestrator"


def test_a_profiles_max_steps_reaches_the_agent_options(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL + "max_steps = 7\n"))
    assert agent_options(config.agent("default")).max_steps == 7


async def test_the_compaction_context_installs_compaction_on_each_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed: list[object] = []

    class Recorded(Compaction):
        def install(self, agent: Agent) -> Registration:
            installed.append(agent)
            return super().install(agent)

    monkeypatch.setattr(deployment_module, "Compaction", Recorded)
    config = load_config(write(tmp_path, MINIMAL + 'contexts = ["compaction"]\n'))
    assert config.agent("default").contexts == ("compaction",)
    async with open_deployment(config, store_path="memory") as deployment:
        agent = (await deployment.start_agent("default")).value
        await agent.run("hello")
    assert installed == [agent]


async def test_subagents_are_reported_with_their_parent_and_profile() -> None:
    config = load_config(EXAMPLE)
    async with open_deployment(config, store_path="memory") as deployment:
        seen: list[tuple[str, str, str]] = []
        deployment.on_child(
            lambda child, parent, profile: seen.append((child.session.id, parent, profile))
        )
        agent = (await deployment.start_agent("orchestrator")).value
        agent.followup('go\ncall subagent {"prompt": "hello"}')
        with trio.fail_after(30):
            await agent.when_idle()
        ((child, parent, profile),) = seen
        assert parent == agent.session.id and profile == "worker"
        assert deployment.parent_of(child) == agent.session.id
        assert deployment.profile_of(child) == "worker"
        assert deployment.parent_of(agent.session.id) is None


def test_a_plain_function_becomes_a_function_tool(tmp_path: Path) -> None:
    package = tmp_path / "usertools"
    package.mkdir()
    (package / "__init__.py").write_text(
        "def search(query: str, limit: int = 5) -> str:\n"
        '    """Search the notes.\n\n    Args:\n        query: What to look for.\n    """\n'
        "    return query\n\n"
        "def broken(value: complex) -> str:\n    return ''\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        config = load_config(write(tmp_path, MINIMAL + 'tools = ["usertools:search"]\n'))
        (ref,) = config.agent("default").tools
        assert ref.tool.name == "search" and ref.tool.description == "Search the notes."
        assert ref.tool.parameters["required"] == ("query",)
        message = error_of(tmp_path, MINIMAL + 'tools = ["usertools:broken"]\n')
        assert "agents.default.tools[0]" in message and "'usertools:broken'" in message
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("usertools", None)


@pytest.mark.parametrize("port", [65536, 99999, -1])
def test_a_gateway_port_out_of_range_is_refused(tmp_path: Path, port: int) -> None:
    message = error_of(tmp_path, f"[gateway]\nport = {port}\n" + MINIMAL)
    assert f"gateway.port (in [gateway]) must be 0-65535 (0: any free one), got {port}" in message


@pytest.mark.parametrize("key", ["token_rate = 5.0", "reply_tokens = 10"])
def test_simulator_only_keys_are_refused_on_a_real_endpoint(tmp_path: Path, key: str) -> None:
    text = MINIMAL.replace('"simulator"', '"openai-compatible"\nbase_url = "http://x/v1"\n' + key)
    message = error_of(tmp_path, text)
    name = key.partition(" ")[0]
    assert f"providers.local.{name} (in [providers.local]): only a simulator provider" in message


@pytest.mark.parametrize("path", ['".harness/sessions.sqlite"', '"other.sqlite"'])
def test_store_path_and_url_together_are_refused(tmp_path: Path, path: str) -> None:
    text = f'[store]\npath = {path}\nurl = "postgresql://h@127.0.0.1/x"\n' + MINIMAL
    assert "[store] takes either path (SQLite) or url (PostgreSQL), not both" in error_of(
        tmp_path, text
    )


async def test_a_providers_pools_and_http2_reach_its_provider_actor(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, MINIMAL.replace('"simulator"', '"simulator"\npools = 8\nhttp2 = true'))
    )
    async with open_deployment(config, store_path="memory") as deployment:
        provider = deployment.runtime.providers["local"]
        assert isinstance(provider, ProviderActor)
        assert (provider.pools, provider.http2) == (8, True)
        agent = (await deployment.start_agent("default")).value
        with trio.fail_after(30):
            result = await agent.run("hello")  # over HTTP/2 to the in-process simulator
        assert result.reason.kind == "completed"
    default = default_config({}).providers["default"]
    assert (default.pools, default.http2) == (1, False)


def test_a_provider_with_fewer_than_one_pool_is_refused(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL.replace('"simulator"', '"simulator"\npools = 0'))
    assert "providers.local.pools (in [providers.local]) must be >= 1, got 0" in message
    message = error_of(tmp_path, MINIMAL.replace('"simulator"', '"simulator"\nhttp2 = "yes"'))
    assert "http2" in message
