"""Per-agent configuration and the default request-retry policy."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import attrs

from actors.jsonvalue import freeze_object
from actors.providers.chunks import Failure


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Which failed requests to retry, and after how long.

    Only failures marked `retryable` are retried, at most `max_retries`
    times per step (so `max_retries=2` allows 3 attempts). The wait is the
    server's `retry_after_ms` when it named one (capped at
    `max_retry_after_ms`), else capped exponential backoff
    `min(max_delay_ms, base_delay_ms * 2**attempt)` with ±`jitter` spread.
    """

    max_retries: int = attrs.field(default=2, validator=_non_negative)
    base_delay_ms: int = attrs.field(default=500, validator=_non_negative)
    max_delay_ms: int = attrs.field(default=30_000, validator=_non_negative)
    jitter: float = 0.2
    max_retry_after_ms: int = attrs.field(default=60_000, validator=_non_negative)

    def delay_ms(self, failure: Failure, attempt: int, rng: random.Random) -> int | None:
        """The wait before retrying after 0-based `attempt` failed, or None to give up."""
        if not failure.retryable or attempt >= self.max_retries:
            return None
        if failure.retry_after_ms is not None:
            return min(failure.retry_after_ms, self.max_retry_after_ms)
        backoff = min(self.max_delay_ms, self.base_delay_ms << attempt)
        spread = backoff * self.jitter
        return max(0, round(backoff + rng.uniform(-spread, spread)))


def _max_steps(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"max_steps must be a positive int or None, got {value!r}")


def _freeze_extra(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return freeze_object(value, where="extra")


@attrs.frozen  # positional, as DESIGN §8 writes AgentOptions(...)
class AgentOptions:
    """How an agent calls its model.

    `model` is an opaque model name; `provider_name` appears as
    `config["provider"]` in every request. `extra` holds further
    provider-specific request settings (e.g. `thinking`,
    `reasoning_effort`) copied into the request config. `max_steps` caps
    the steps of one turn: the step that would exceed it is not started and
    the turn ends with error code "max_steps" (None: no limit). With `hibernate`,
    the agent's session hibernates whenever the agent goes idle (its
    in-memory log is released and reloaded from the store when input
    arrives; see `Session.hibernate`), trading a reload per wake for
    memory: while it hibernates, reading `agent.session` synchronously
    raises `SessionHibernatingError`.
    """

    model: str
    provider_name: str = "default"
    max_tokens: int | None = None
    temperature: float | None = None
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_extra)
    max_steps: int | None = attrs.field(default=50, validator=_max_steps)
    hibernate: bool = False

    def request_config(self) -> dict[str, Any]:
        """The request config: provider and model, then the settings that are set."""
        config: dict[str, Any] = {"provider": self.provider_name, "model": self.model}
        if self.max_tokens is not None:
            config["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            config["temperature"] = self.temperature
        for key, value in self.extra.items():
            if key in config:
                raise ValueError(f"AgentOptions.extra must not override {key!r}")
            config[key] = value
        return config
