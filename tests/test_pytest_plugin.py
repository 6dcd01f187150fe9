"""aiogroupq's pytest plugin in users' projects: run by pytest-asyncio (strict
and auto mode, the function's loop and a module's) and by anyio's plugin.

Each test writes a small project into a temporary directory, with its own
ini file, and runs pytest on it in a subprocess, as the project's owner
would. The inner runs use this run's server (``$REDIS_URL`` set to
``aiogroupq_redis_url``: this worker's own server, or the scratch database
this run was given); they flush its database as this suite's tests do.
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

import pytest

# Each test runs pytest in a subprocess.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "testing_asyncio"

CONFTEST = 'pytest_plugins = ["aiogroupq.testing.pytest_plugin"]\n'

# What each inner test does with the plugin's client: enqueue a task, then
# consume it in the test's process.
ROUND_TRIP = """
import redis.asyncio

import aiogroupq
from aiogroupq.testing import drain


async def double(x: int) -> int:
    return x * 2


HANDLERS = {"double": aiogroupq.Handler(double, store_result=True)}


async def round_trip(client: redis.asyncio.Redis, value: int) -> object:
    async with aiogroupq.Producer(client, queue="plugin") as producer:
        task_id = await producer.enqueue("double", value, group="g")
    (outcome,) = await drain(client, queue="plugin", handlers=HANDLERS)
    assert outcome.id == task_id
    return outcome.result
"""


@pytest.fixture
def project(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    aiogroupq_redis_url: str,
) -> pytest.Pytester:
    """An empty project on this run's server, with the plugin opted into."""
    for name in list(os.environ):
        if name.startswith("PYTEST_"):  # this run's xdist and addopts
            monkeypatch.delenv(name)
    monkeypatch.setenv("REDIS_URL", aiogroupq_redis_url)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(roundtrip=ROUND_TRIP)
    return pytester


def _version(distribution: str) -> tuple[int, ...]:
    """The release of an installed *distribution*, as numbers."""
    release = metadata.version(distribution).split("+")[0].split(".")
    return tuple(int(part) for part in release if part.isdigit())


def _run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return project.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)


def test_the_pytest_asyncio_example_passes_in_strict_mode(
    project: pytest.Pytester,
) -> None:
    """The docs' example: the function's loop, and a module-scoped Producer
    fixture on the module's loop serving two tests on that loop."""
    for name in ("pytest.ini", "conftest.py", "test_shipping.py"):
        shutil.copy(EXAMPLE / name, project.path / name)

    result = _run(project, "-v")

    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*asyncio: mode=Mode.STRICT*"])


STRICT_TESTS = """
import pytest
import pytest_asyncio
import redis.asyncio

import aiogroupq
from roundtrip import round_trip


@pytest.mark.asyncio
async def test_function_loop(aiogroupq_redis: redis.asyncio.Redis) -> None:
    assert await round_trip(aiogroupq_redis, 1) == 2


@pytest_asyncio.fixture(loop_scope="module")
async def fixture_of_the_test(
    aiogroupq_redis: redis.asyncio.Redis,
) -> redis.asyncio.Redis:
    await aiogroupq_redis.set("seen", 1)
    return aiogroupq_redis


@pytest.mark.asyncio(loop_scope="module")
async def test_module_loop(fixture_of_the_test: redis.asyncio.Redis) -> None:
    assert await fixture_of_the_test.get("seen") == b"1"
    assert await round_trip(fixture_of_the_test, 2) == 4


@pytest.mark.asyncio(loop_scope="class")
class TestOnTheClassLoop:
    async def test_class_loop(self, aiogroupq_redis: redis.asyncio.Redis) -> None:
        assert await aiogroupq_redis.dbsize() == 0  # flushed for this test
        assert await round_trip(aiogroupq_redis, 3) == 6


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_producer(aiogroupq_redis_url: str):
    async with aiogroupq.Producer(aiogroupq_redis_url, queue="plugin") as producer:
        yield producer


@pytest.mark.asyncio  # the function's loop, not the producer's
async def test_a_producer_of_another_loop(module_producer) -> None:
    with pytest.raises(aiogroupq.errors.NotOpenError) as caught:
        await module_producer.enqueue("double", 1)
    assert "this Producer was opened on another event loop" in str(caught.value)


def test_a_sync_test_is_told(aiogroupq_redis: redis.asyncio.Redis) -> None:
    pass
"""


def test_strict_mode_on_each_loop_scope(project: pytest.Pytester) -> None:
    project.makeini(
        "[pytest]\n"
        "asyncio_mode = strict\n"
        "asyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\n"
    )
    project.makepyfile(test_strict=STRICT_TESTS)

    result = _run(project)

    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        ["*aiogroupq_redis is an asyncio client: request it from an async test*"]
    )


