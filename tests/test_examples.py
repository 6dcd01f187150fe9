"""The web examples (``examples/``), driven by their frameworks' test clients
against the real test server, with a real consumer running what the
endpoints enqueued; and the "Testing your handlers" example project
(``examples/testing/``), run by pytest as a user would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis.asyncio
from aiohttp.test_utils import TestClient, TestServer

import aiogroupq
from aiogroupq.testing import drain
from examples import aiohttp_app, fastapi_app

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
