"""The dashboard end to end in a real headless Chromium (Debian's package,
driven by Playwright; no browser is downloaded): a Redis server, an
``aiogroupq worker`` process and an ``aiogroupq dashboard`` process; the
counts change on the page without a reload, a dead letter is requeued from
the page and succeeds, a paused group stops and a resumed one goes on.

It takes a screenshot of each page; with ``AIOGROUPQ_SCREENSHOTS=DIR`` (``nox
-s browser`` sets docs/images) they are saved there as
``dashboard-<page>.png`` for the docs.

Skipped, saying why, without Playwright (``nox -s browser`` installs it) or
without Chromium (``apt-get install chromium``; ``$AIOGROUPQ_CHROMIUM`` names
another binary).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq.testing._server import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

async_api = pytest.importorskip(
    "playwright.async_api",
    reason="Playwright is not installed (nox -s browser installs it)",
)
expect = async_api.expect
CHROMIUM = (
    os.environ.get("AIOGROUPQ_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)
if CHROMIUM is None:
    pytest.skip(
        "no Chromium installed (Debian: apt-get install chromium)",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "imports"
TOKEN = "browser-test-token-0123456789"
#: Chromium in a container without network or GPU: no sandbox (we run as
#: root), and nothing that would try to reach the internet
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: seconds any one thing may take to show on the page: liveness only
LIVE = 30.0


@asynccontextmanager
async def process(
    *argv: str, log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[Any]:
    """A ``python -m aiogroupq`` process writing to *log*, stopped with
    SIGTERM at the end (its log is printed: pytest shows it on failure)."""
    full = {**os.environ, **(env or {})}
    with log.open("wb") as out:
        async with await anyio.open_process(
            [sys.executable, "-m", "aiogroupq", *argv], cwd=ROOT, env=full,
            stdout=out, stderr=out,
        ) as proc:  # fmt: skip
            try:
                yield proc
            finally:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(60):
                    await proc.wait()
                tail = (await anyio.Path(log).read_text())[-4000:]
                print(f"--- {argv[0]} ---\n{tail}")  # noqa: T201


async def wait_until_serving(url: str) -> None:
    async with httpx.AsyncClient() as client:
        with anyio.fail_after(LIVE):
            while True:
                try:
                    await client.get(url + "/static/dashboard.css")
                    return
                except httpx.TransportError:
                    await anyio.sleep(0.1)


async def feed(producer: aiogroupq.Producer, stop: anyio.Event) -> None:
    """A steady trickle of work in a few groups, one task in ten failing:
    something for the charts to show."""
    n = 0
    while not stop.is_set():
        await producer.enqueue_many(
            [
                aiogroupq.Task(
                    "work",
                    {"sleep": 0.02, "fail": (n + i) % 10 == 0},
                    group=f"tenant-{(n + i) % 7}",
                    max_attempts=2,
                )
                for i in range(8)
            ]
        )
        n += 8
        await anyio.sleep(0.5)


async def test_the_dashboard_in_a_browser(
    redis_url: str, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gate = tmp_path / "gate"
    gate.touch()
    worker = ["worker", "tests.dashboard_tasks:HANDLERS", "--queue", QUEUE]
    worker += ["--redis-url", redis_url, "--concurrency", "4", "--name", "worker-1"]
    worker += ["--lease-ttl", "3"]  # a heartbeat a second: fresh counts to show
    dashboard = ["dashboard", "--redis-url", redis_url, "--queue", QUEUE]
    # A short history: the test's own minute fills the charts of the screenshots.
    dashboard += ["--port", str(port), "--token-env", "DASH_TOKEN", "--history", "20"]
    # The reasons and tracebacks, for the dead-letter and task pages (and
    # their screenshots): this test's errors quote no secret.
    dashboard += ["--show-errors"]
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        process(*worker, log=tmp_path / "worker.log"),
        process(*dashboard, log=tmp_path / "dashboard.log", env={"DASH_TOKEN": TOKEN}),
        async_api.async_playwright() as playwright,
    ):
        await wait_until_serving(url)
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS
        )
        context = await chromium.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        page.set_default_timeout(LIVE * 1000)
        page.on("dialog", lambda dialog: dialog.accept())
        tour = Tour(page, url, shots)
        await sign_in(tour)
        await counts_change_live(tour, producer)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed, producer, stop)
            await requeue_a_dead_letter(tour, producer, gate)
            await pause_and_resume_a_group(tour, producer, admin)
            await visit_the_other_pages(tour)
            stop.set()
        await chromium.close()

    taken = sorted(p.name for p in shots.iterdir())
    print("screenshots:", taken)  # noqa: T201
    assert len(taken) == 8
    if target := os.environ.get("AIOGROUPQ_SCREENSHOTS"):
        for shot in shots.iterdir():
            shutil.copyfile(shot, Path(target) / shot.name)


@dataclass(frozen=True, slots=True)
class Tour:
    """The browser's page on the dashboard, and where its screenshots go."""

    page: Any
    url: str
    shots: Path

    async def shoot(self, name: str) -> None:
        await self.page.screenshot(path=self.shots / f"dashboard-{name}.png")