def test_the_default_test_loop_scope_is_followed(project: pytest.Pytester) -> None:
    """``asyncio_default_test_loop_scope = module``: unmarked loop scopes
    are the module's, and so is the client's loop."""
    if _version("pytest-asyncio") < (0, 26):
        pytest.skip("asyncio_default_test_loop_scope came with pytest-asyncio 0.26")
    project.makeini(
        "[pytest]\n"
        "asyncio_mode = auto\n"
        "asyncio_default_fixture_loop_scope = module\n"
        "asyncio_default_test_loop_scope = module\n"
        "filterwarnings = error\n"
    )
    project.makepyfile(
        test_module_default="""
import aiogroupq
import pytest_asyncio
import redis.asyncio
from aiogroupq.testing import drain
from roundtrip import HANDLERS, round_trip


@pytest_asyncio.fixture(scope="module")
async def producer(aiogroupq_redis_url: str):
    async with aiogroupq.Producer(aiogroupq_redis_url, queue="plugin") as producer:
        yield producer


async def test_one(producer, aiogroupq_redis: redis.asyncio.Redis) -> None:
    task_id = await producer.enqueue("double", 5)
    (outcome,) = await drain(aiogroupq_redis, queue="plugin", handlers=HANDLERS)
    assert (outcome.id, outcome.result) == (task_id, 10)


async def test_two(producer, aiogroupq_redis: redis.asyncio.Redis) -> None:
    assert await round_trip(aiogroupq_redis, 6) == 12
"""
    )

    _run(project).assert_outcomes(passed=2)


def test_auto_mode(project: pytest.Pytester) -> None:
    project.makeini(
        "[pytest]\n"
        "asyncio_mode = auto\n"
        "asyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\n"
    )
    project.makepyfile(
        test_auto="""
import pytest
import redis.asyncio
from roundtrip import round_trip


async def test_unmarked(aiogroupq_redis: redis.asyncio.Redis) -> None:
    assert await round_trip(aiogroupq_redis, 7) == 14


@pytest.mark.asyncio(loop_scope="module")
async def test_module_loop(aiogroupq_redis: redis.asyncio.Redis) -> None:
    assert await round_trip(aiogroupq_redis, 8) == 16
"""
    )

    _run(project).assert_outcomes(passed=2)


ANYIO_TESTS = """
import aiogroupq
import pytest
import redis.asyncio
from aiogroupq.testing import drain
from roundtrip import HANDLERS, round_trip


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def test_auto(aiogroupq_redis: redis.asyncio.Redis) -> None:
    assert await round_trip(aiogroupq_redis, 9) == 18


@pytest.fixture
async def fixture_of_the_test(
    aiogroupq_redis: redis.asyncio.Redis,
) -> redis.asyncio.Redis:
    await aiogroupq_redis.set("seen", 1)
    return aiogroupq_redis


@pytest.mark.anyio
async def test_marked(fixture_of_the_test: redis.asyncio.Redis) -> None:
    assert await fixture_of_the_test.get("seen") == b"1"
    assert await round_trip(fixture_of_the_test, 10) == 20


# anyio keeps a module-scoped async fixture's loop for the tests it serves.
@pytest.fixture(scope="module")
async def producer(aiogroupq_redis_url: str):
    async with aiogroupq.Producer(aiogroupq_redis_url, queue="plugin") as producer:
        yield producer


@pytest.mark.parametrize("value", [11, 12])
async def test_a_module_producer(
    producer: aiogroupq.Producer, aiogroupq_redis: redis.asyncio.Redis, value: int
) -> None:
    task_id = await producer.enqueue("double", value)
    (outcome,) = await drain(aiogroupq_redis, queue="plugin", handlers=HANDLERS)
    assert (outcome.id, outcome.result) == (task_id, value * 2)
"""


@pytest.mark.parametrize(
    ("args", "ini"),
    [
        pytest.param(["-p", "no:asyncio"], "", id="alone"),
        # Installed beside it, in its default strict mode: it takes nothing.
        pytest.param(
            [], "asyncio_default_fixture_loop_scope = function\n", id="beside"
        ),
    ],
)
def test_anyio(project: pytest.Pytester, args: list[str], ini: str) -> None:
    project.makeini(f"[pytest]\nanyio_mode = auto\n{ini}filterwarnings = error\n")
    project.makepyfile(test_anyio=ANYIO_TESTS)

    _run(project, *args).assert_outcomes(passed=4)
