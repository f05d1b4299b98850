"""Usage mistakes on the command line are one line naming the flag, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervision.cli import main

CLUSTER = """
[store]
url = "postgresql://harness@127.0.0.1:1/x"

[cluster]
nodes = "postgres"

[providers.default]
kind = "simulator"

[agents.default]
provider = "default"
"""


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `harness ARGV`; assert exit 2 and a one-line message without a traceback."""
    with pytest.raises(SystemExit) as info:
        status = main(argv)
        raise SystemExit(status)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "eighty"])
@pytest.mark.parametrize("command", ["serve", "simulator"])
def test_a_port_out_of_range_is_refused(
    command: str, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --port:" in usage_error([command, "--port", port], capsys)


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "nonsense", "127.0.0.1:", ":80"])
def test_node_refuses_a_malformed_listen_address(
    listen: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.toml").write_text(CLUSTER)
    argv = ["node", "--config", str(tmp_path / "c.toml"), "--listen", listen]
    assert "argument --listen:" in usage_error(argv, capsys)


def test_node_needs_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert "required: --config" in usage_error(["node"], capsys)


def test_node_help_offers_no_built_in_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["node", "--help"])
    assert "built-in" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["watch", "--url", "http://127.0.0.1:1/acp", "--token", "x"],
        ["inspect", "S", "--url", "notaurl"],
        ["inspect", "S", "--url", "ws://"],
    ],
)
def test_a_url_that_is_not_a_websocket_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --url:" in usage_error(argv, capsys)


def test_cluster_serve_refuses_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.toml").write_text(CLUSTER)
    argv = ["serve", "--config", str(tmp_path / "c.toml"), "--store", "x.sqlite"]
    assert "harness: --store 'x.sqlite': a cluster gateway" in usage_error(argv, capsys)


def test_serve_on_a_bad_host_hints_at_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--host", "999.1.1.1", "--port", "0", "--store", "memory"]) == 1
    err = capsys.readouterr().err
    assert "cannot listen on 999.1.1.1:0" in err
    assert "--host" in err and "--port" not in err
