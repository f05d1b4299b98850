"""Tool-argument validation: fastjsonschema (what the harness uses) against jsonschema.

Times one validation of valid and of invalid arguments, and building the
validator, for three schemas: a flat five-property tool schema, the schema
`function_tool` makes for a function with a nested attrs class and a
TypedDict, and the 40-tool benchmark's small schema. jsonschema is timed
with a prebuilt validator object (`validator_for(schema)(schema)`), the
fastest way to use it.

Run: .venv/bin/python benchmarks/validation.py [--runs 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import timeit
from pathlib import Path
from typing import Any, Literal, TypedDict

import attrs
import fastjsonschema
import jsonschema

from actors.agent import function_tool
from actors.jsonvalue import thaw_json

RESULTS = Path(__file__).parent / "results" / "validation.json"

FLAT = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "mode": {"enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "window": {
            "type": "object",
            "properties": {"start": {"type": "integer"}},
            "required": ["start"],
            "additionalProperties": False,
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}
FLAT_GOOD = {
    "path": "a.txt",
    "limit": 3,
    "mode": "fast",
    "tags": ["x", "y"],
    "window": {"start": 1},
}
FLAT_BAD = {"path": 3}


@attrs.frozen
class Point:
    x: float
    y: float = 0.0


class Filter(TypedDict):
    field: str
    values: list[str]


async def place(
    at: Point, where: Filter, mode: Literal["a", "b"] = "a", note: str | None = None
) -> str:
    return ""


NESTED = thaw_json(function_tool(place).parameters)
NESTED_GOOD = {"at": {"x": 1.5, "y": 2}, "where": {"field": "f", "values": ["a", "b"]}, "mode": "b"}
NESTED_BAD = {"at": {"x": "1"}, "where": {"field": "f", "values": []}}

SMALL = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "count": {"type": "integer", "minimum": 0}},
    "required": ["path"],
}
SMALL_GOOD = {"path": "src/a.py", "count": 2}
SMALL_BAD = {"count": -1}


def per_call_us(fn: Any, runs: int) -> float:
    return timeit.timeit(fn, number=runs) / runs * 1e6


def fast_bad(validate: Any, value: Any) -> None:
    with contextlib.suppress(fastjsonschema.JsonSchemaValueException):
        validate(value)


def measure(name: str, schema: dict[str, Any], good: Any, bad: Any, runs: int) -> dict[str, Any]:
    """One row: µs per validation (valid, invalid) and per validator build, for both libraries."""
    fast = fastjsonschema.compile(schema, use_default=False)
    slow = jsonschema.validators.validator_for(schema)(schema)
    return {
        "schema": name,
        "fastjsonschema_valid_us": per_call_us(lambda: fast(good), runs),
        "fastjsonschema_invalid_us": per_call_us(lambda: fast_bad(fast, bad), runs),
        "fastjsonschema_compile_us": per_call_us(
            lambda: fastjsonschema.compile(schema, use_default=False), 100
        ),
        "jsonschema_valid_us": per_call_us(lambda: slow.is_valid(good), runs),
        "jsonschema_invalid_us": per_call_us(lambda: list(slow.iter_errors(bad)), runs),
        "jsonschema_build_us": per_call_us(
            lambda: jsonschema.validators.validator_for(schema)(schema), 100
        ),
    }


def main(runs: int) -> None:
    rows = [
        measure("flat 5-property", FLAT, FLAT_GOOD, FLAT_BAD, runs),
        measure("function_tool nested", NESTED, NESTED_GOOD, NESTED_BAD, runs),
        measure("40-tool benchmark", SMALL, SMALL_GOOD, SMALL_BAD, runs),
    ]
    print(
        f"{'schema':<22} {'fast ok':>8} {'fast bad':>9} {'compile':>9} "
        f"{'js ok':>8} {'js bad':>8} {'js build':>9}   (µs)"
    )
    for row in rows:
        print(
            f"{row['schema']:<22} {row['fastjsonschema_valid_us']:>8.1f} "
            f"{row['fastjsonschema_invalid_us']:>9.1f} {row['fastjsonschema_compile_us']:>9.0f} "
            f"{row['jsonschema_valid_us']:>8.1f} {row['jsonschema_invalid_us']:>8.1f} "
            f"{row['jsonschema_build_us']:>9.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs, "rows": rows}, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20000)
    main(parser.parse_args().runs)
