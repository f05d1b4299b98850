"""Fixtures of the real-model tests: llama-server on loopback, and proxies in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, cast

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import ASGIFramework

from supervision.local_model import serve_llama_server
from tests.model.proxy import LlamaCppPythonProxy

ProxyFactory = Callable[..., Awaitable[tuple[str, LlamaCppPythonProxy]]]


@pytest.fixture
async def server(nursery: trio.Nursery) -> str:
    """The base URL of a fresh llama-server (its prompt cache empty)."""
    with trio.fail_after(120):
        url: str = await nursery.start(serve_llama_server)
    return url


@pytest.fixture
async def proxy(server: str, nursery: trio.Nursery) -> AsyncIterator[ProxyFactory]:
    """Starts `LlamaCppPythonProxy`s in front of `server`; gives (base URL, proxy)."""
    proxies: list[LlamaCppPythonProxy] = []

    async def start(**habits: Any) -> tuple[str, LlamaCppPythonProxy]:
        app = LlamaCppPythonProxy(server, **habits)
        proxies.append(app)
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        binds: list[str] = await nursery.start(partial(serve, cast(ASGIFramework, app), config))
        return binds[0], app

    yield start
    for app in proxies:
        await app.aclose()
