"""The crash soak, in the suite: 21 SIGKILLs of a real agent process, none loses or bricks.

The soak itself (child agent, kill points, checks) is `benchmarks/crash_soak.py`,
which runs longer soaks for the figures in `benchmarks/README.md`; here it
runs with 21 kills against the simulator over loopback (about 40 s).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "crash_soak.py"


def soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crash_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_sigkill_at_21_random_points_loses_no_durable_event_and_bricks_no_session(
    tmp_path: Path,
) -> None:
    result = await soak_module().run_soak(kills=21, seed=1, workdir=tmp_path)
    assert result.problems == []
    assert result.kills == 21
    assert result.kills_mid_tool >= 5
    assert result.repaired_calls >= 5
    assert (result.lost_events, result.changed_prefixes, result.bricked) == (0, 0, 0)
