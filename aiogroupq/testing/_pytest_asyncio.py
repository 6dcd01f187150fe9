"""The pytest-asyncio side of ``aiogroupq_redis``: one fixture per loop scope.

Registered by :mod:`aiogroupq.testing.pytest_plugin` only when pytest-asyncio
is active, so that importing this module never needs it otherwise. A test run
by pytest-asyncio gets its client from the fixture whose ``loop_scope`` is the
test's own: a client's connections belong to the loop that made them, and
pytest-asyncio runs each loop scope on a loop of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import pytest_asyncio
import redis.asyncio

from ._client import flushed_client

LoopScope = Literal["function", "class", "module", "package", "session"]
LOOP_SCOPES: tuple[LoopScope, ...] = (
    "function",
    "class",
    "module",
    "package",
    "session",
)


def fixture_name(loop_scope: str) -> str:
    """The name of the client fixture that runs on *loop_scope*'s loop."""
    return f"_aiogroupq_redis_on_{loop_scope}_loop"


def _client_on(loop_scope: LoopScope) -> Callable[..., Any]:
    @pytest_asyncio.fixture(loop_scope=loop_scope, name=fixture_name(loop_scope))
    async def client(aiogroupq_redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
        async with flushed_client(aiogroupq_redis_url) as made:
            yield made

    return client


# pytest finds fixtures among a plugin's attributes: one each.
_on_function_loop = _client_on("function")
_on_class_loop = _client_on("class")
_on_module_loop = _client_on("module")
_on_package_loop = _client_on("package")
_on_session_loop = _client_on("session")
