"""The simulator's configuration: the knobs of a `SimulatorEngine` and model profiles."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Literal, TypeAlias

import attrs

Profile: TypeAlias = Literal["v4", "r1"]
"""A model's reasoning-content rule: `v4` requires `reasoning_content` on every
assistant message with tool calls; `r1` refuses it on any input message."""


def _default_profiles() -> Mapping[str, Profile]:
    return types.MappingProxyType({"deepseek-chat": "v4", "deepseek-reasoner": "r1"})


def _freeze_profiles(value: Mapping[str, Profile]) -> Mapping[str, Profile]:
    for name, profile in value.items():
        if profile not in ("v4", "r1"):
            raise ValueError(f"model {name!r} has profile {profile!r}; profiles: v4, r1")
    return types.MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class SimulatorConfig:
    """How the simulator behaves.

    Attributes:
        api_key: The bearer key chat and model requests must carry; None
            accepts any (or none).
        profiles: Known models and their reasoning-content rule.
        default_profile: The profile of models not in `profiles`; None
            refuses unknown models ("Model Not Exist").
        reply_tokens: Length of the deterministic filler reply, in tokens.
        token_rate: Streamed tokens per second; 0 streams as fast as possible.
        cache_block_tokens: Prefix-cache block size.
        cache_ttl: Seconds an unused cache block lives; None: until evicted.
        cache_max_blocks: The most cache blocks kept.
        max_body_bytes: The largest request body accepted (413 beyond).
        max_recorded: How many recent chat requests `requests` keeps.
    """

    api_key: str | None = "sk-simulator"
    profiles: Mapping[str, Profile] = attrs.field(
        factory=_default_profiles, converter=_freeze_profiles
    )
    default_profile: Profile | None = "v4"
    reply_tokens: int = 24
    token_rate: float = 0.0
    cache_block_tokens: int = 64
    cache_ttl: float | None = None
    cache_max_blocks: int = 1 << 16
    max_body_bytes: int = 8 * 1024 * 1024
    max_recorded: int = 1000

    def __attrs_post_init__(self) -> None:
        if self.reply_tokens < 1:
            raise ValueError(f"reply_tokens must be positive, got {self.reply_tokens}")
        if not (self.token_rate >= 0 and math.isfinite(self.token_rate)):
            raise ValueError(f"token_rate must be finite and >= 0, got {self.token_rate!r}")
        if self.max_body_bytes < 1 or self.max_recorded < 1:
            raise ValueError("max_body_bytes and max_recorded must be positive")
