"""The simulator's configuration: the knobs of a `SimulatorEngine` and model profiles."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Literal, TypeAlias

import attrs

from actors.providers.simulator.script import ModelScript

Profile: TypeAlias = Literal["v4", "reasoner", "r1"]
"""How a model thinks, and what it wants back of its reasoning.

- `v4` (`deepseek-chat`): thinks only when the request enables it
  (`"thinking": {"type": "enabled"}`); in thinking mode every assistant
  message with tool calls must carry its `reasoning_content`, and other
  `reasoning_content` is ignored; without thinking all of it is ignored.
- `reasoner` (`deepseek-reasoner`): always in thinking mode, same rule.
- `r1`: the first DeepSeek reasoner: always thinks and refuses
  `reasoning_content` on any input message.
"""

PROFILES: tuple[Profile, ...] = ("v4", "reasoner", "r1")


def _default_profiles() -> Mapping[str, Profile]:
    return types.MappingProxyType({"deepseek-chat": "v4", "deepseek-reasoner": "reasoner"})


def _freeze_profiles(value: Mapping[str, Profile]) -> Mapping[str, Profile]:
    for name, profile in value.items():
        if profile not in PROFILES:
            raise ValueError(
                f"model {name!r} has profile {profile!r}; profiles: {', '.join(PROFILES)}"
            )
    return types.MappingProxyType(dict(value))


def _optional_script(value: object) -> ModelScript | None:
    if value is None or isinstance(value, ModelScript):
        return value
    return ModelScript.from_json(value)


@attrs.frozen(kw_only=True)
class SimulatorConfig:
    """How the simulator behaves.

    Attributes:
        api_key: The bearer key chat and model requests must carry; None
            accepts any (or none).
        profiles: Known models and their reasoning-content rule.
        default_profile: The profile of models not in `profiles`; None (the
            default) refuses unknown models ("Model Not Exist"), as DeepSeek does.
        script: Rules that script the model's replies (see `ModelScript`);
            a JSON object is parsed into one. None: the built-in model only.
        latency: Seconds every chat request waits before its response
            headers (the model's time to first token), on top of a fault's
            `first_byte_delay`.
        reply_tokens: Length of the deterministic filler reply, in tokens.
        token_rate: Streamed tokens per second; 0 streams as fast as possible.
        cache_block_tokens: Prefix-cache block size.
        cache_ttl: Seconds an unused cache block lives; None: until evicted.
        cache_max_blocks: The most cache blocks kept.
        prompt_memo_segments: The most prompt segments (tool headers,
            messages) whose tokens and block digests are memoized
            (`PromptChains`, least recently used evicted first).
        prompt_memo_chars: The most characters of segment text that memo keeps.
        max_body_bytes: The largest request body accepted (413 beyond).
        max_recorded: How many recent chat requests `requests` keeps.
    """

    api_key: str | None = "sk-simulator"
    profiles: Mapping[str, Profile] = attrs.field(
        factory=_default_profiles, converter=_freeze_profiles
    )
    default_profile: Profile | None = None
    script: ModelScript | None = attrs.field(default=None, converter=_optional_script)
    latency: float = 0.0
    reply_tokens: int = 24
    token_rate: float = 0.0
    cache_block_tokens: int = 64
    cache_ttl: float | None = None
    cache_max_blocks: int = 1 << 16
    prompt_memo_segments: int = 8192
    prompt_memo_chars: int = 1 << 24
    max_body_bytes: int = 8 * 1024 * 1024
    max_recorded: int = 1000

    def __attrs_post_init__(self) -> None:
        if self.reply_tokens < 1:
            raise ValueError(f"reply_tokens must be positive, got {self.reply_tokens}")
        if self.default_profile is not None and self.default_profile not in PROFILES:
            raise ValueError(
                f"default_profile must be one of {', '.join(PROFILES)} or None, "
                f"got {self.default_profile!r}"
            )
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise ValueError(f"latency must be finite seconds >= 0, got {self.latency!r}")
        if not (self.token_rate >= 0 and math.isfinite(self.token_rate)):
            raise ValueError(f"token_rate must be finite and >= 0, got {self.token_rate!r}")
        if self.max_body_bytes < 1 or self.max_recorded < 1:
            raise ValueError("max_body_bytes and max_recorded must be positive")
        if self.prompt_memo_segments < 1 or self.prompt_memo_chars < 1:
            raise ValueError("prompt_memo_segments and prompt_memo_chars must be positive")