async def sign_in(tour: Tour) -> None:
    page = tour.page
    await page.goto(tour.url + "/")
    await expect(page).to_have_url(re.compile(r"/login\?next="))
    await tour.shoot("login")
    await page.fill("#token", "not the token")
    await page.click("form.login button")
    await expect(page.locator("p.flash.error")).to_contain_text("not the token")
    await page.fill("#token", TOKEN)
    await page.click("form.login button")
    await expect(page.locator("h1")).to_have_text("Queues")


async def counts_change_live(tour: Tour, producer: aiogroupq.Producer) -> None:
    """The counts change live, without a reload."""
    page = tour.page
    await page.evaluate("window.notReloaded = true")
    succeeded = page.locator(".fig-succeeded .value")
    await expect(succeeded).to_have_text("0")
    await producer.enqueue_many(
        [aiogroupq.Task("work", {"sleep": 0.01}, group=f"g{i % 5}") for i in range(100)]
    )
    await expect(succeeded).to_have_text("100")
    assert await page.evaluate("window.notReloaded === true")
    await expect(page.locator("#live-status")).to_contain_text("live ·")


async def requeue_a_dead_letter(
    tour: Tour, producer: aiogroupq.Producer, gate: Path
) -> None:
    """A dead letter, requeued from the page, succeeds."""
    page, url = tour.page, tour.url
    dead_id = await producer.enqueue(
        "gated", {"gate": str(gate)}, group="billing-7", max_attempts=1
    )
    await page.goto(f"{url}/q/{QUEUE}/dead?type=gated")
    row = page.locator(f'tr[data-task="{dead_id}"]')
    await expect(row).to_contain_text("rejected the import")
    await page.goto(f"{url}/q/{QUEUE}/task?id={dead_id}")
    await expect(page.locator("pre.traceback")).to_contain_text("RuntimeError")
    await tour.shoot("task")
    await page.goto(f"{url}/q/{QUEUE}/dead")
    await expect(page.locator(f'tr[data-task="{dead_id}"]')).to_be_visible()
    await tour.shoot("dead")
    await anyio.Path(gate).unlink()  # "the bug is fixed"
    await page.check(f'tr[data-task="{dead_id}"] input[type=checkbox]')
    await page.click("text=Requeue selected")
    await expect(page.locator("p.flash.ok")).to_contain_text(
        "requeued 1 of 1 dead letters"
    )
    await page.goto(f"{url}/q/{QUEUE}/task?id={dead_id}")
    await expect(page.locator("#task-state")).to_have_text("succeeded")
    assert await producer.status(dead_id) == "succeeded"


async def pause_and_resume_a_group(
    tour: Tour, producer: aiogroupq.Producer, admin: aiogroupq.Admin
) -> None:
    """A paused group stops; resumed, it goes on."""
    page = tour.page
    await producer.enqueue_many(
        [aiogroupq.Task("work", {"sleep": 0.3}, group="acme") for _ in range(40)]
    )
    await page.goto(f"{tour.url}/q/{QUEUE}/group?name=acme")
    await page.click("text=Pause group")
    await expect(page.locator("p.flash.ok")).to_contain_text("paused group 'acme'")
    await expect(page.locator("#group-actions .state")).to_have_text("paused")
    with anyio.fail_after(LIVE):  # the task that was running finishes
        while (info := await admin.group_info("acme")).running:
            await anyio.sleep(0.1)
    held = info.backlog
    await anyio.sleep(2.0)  # several claims and refreshes later...
    info = await admin.group_info("acme")
    assert (info.running, info.backlog) == (0, held)  # ...it has not moved
    assert held > 0
    await expect(page.locator("#group-reason")).to_contain_text("paused")
    await tour.shoot("group")
    await page.click("text=Resume group")
    await expect(page.locator("#group-actions .state")).not_to_have_text("paused")
    # Its line shrinks on the page as the worker takes its tasks again.
    backlog = page.locator("[data-backlog]")
    await expect(backlog).not_to_have_text(re.compile(rf"^{held}\b"))


async def visit_the_other_pages(tour: Tour) -> None:
    page, url = tour.page, tour.url
    await page.goto(f"{url}/q/{QUEUE}/groups")
    await expect(page.locator("tr[data-group]").first).to_be_visible()
    await tour.shoot("groups")
    await page.goto(f"{url}/q/{QUEUE}/consumers")
    await expect(page.locator('tr[data-consumer="worker-1"]')).to_contain_text("alive")
    await tour.shoot("consumers")
    await page.goto(f"{url}/q/{QUEUE}")
    await expect(page.locator("#queue-figures polyline").first).to_be_attached()
    await tour.shoot("queue")
    await page.goto(url + "/")
    await expect(page.locator(".card polyline").first).to_be_attached()
    await tour.shoot("overview")
