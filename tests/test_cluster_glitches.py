"""redis-py's cluster client may close a connection another task is
writing to; the write then fails with a ``TypeError`` or ``AttributeError``
from redis-py's code, or (Python 3.13's ``writelines``, CPython issue
136234) from asyncio's transport called by redis-py. Those are lost
connections, retried as such; the same errors from anyone else's code stay
what they are."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
import redis.exceptions

from aiogroupq._store.connection import cluster_glitches


def _raiser(
    filename: str, error: str, inner: Callable[[], None] | None = None
) -> Callable[[], None]:
    """A function whose frame is in *filename*: it calls *inner* if given,
    else raises *error*."""
    namespace: dict[str, object] = {"inner": inner}
    body = "inner()" if inner else f"raise {error}('connection gone')"
    exec(compile(f"def f():\n    {body}\n", filename, "exec"), namespace)  # noqa: S102
    f = namespace["f"]
    assert callable(f)
    return f


REDIS_PY = os.path.join(os.sep, "site-packages", "redis", "asyncio", "connection.py")
ASYNCIO = os.path.join(os.path.dirname(asyncio.__file__), "selector_events.py")
CALLER = os.path.join(os.sep, "app", "handlers.py")


@pytest.mark.parametrize("error", ["TypeError", "AttributeError"])
@pytest.mark.parametrize(
    "stack",
    [
        pytest.param([REDIS_PY], id="in-redis-py"),
        pytest.param([REDIS_PY, ASYNCIO], id="in-asyncio-called-by-redis-py"),
        pytest.param([CALLER, REDIS_PY, ASYNCIO, ASYNCIO], id="deep"),
    ],
)
def test_a_write_on_a_closed_connection_is_a_connection_error(
    stack: list[str], error: str
) -> None:
    f = None
    for filename in reversed(stack):
        f = _raiser(filename, error, f)
    assert f is not None
    lost = pytest.raises(redis.exceptions.ConnectionError, match="connection lost")
    with lost, cluster_glitches():
        f()


@pytest.mark.parametrize(
    "stack",
    [
        pytest.param([CALLER], id="caller"),
        pytest.param([REDIS_PY, CALLER], id="caller-called-by-redis-py"),
        pytest.param([CALLER, ASYNCIO], id="asyncio-called-by-caller"),
    ],
)
def test_the_same_error_from_other_code_stays_what_it_is(stack: list[str]) -> None:
    f = None
    for filename in reversed(stack):
        f = _raiser(filename, "TypeError", f)
    assert f is not None
    with pytest.raises(TypeError), cluster_glitches():
        f()
