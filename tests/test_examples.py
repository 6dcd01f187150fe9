"""The web examples (``examples/``), driven by their frameworks' test clients
against the real test server, with a real consumer running what the
endpoints enqueued, and served as a user serves them; the "Testing your
handlers" example project (``examples/testing/``), run by pytest as a user
would run it; and the getting-started page's programs, run as written."""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import pytest
import redis.asyncio
from aiohttp.test_utils import TestClient, TestServer

import aiogroupq
from aiogroupq.testing import drain
from aiogroupq.testing._server import free_port
from examples import aiohttp_app, dashboard_app, fastapi_app
from tests._spawn import PATIENCE
from tests._web import serving

ROOT = Path(__file__).resolve().parents[1]


async def test_fastapi_app_enqueues_and_reports_status(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    app = fastapi_app.create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    # httpx's transport does not run the lifespan: enter it as the server would.
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        first = await http.post("/imports/42", json=["a", "b", "c"])
        second = await http.post("/imports/42", json=["d"])
        assert (first.status_code, second.status_code) == (202, 202)
        ids = [first.json()["task_id"], second.json()["task_id"]]
        status = await http.get(f"/tasks/{ids[0]}")
        assert status.json() == {"task_id": ids[0], "state": "queued"}

        outcomes = await drain(
            redis_client, queue=fastapi_app.QUEUE, handlers=fastapi_app.HANDLERS
        )
        assert [(o.id, o.group, o.result) for o in outcomes] == [
            (ids[0], "42:orders", 3),
            (ids[1], "42:orders", 1),
        ]
        for task_id in ids:
            status = await http.get(f"/tasks/{task_id}")
            assert status.json() == {"task_id": task_id, "state": "succeeded"}
        assert (await http.get("/tasks/nope")).status_code == 404
        bad = await http.post("/imports/not-a-number", json=[])
        assert bad.status_code == 422
        not_json = await http.post(
            "/imports/42",
            content=b"rows: a, b",
            headers={"content-type": "application/json"},
        )
        assert not_json.status_code == 422, not_json.text
        assert (await http.post("/imports/42", content=b"a,b")).status_code == 422
    async with aiogroupq.Producer(redis_client, queue=fastapi_app.QUEUE) as producer:
        assert await producer.result(ids[0], timeout=0) == 3


async def test_fastapi_app_can_consume_in_process(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    app = fastapi_app.create_app(redis_url, consume=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        task_id = (await http.post("/imports/7", json=["x"])).json()["task_id"]
        async with aiogroupq.Producer(redis_client, queue=fastapi_app.QUEUE) as p:
            assert await p.result(task_id, timeout=30) == 1
        status = await http.get(f"/tasks/{task_id}")
        assert status.json()["state"] == "succeeded"


async def test_fastapi_app_serves_results(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """``GET /tasks/{id}/result``: 202 while the task waits, 200 with the
    result once it succeeded, 404 for an unknown id, 409 for a task that
    ended without one."""
    app = fastapi_app.create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
    ):
        done = (await http.post("/imports/5", json=["a", "b"])).json()["task_id"]
        dropped = (await http.post("/imports/6", json=["c"])).json()["task_id"]
        waiting = await http.get(f"/tasks/{done}/result")
        assert (waiting.status_code, waiting.json()) == (
            202,
            {"task_id": done, "state": "queued"},
        )
        async with aiogroupq.Producer(redis_client, queue=fastapi_app.QUEUE) as p:
            assert await p.cancel(dropped)
        await drain(
            redis_client, queue=fastapi_app.QUEUE, handlers=fastapi_app.HANDLERS
        )

        result = await http.get(f"/tasks/{done}/result")
        assert (result.status_code, result.json()) == (
            200,
            {"task_id": done, "state": "succeeded", "result": 2},
        )
        cancelled = await http.get(f"/tasks/{dropped}/result")
        assert cancelled.status_code == 409
        assert cancelled.json() == {
            "task_id": dropped,
            "state": "cancelled",
            "detail": f"task {dropped!r} was cancelled",
        }
        unknown = await http.get("/tasks/nope/result")
        assert (unknown.status_code, unknown.json()) == (
            404,
            {"detail": "no such task"},
        )


async def test_aiohttp_app_enqueues_and_reports_status(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with TestClient(TestServer(aiohttp_app.make_app(redis_url))) as http:
        response = await http.post("/imports", json={"tenant": 3, "rows": ["a"]})
        assert response.status == 202
        task_id = (await response.json())["task_id"]
        response = await http.get(f"/tasks/{task_id}")
        assert await response.json() == {"task_id": task_id, "state": "queued"}

        outcomes = await drain(
            redis_client, queue=aiohttp_app.QUEUE, handlers=aiohttp_app.HANDLERS
        )
        assert [(o.id, o.group, o.state) for o in outcomes] == [
            (task_id, "3:orders", aiogroupq.TaskState.SUCCEEDED)
        ]
        response = await http.get(f"/tasks/{task_id}")
        assert (await response.json())["state"] == "succeeded"
        assert (await http.get("/tasks/nope")).status == 404
        assert (await http.post("/imports", json={"rows": []})).status == 400
        for body in (b"tenant=3", b"{not json", b""):
            response = await http.post(
                "/imports", data=body, headers={"content-type": "application/json"}
            )
            assert response.status == 400, await response.text()
            assert await response.text() == "the body is not JSON"


async def test_the_dashboard_mounted_in_fastapi_behind_basic_auth(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=dashboard_app.QUEUE) as producer:
        await producer.enqueue("import_rows", ["a"], group="42:orders")
    app = dashboard_app.create_app(redis_url, operators={"ops": "s3cret-pass"})
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url, headers={"origin": url}) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}
            anonymous = await http.get("/dashboard/")
            assert anonymous.status_code == 401
            assert anonymous.headers["www-authenticate"].startswith("Basic")
            wrong = await http.get("/dashboard/", auth=("ops", "guess"))
            assert wrong.status_code == 401

            http.auth = ("ops", "s3cret-pass")
            page = await http.get("/dashboard/q/imports")
            assert page.status_code == 200
            # Its links, assets and cookies live under the mount path.
            assert 'href="/dashboard/q/imports/groups"' in page.text
            assert 'src="/dashboard/static/dashboard.js"' in page.text
            (cookie,) = http.cookies.jar
            assert (cookie.name, cookie.path) == ("aiogroupq_csrf", "/dashboard/")
            assert (
                await http.get("/dashboard/static/dashboard.css")
            ).status_code == 200
            group = await http.get(
                "/dashboard/q/imports/group", params={"name": "42:orders"}
            )
            assert "waits for a free consumer" in group.text

            csrf = http.cookies["aiogroupq_csrf"]
            paused = await http.post(
                "/dashboard/q/imports/group/pause",
                data={
                    "csrf": csrf,
                    "name": "42:orders",
                    "next": "/dashboard/q/imports",
                },
            )
            assert paused.status_code == 303
            assert paused.headers["location"] == "/dashboard/q/imports"
            # Basic credentials ride along on a cross-site form too: the
            # CSRF checks are what refuses it.
            forged = await http.post(
                "/dashboard/q/imports/group/resume",
                data={"name": "42:orders"},
                headers={"origin": "https://evil.example"},
            )
            assert forged.status_code == 403
    async with aiogroupq.Admin(redis_client, queue=dashboard_app.QUEUE) as admin:
        assert (await admin.group_settings("42:orders")).paused


@pytest.mark.parametrize("module", [fastapi_app, aiohttp_app], ids=lambda m: m.__name__)
def test_web_examples_take_host_port_and_redis_url_from_options_or_environment(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HOST", "PORT", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    default = module.options([])
    assert (default.host, default.redis_url) == ("127.0.0.1", module.DEFAULT_REDIS_URL)
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("PORT", "9001")
    monkeypatch.setenv("REDIS_URL", "redis://cache:6379/2")
    from_env = module.options([])
    assert (from_env.host, from_env.port, from_env.redis_url) == (
        "0.0.0.0",
        9001,
        "redis://cache:6379/2",
    )
    given = module.options(["--host", "::1", "--port", "9002", "--redis-url", "x"])
    assert (given.host, given.port, given.redis_url) == ("::1", 9002, "x")
    monkeypatch.setenv("PORT", "eighty")
    with pytest.raises(SystemExit):
        module.options([])


def _popen(
    argv: Sequence[str], cwd: Path, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start *argv* in *cwd*, its output in *log*."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def _stop(process: subprocess.Popen[bytes], signum: int) -> int:
    """Send *signum* and wait; kill it if it does not exit in time (half the
    patience: a failed test's waits and this one stay within pytest's
    timeout, so that its ``finally`` runs and leaves no process behind)."""
    process.send_signal(signum)
    try:
        return process.wait(timeout=PATIENCE / 2)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "by_environment"),
    [("fastapi_app", False), ("aiohttp_app", True)],
    ids=["fastapi-options", "aiohttp-environment"],
)
async def test_web_examples_serve_where_they_are_told(
    module: str, by_environment: bool, redis_url: str, tmp_path: Path
) -> None:
    """``python -m examples.<app>`` serves on the host and port given by its
    options (FastAPI) or by ``$HOST`` and ``$PORT`` (aiohttp)."""
    port = free_port()
    where = {"HOST": "127.0.0.1", "PORT": str(port), "REDIS_URL": redis_url}
    argv = [sys.executable, "-m", f"examples.{module}"]
    env = dict(os.environ)
    if by_environment:
        env.update(where)
    else:
        argv += ["--host", "127.0.0.1", "--port", str(port), "--redis-url", redis_url]
    log = tmp_path / "server.log"
    server = _popen(argv, ROOT, log, env)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            with anyio.fail_after(PATIENCE):
                while True:
                    assert server.poll() is None, log.read_text()
                    try:
                        response = await http.get("/tasks/nope")
                        break
                    except httpx.TransportError:
                        await anyio.sleep(0.1)
        assert response.status_code == 404, log.read_text()
    finally:
        _stop(server, signal.SIGINT)


# -- the getting-started page, run as written ---------------------------------

GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def _named_blocks(page: Path) -> dict[str, str]:
    """The page's code blocks whose first line is ``# <file name>``."""
    text = page.read_text()
    found = re.findall(
        r"^```python\n# (\S+\.py)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL
    )
    return dict(found)


def _guarded(source: str) -> bool:
    """Whether every top-level call statement of *source* sits under
    ``if __name__ == "__main__":`` (importing it then starts nothing)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return False
        if isinstance(node, ast.If) and "__main__" not in ast.unparse(node.test):
            return False
    return True


def test_the_getting_started_consumer_is_a_worker_target() -> None:
    """``tasks.py`` of the page starts nothing when imported (the worker
    imports it), and holds the mapping its ``aiogroupq worker`` line names."""
    blocks = _named_blocks(GETTING_STARTED)
    assert set(blocks) == {"produce.py", "tasks.py"}, blocks
    assert _guarded(blocks["tasks.py"])
    assert not _guarded(blocks["produce.py"])  # a script: it runs when run
    (command,) = re.findall(
        r"^aiogroupq worker .*$", GETTING_STARTED.read_text(), re.MULTILINE
    )
    target = shlex.split(command)[2]
    assert target == "tasks:handlers"
    assert re.search(r"^handlers = \{", blocks["tasks.py"], re.MULTILINE)


@pytest.mark.slow
async def test_the_getting_started_programs_run_as_written(
    redis_url: str, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    """produce.py enqueues; the page's ``aiogroupq worker tasks:handlers``
    command (in one process) imports tasks.py, which starts no consumer of
    its own, and runs the task."""
    text = GETTING_STARTED.read_text()
    for name, source in _named_blocks(GETTING_STARTED).items():
        (tmp_path / name).write_text(
            source.replace("redis://localhost:6379/0", redis_url)
        )
    with anyio.fail_after(PATIENCE):
        produced = await anyio.run_process([sys.executable, "produce.py"], cwd=tmp_path)
    task_id, state = produced.stdout.decode().split()
    assert state == "queued"

    (command,) = re.findall(r"^aiogroupq worker .*$", text, re.MULTILINE)
    # One process (a later option wins): what is checked is the same, and a
    # failed run leaves no supervised children behind.
    argv = [*shlex.split(command)[1:], "--redis-url", redis_url, "--processes", "1"]
    log = tmp_path / "worker.log"
    worker = _popen([sys.executable, "-m", "aiogroupq", *argv], tmp_path, log)
    try:
        queue = argv[argv.index("--queue") + 1]
        async with aiogroupq.Producer(redis_client, queue=queue) as producer:
            with anyio.fail_after(PATIENCE):
                while await producer.status(task_id) != aiogroupq.TaskState.SUCCEEDED:
                    assert worker.poll() is None, log.read_text()
                    await anyio.sleep(0.1)
        # The worker's own consumer ran it: it logged that it is ready, which
        # a worker stuck importing a module that runs a consumer of its own
        # never does.
        with anyio.fail_after(PATIENCE):
            while "worker ready: tasks:handlers" not in log.read_text():
                assert worker.poll() is None, log.read_text()
                await anyio.sleep(0.1)
    finally:
        assert _stop(worker, signal.SIGTERM) == 0, log.read_text()
    assert "42:orders 1 ['a', 'b']" in log.read_text()


def _queues(source: str) -> set[str]:
    """The queue names *source* uses (``queue="..."``, ``--queue ...``)."""
    found = re.findall(r'queue="([^"]+)"|--queue ([\w-]+)', source)
    return {keyword or option for keyword, option in found}


def test_each_runnable_example_has_a_queue_of_its_own() -> None:
    """A consumer dead-letters the tasks it has no handler for: two examples
    sharing a queue would take, and lose, each other's tasks."""
    usage = (ROOT / "docs" / "usage.md").read_text()
    first = usage.split("## A first producer and consumer", 1)[1].split("\n## ", 1)[0]
    testing = (ROOT / "examples" / "testing" / "test_handlers.py").read_text()
    queues = {
        "getting-started": _queues("\n".join(_named_blocks(GETTING_STARTED).values())),
        "user guide, first producer and consumer": _queues(first),
        "examples/fastapi_app.py": {fastapi_app.QUEUE},
        "examples/aiohttp_app.py": {aiohttp_app.QUEUE},
        "examples/testing": _queues(testing),
    }
    for where, names in queues.items():
        assert len(names) == 1, (where, names)
    owners: dict[str, str] = {}
    for where, (name,) in ((w, tuple(n)) for w, n in queues.items()):
        assert name not in owners, f"{where} shares queue {name!r} with {owners[name]}"
        owners[name] = where
    # The dashboard example consumes nothing: it shows the getting-started queue.
    assert queues["getting-started"] == {dashboard_app.QUEUE}


@pytest.mark.slow
def test_the_testing_example_project_passes() -> None:
    """``examples/testing`` is a user's project: its own pytest.ini and a
    conftest.py that opts into aiogroupq's plugin; run it as they would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT / "examples" / "testing",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print(result.stdout[-2000:])  # noqa: T201
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
    assert "failed" not in result.stdout


def test_the_testing_docs_quote_the_example_files_verbatim() -> None:
    """Each code block of docs/testing.md that names an example file as its
    first line is a verbatim excerpt of that file: the docs cannot drift."""
    text = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(
        r"^```\w*\n# (examples/\S+)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL
    )
    assert len(blocks) >= 5, blocks
    for path, body in blocks:
        source = (ROOT / path).read_text()
        assert body.strip() in source, f"docs/testing.md quotes {path} wrongly"


def test_the_dashboard_docs_quote_the_example_verbatim() -> None:
    """The code blocks of docs/operating.md that name examples/dashboard_app.py
    are verbatim excerpts of it, and the screenshots they show exist."""
    text = (ROOT / "docs" / "operating.md").read_text()
    blocks = re.findall(
        r"^```\w*\n# (examples/dashboard_app.py)\n(.*?)^```$",
        text,
        re.MULTILINE | re.DOTALL,
    )
    assert len(blocks) == 2, blocks
    source = (ROOT / "examples" / "dashboard_app.py").read_text()
    for _, body in blocks:
        assert body.strip() in source, "docs/operating.md quotes the example wrongly"
    images = re.findall(r"\]\((images/dashboard-[a-z]+\.png)\)", text)
    assert len(set(images)) == 7, images
    for image in images:
        assert (ROOT / "docs" / image).read_bytes().startswith(b"\x89PNG"), image
