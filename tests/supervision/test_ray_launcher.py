"""RayLauncher without a Ray cluster: lazy import, the missing extra, config checked first.

The launcher on a real two-node cluster is `tests/ray` (`make test-ray`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervision.cluster.ray_launcher import RayLauncher, RayLauncherError
from supervision.config import ConfigError

DEPLOYMENT = """
[store]
url = "postgresql://harness@127.0.0.1:1/none"

[providers.local]
kind = "simulator"

[agents.default]
provider = "local"
"""


def test_neither_actors_nor_the_launcher_module_imports_ray() -> None:
    probe = (
        "import sys, actors.agent, actors.session, supervision.cluster.ray_launcher; "
        "print('ray' in sys.modules)"
    )
    output = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "False"


def test_starting_without_the_ray_extra_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(DEPLOYMENT)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    launcher = RayLauncher(config, address="127.0.0.2:6390")
    with pytest.raises(RayLauncherError, match=r"pip install 'harness\[ray\]'"):
        launcher.start()
    launcher.stop()  # nothing started: a no-op


def test_an_invalid_deployment_fails_before_ray_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(DEPLOYMENT + "\n[agents.other]\nprovider = 'missing'\n")
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"missing"):
        RayLauncher(config, address="127.0.0.2:6390").start()


def test_a_missing_deployment_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"deploy\.toml' does not exist"):
        RayLauncher(tmp_path / "deploy.toml", address="127.0.0.2:6390").start()


def test_asking_for_nodes_before_start_is_an_error(tmp_path: Path) -> None:
    launcher = RayLauncher(tmp_path / "deploy.toml", address="127.0.0.2:6390")
    with pytest.raises(RayLauncherError, match=r"not started; call start\(\) first"):
        launcher.nodes()
