"""`[store] url`: a deployment whose sessions live in PostgreSQL."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import trio

from actors.session import PostgresStore
from supervision.config import ConfigError, load_config, parse_config
from supervision.deployment import open_deployment

DEPLOYMENT = """
[store]
url = "{url}"

[providers.local]
kind = "simulator"

[agents.default]
provider = "local"
"""


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(text)
    return path


async def test_a_store_url_keeps_the_deployments_sessions_in_postgresql(
    tmp_path: Path, postgres_dsn: str
) -> None:
    url = postgres_dsn.replace("harness@", "harness:secret@")
    config = load_config(config_file(tmp_path, DEPLOYMENT.format(url=url)))
    async with open_deployment(config) as deployment:
        assert isinstance(deployment.runtime.store, PostgresStore)
        assert "secret" not in deployment.store_path
        assert deployment.store_path.startswith("postgresql://harness@127.0.0.1:")
        agent = (await deployment.start_agent()).value
        agent.followup("hello")
        with trio.fail_after(30):
            await agent.when_idle()
        session_id = agent.session.id
    events = await PostgresStore(postgres_dsn).load(session_id)
    assert [e.type for e in events if e.type.startswith("turn/")] == ["turn/start", "turn/end"]


def test_a_store_url_must_be_postgresql(tmp_path: Path) -> None:
    path = config_file(tmp_path, DEPLOYMENT.format(url="mysql://db/x"))
    with pytest.raises(ConfigError, match=r"store\.url \(in \[store\]\) must be a postgresql://"):
        load_config(path)


def test_a_store_takes_a_path_or_a_url_not_both(tmp_path: Path) -> None:
    text = DEPLOYMENT.format(url="postgresql://db/x").replace(
        "[store]\n", '[store]\npath = "x.sqlite"\n'
    )
    with pytest.raises(ConfigError, match=r"either path \(SQLite\) or url \(PostgreSQL\)"):
        load_config(config_file(tmp_path, text))


def test_the_scale_out_guides_config_parses() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "scale-out.md").read_text()
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    config = parse_config(tomllib.loads(block), "docs/scale-out.md")
    assert config.store.url == "postgresql://harness:secret@db.internal:5432/harness"
