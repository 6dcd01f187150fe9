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
from examples import aiohttp_app, dashboard_app, fastapi_app
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
    """The code blocks of docs/usage.md that name examples/dashboard_app.py
    are verbatim excerpts of it, and the screenshots they show exist."""
    text = (ROOT / "docs" / "usage.md").read_text()
    blocks = re.findall(
        r"^```\w*\n# (examples/dashboard_app.py)\n(.*?)^```$",
        text,
        re.MULTILINE | re.DOTALL,
    )
    assert len(blocks) == 2, blocks
    source = (ROOT / "examples" / "dashboard_app.py").read_text()
    for _, body in blocks:
        assert body.strip() in source, "docs/usage.md quotes the example wrongly"
    images = re.findall(r"\]\((images/dashboard-[a-z]+\.png)\)", text)
    assert len(set(images)) == 7, images
    for image in images:
        assert (ROOT / "docs" / image).read_bytes().startswith(b"\x89PNG"), image
