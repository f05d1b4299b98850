"""The benchmark's table and plot, from the JSON rows every level prints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_COLUMNS = (
    ("framework", "framework", "{}"),
    ("sessions", "N", "{:,}"),
    ("wall_s", "wall s", "{:.2f}"),
    ("cpu_ms_per_step", "CPU ms/step", "{:.2f}"),
    ("sequential_cpu_ms_per_step", "seq CPU ms/step", "{:.2f}"),
    ("steps_per_s", "steps/s", "{:,.0f}"),
    ("overhead_ms_p50", "overhead p50 ms", "{:.1f}"),
    ("overhead_ms_p99", "overhead p99 ms", "{:.1f}"),
    ("rss_kb_per_idle_session", "RSS KB/idle session", "{:.1f}"),
    ("rss_mb_total", "RSS MB", "{:.0f}"),
    ("failed_turns", "failed", "{}"),
    ("simulator_cpu_s", "sim CPU s", "{:.1f}"),
)


class PlotError(RuntimeError):
    """The plot cannot be drawn (matplotlib is not installed)."""


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else fmt.format(value)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of `rows`, with the simulator's cache hit ratio vs its limit."""
    headers = [title for _, title, _ in _COLUMNS] + ["cache hit / limit"]
    body = []
    for row in rows:
        cache = row.get("cache") or {}
        ratio = (
            f"{cache['hit_ratio']:.1%} / {cache['limit_ratio']:.1%}"
            if "hit_ratio" in cache
            else "-"
        )
        body.append([_cell(row, key, fmt) for key, _, fmt in _COLUMNS] + [ratio])
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def write_plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """A PNG of CPU ms per step and RSS KB per idle session against N, one line per framework.

    Raises:
        PlotError: matplotlib is missing (install the `bench` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError(
            "the plot needs matplotlib: pip install 'harness[bench]' (or drop --plot)"
        ) from exc
    frameworks = sorted({row["framework"] for row in rows}, key=lambda f: (f != "harness", f))
    figure, (cpu_axis, rss_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for framework in frameworks:
        mine = sorted((r for r in rows if r["framework"] == framework), key=lambda r: r["sessions"])
        sessions = [r["sessions"] for r in mine]
        cpu_axis.plot(sessions, [r["cpu_ms_per_step"] for r in mine], marker="o", label=framework)
        rss_axis.plot(
            sessions, [r["rss_kb_per_idle_session"] for r in mine], marker="o", label=framework
        )
    for axis, title in (
        (cpu_axis, "client CPU ms per step (concurrent turns)"),
        (rss_axis, "RSS KB per idle session"),
    ):
        axis.set_xscale("log")
        axis.set_xlabel("concurrent sessions N")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
