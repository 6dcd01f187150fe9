"""The web dashboard's routes, served by a real uvicorn server (in a thread,
with its own event loop and its own Redis client, as in production) and
driven over HTTP by httpx; the queue's state is set up and checked with the
library's own calls against the test server.

The browser test (tests/test_dashboard_browser.py) drives the same pages in
Chromium, JavaScript included.
"""

from __future__ import annotations

import html
import re
import signal
import socket
import sys
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Mount

import aiogroupq
from aiogroupq._dashboard._history import (
    History,
    failure_chart,
    nice_max,
    throughput_chart,
)
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq.dashboard import create_app
from aiogroupq.testing import drain
from tests._web import serving

QUEUE = "dash"
TOKEN = "correct-horse-battery-staple"


@asynccontextmanager
async def browser(url: str, **headers: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client that sends what a browser's same-site form sends."""
    async with httpx.AsyncClient(
        base_url=url, headers={"origin": url, **headers}, timeout=30
    ) as client:
        yield client


async def login(client: httpx.AsyncClient, token: str = TOKEN) -> httpx.Response:
    page = await client.get("/login")
    assert page.status_code == 200
    return await client.post(
        "/login", data={"csrf": csrf(page.text), "token": token, "next": "/"}
    )


def csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF field on the page"
    return match[1]


async def act(
    client: httpx.AsyncClient, path: str, **fields: str | list[str]
) -> httpx.Response:
    """Submit a form of a page: the CSRF token comes from its cookie, as the
    page embeds it."""
    if "aiogroupq_csrf" not in client.cookies:
        await client.get("/", follow_redirects=True)
    data: dict[str, Any] = {"csrf": client.cookies["aiogroupq_csrf"], **fields}
    return await client.post(path, data=data)


def figures(page: str) -> dict[str, str]:
    """The big figures of a page, by label."""
    found = re.findall(
        r'<span class="value">([^<]*)</span><span class="label">([^<]*)</span>', page
    )
    return {label: value for value, label in found}


def text(page: str) -> str:
    """A page's visible text, whitespace collapsed."""
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", page, flags=re.DOTALL)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


async def fail(payload: Any) -> None:
    raise RuntimeError(f"cannot import {payload!r}")


async def fail_quietly(payload: Any) -> None:
    raise RuntimeError("cannot import")  # the payload stays out of the reason


async def ok(payload: Any) -> str:
    return "done"


# -- reading -----------------------------------------------------------------------


async def test_pages_show_what_the_queue_holds(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = [await producer.enqueue("work", i, group="tenant-7") for i in range(3)]
        await producer.enqueue("work", 9, group="tenant-8")
        await producer.enqueue("solo", 0)
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            overview = await client.get("/")
            assert overview.status_code == 200
            assert figures(overview.text)["waiting"] == "5"
            queue = await client.get(f"/q/{QUEUE}")
            # One task per group and the ungrouped one are ready; the rest of
            # tenant-7 waits in its group's line.
            assert figures(queue.text)["ready"] == "3"
            assert figures(queue.text)["parked"] == "2"
            assert "tenant-7" in queue.text  # among the busiest groups

            group = await client.get(f"/q/{QUEUE}/group", params={"name": "tenant-7"})
            info_text = text(group.text)
            assert "ready" in info_text
            assert "no consumer is alive" in info_text  # the reason, from group_info

            task = await client.get(f"/q/{QUEUE}/task", params={"id": ids[2]})
            assert task.status_code == 200
            assert "line, 2 ahead of it" in text(task.text)  # its place in its group

            missing = await client.get(f"/q/{QUEUE}/task", params={"id": "nope"})
            assert missing.status_code == 404
            assert "No task nope" in text(missing.text)
            assert (await client.get("/q/other")).status_code == 404


async def test_held_tasks_an_ended_task_and_a_dead_consumer_are_shown(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
    ):
        done = await producer.enqueue("work", {"n": 1})
        await drain(redis_client, queue=QUEUE, handlers={"work": ok})
        # A paused group holds its three tasks back, though no claim met them.
        await producer.enqueue_many(
            [aiogroupq.Task("work", i, group="p7") for i in range(3)]
        )
        await admin.pause_group("p7")
        # A task claimed by a consumer that is not alive.
        stuck = await producer.enqueue("work", 0, group="s1")
        claimed = await _scripts.claim(
            redis_client, QueueKeys(QUEUE), "ghost", k=1, lease_ms=60_000, scan_limit=10
        )
        assert [t.id for t in claimed.tasks] == [stuck]
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            shown = figures((await client.get(f"/q/{QUEUE}")).text)
            assert (shown["ready"], shown["parked"], shown["held"]) == ("0", "0", "3")

            page = text(
                (await client.get(f"/q/{QUEUE}/task", params={"id": done})).text
            )
            assert "state succeeded why succeeded" in page
            assert "type work" in page
            assert "payload size 4 B" in page  # {"n": 1}, encoded
            assert re.search(r"enqueued \d{4}-\d\d-\d\d \S+Z \(\S+ ago\)", page)
            assert "Not kept once a task ends" in page

            page = text(
                (await client.get(f"/q/{QUEUE}/task", params={"id": stuck})).text
            )
            assert "consumer ghost (not alive)" in page
            assert "running, but its consumer ghost is not alive" in page
            page = text(
                (await client.get(f"/q/{QUEUE}/group", params={"name": "s1"})).text
            )
            assert f"task {stuck}'s consumer ghost is not alive" in page
            assert "ghost (not alive)" in page  # in the slot holders


async def test_a_partitioned_queue_is_shown_whole(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The pages read through Admin, whose views add up the partitions: the
    groups of every partition are counted, listed and found."""
    queue = "dash-parts"
    groups = [f"tenant-{i}" for i in range(12)]
    async with aiogroupq.Producer(redis_client, queue=queue, partitions=4) as producer:
        for i, group in enumerate(groups):
            await producer.enqueue_many(
                [aiogroupq.Task("work", n, group=group) for n in range(1 + i % 3)]
            )
        await producer.enqueue("solo", 0)
        homes = {zlib.crc32(g.encode()) % 4 for g in groups}
    assert len(homes) > 1  # the groups really are spread
    total = sum(1 + i % 3 for i in range(12)) + 1
    with serving(create_app(redis_url, queues=[queue])) as url:
        async with browser(url) as client:
            overview = await client.get("/")
            assert figures(overview.text)["waiting"] == str(total)
            page = await client.get(f"/q/{queue}")
            assert figures(page.text)["ready"] == str(len(groups) + 1)
            assert figures(page.text)["parked"] == str(total - len(groups) - 1)
            # The groups page lists the groups with a line, from every partition.
            listed = await client.get(f"/q/{queue}/groups")
            lined = [g for i, g in enumerate(groups) if i % 3]
            assert all(g in listed.text for g in lined)
            one = await client.get(f"/q/{queue}/group", params={"name": groups[5]})
            assert one.status_code == 200
            assert "ready" in text(one.text)


async def test_counts_follow_the_queue_as_it_changes(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            before = figures((await client.get(f"/q/{QUEUE}")).text)
            async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
                await producer.enqueue_many(
                    [aiogroupq.Task("work", i, group=f"g{i % 4}") for i in range(40)]
                )
            during = figures((await client.get(f"/q/{QUEUE}")).text)
            await drain(redis_client, queue=QUEUE, handlers={"work": ok})
            page = await client.get(f"/q/{QUEUE}")
            after = figures(page.text)
    print(before, during, after, sep="\n")  # noqa: T201
    assert (before["ready"], before["parked"]) == ("0", "0")
    assert (during["ready"], during["parked"]) == ("4", "36")
    assert (after["ready"], after["parked"]) == ("0", "0")
    assert re.search(r'data-total="succeeded">40<', page.text)


async def test_the_chart_plots_the_samples(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    app = create_app(redis_url, queues=[QUEUE], refresh=0.5)
    with serving(app) as url:
        async with browser(url) as client:
            first = await client.get(f"/q/{QUEUE}")
            assert "collecting samples" in first.text
            async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
                await producer.enqueue_many(
                    [aiogroupq.Task("work", i) for i in range(30)]
                )
            await drain(redis_client, queue=QUEUE, handlers={"work": ok})
            with anyio.fail_after(30):  # the lifespan's sampler, every second
                while "<polyline" not in (page := await client.get(f"/q/{QUEUE}")).text:
                    await anyio.sleep(0.2)
    assert 'class="line s-succeeded"' in page.text
    assert "collecting samples" not in page.text


async def test_groups_can_be_searched_filtered_and_sorted(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
    ):
        for group, backlog in (("acme:orders", 2), ("acme:users", 4), ("zeta", 3)):
            for i in range(backlog + 1):
                await producer.enqueue("work", i, group=group)
        await admin.pause_group("zeta")
        await producer.enqueue("work", 0, group="lonely")  # no line behind it
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:

            async def listed(**params: str) -> list[str]:
                page = await client.get(f"/q/{QUEUE}/groups", params=params)
                assert page.status_code == 200
                return re.findall(r'<tr data-group="([^"]+)">', page.text)

            assert await listed() == ["acme:users", "zeta", "acme:orders"]
            assert await listed(sort="age") == ["acme:orders", "acme:users", "zeta"]
            assert await listed(q="ACME") == ["acme:users", "acme:orders"]
            assert await listed(state="paused") == ["zeta"]
            assert await listed(state="ready") == ["acme:users", "acme:orders"]
            # A name is looked up exactly, even a group the lists do not hold.
            assert await listed(q="lonely") == ["lonely"]
            bad = await client.get(f"/q/{QUEUE}/groups", params={"q": "x" * 300})
            assert "invalid group" in text(bad.text)


async def test_consumers_page_lists_live_consumers(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with (
            browser(url) as client,
            aiogroupq.Consumer(
                redis_url, queue=QUEUE, handlers={"work": ok}, name="worker-a"
            ),
        ):
            page = await client.get(f"/q/{QUEUE}/consumers")
    assert 'data-consumer="worker-a"' in page.text
    assert "alive" in text(page.text)


async def test_payloads_and_results_are_shown_only_when_enabled(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    secret = "iban-DE89370400440532013000"

    async def echo(payload: dict[str, str]) -> str:
        return payload["account"]

    handlers: dict[str, Any] = {
        "work": aiogroupq.Handler(echo, store_result=True),
        "bad": fail_quietly,
    }
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        done_id = await producer.enqueue("work", {"account": secret})
        dead_id = await producer.enqueue("bad", {"account": secret}, max_attempts=1)
        await drain(redis_client, queue=QUEUE, handlers=handlers)
        later_id = await producer.enqueue("work", {"account": secret}, delay=3600)
    pages: dict[bool, list[str]] = {}
    for shown in (False, True):
        app = create_app(redis_url, queues=[QUEUE], show_payloads=shown)
        with serving(app) as url:
            async with browser(url) as client:
                pages[shown] = [
                    (await client.get(f"/q/{QUEUE}/task", params={"id": i})).text
                    for i in (done_id, dead_id, later_id)
                ]
                pages[shown].append((await client.get(f"/q/{QUEUE}/dead")).text)
    # The result of the succeeded task, the payloads of the others.
    assert [secret in page for page in pages[True]] == [True] * 4
    assert [secret in page for page in pages[False]] == [False] * 4
    assert "Hidden" in pages[False][0]
    # With the payloads, the reason and the traceback: they may quote one.
    assert "RuntimeError: cannot import" in pages[True][1]
    assert "Traceback (most recent call last)" in pages[True][1]
    assert "RuntimeError: cannot import" not in pages[False][1]
    assert "Traceback (most recent call last)" not in pages[False][1]


async def _sent(client: redis.asyncio.Redis) -> int:
    """Bytes the server has sent to its clients so far."""
    return int((await client.info("stats"))["total_net_output_bytes"])


async def test_the_dead_letters_page_reads_only_the_start_of_each_payload(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    # With payloads shown, the page read every payload whole: 25 MiB from
    # Redis for a page of 50 letters of 512 KiB, at every refresh, to show
    # 80 characters of each.
    letters, blob = 20, "x" * (480 * 1024)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        for i in range(letters):
            payload = {"account": f"acct-{i:02}", "blob": blob}
            await producer.enqueue("bad", payload, max_attempts=1)
        await drain(redis_client, queue=QUEUE, handlers={"bad": fail_quietly})
    app = create_app(redis_url, queues=[QUEUE], show_payloads=True)
    with serving(app) as url:
        async with browser(url) as client:
            await client.get(f"/q/{QUEUE}/dead")  # connections and scripts ready
            before = await _sent(redis_client)
            page = await client.get(f"/q/{QUEUE}/dead")
            sent = await _sent(redis_client) - before
    print(f"a page of {letters} letters of 480 KiB read {sent} bytes")  # noqa: T201
    assert page.status_code == 200
    shown = text(page.text)
    assert [f"acct-{i:02}" in shown for i in range(letters)] == [True] * letters
    assert '"blob": "xxxx' in html.unescape(page.text)
    assert sent < letters * len(blob) // 20, sent


# -- authentication and CSRF -------------------------------------------------------


async def test_without_auth_it_is_read_only(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            page = await client.get(f"/q/{QUEUE}")
            assert "read-only" in text(page.text)
            assert "Pause queue" not in page.text
            refused = await act(client, f"/q/{QUEUE}/pause", next=f"/q/{QUEUE}")
            assert refused.status_code == 403
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        assert not (await admin.settings()).paused


async def test_a_token_login_guards_pages_and_allows_actions(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with browser(url) as client:
            first = await client.get(f"/q/{QUEUE}/groups?sort=age")
            assert first.status_code == 303
            assert (
                first.headers["location"]
                == "/login?next=%2Fq%2Fdash%2Fgroups%3Fsort%3Dage"
            )
            refused = await act(client, f"/q/{QUEUE}/pause")
            assert refused.status_code == 403

            wrong = await login(client, "not-the-token-at-all")
            assert wrong.status_code == 401
            assert "aiogroupq_session" not in client.cookies
            signed_in = await login(client)
            assert signed_in.status_code == 303
            session = signed_in.headers["set-cookie"]
            assert "HttpOnly" in session
            assert "SameSite=strict" in session or "samesite=strict" in session.lower()

            page = await client.get(f"/q/{QUEUE}")
            assert page.status_code == 200
            assert "Pause queue" in page.text
            done = await act(client, f"/q/{QUEUE}/pause", next=f"/q/{QUEUE}")
            assert (done.status_code, done.headers["location"]) == (303, f"/q/{QUEUE}")
            async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
                assert (await admin.settings()).paused
                shown = await client.get(done.headers["location"])
                assert "paused queue 'dash'" in text(shown.text)
                await act(client, f"/q/{QUEUE}/resume")
                assert not (await admin.settings()).paused

            out = await act(client, "/logout")
            assert out.status_code == 303
            assert (await client.get("/")).status_code == 303


async def test_a_forged_session_cookie_is_refused(redis_url: str) -> None:
    app = create_app(redis_url, queues=[QUEUE], token=TOKEN)
    other = create_app(redis_url, queues=[QUEUE], token="another-token-of-16+chars")
    with serving(other) as other_url:
        async with browser(other_url) as client:
            await login(client, "another-token-of-16+chars")
            foreign = client.cookies["aiogroupq_session"]
    with serving(app) as url:
        async with browser(url) as client:
            for value in (foreign, "1.2.3", "", f"{int(time.time())}.x.forged"):
                client.cookies.set("aiogroupq_session", value)
                assert (await client.get("/")).status_code == 303, value


async def test_forms_need_the_csrf_token_and_a_same_site_origin(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with browser(url) as client:
            await login(client)
            token = client.cookies["aiogroupq_csrf"]
            path = f"/q/{QUEUE}/pause"
            attempts = {
                "no csrf field": ({"next": "/"}, {}),
                "a wrong csrf field": ({"csrf": "x" * 43}, {}),
                "another site's origin": (
                    {"csrf": token},
                    {"origin": "https://evil.example"},
                ),
                "a null origin": ({"csrf": token}, {"origin": "null"}),
                "another site's referer": (
                    {"csrf": token},
                    {"origin": "", "referer": "https://evil.example/page"},
                ),
            }
            for name, (data, headers) in attempts.items():
                response = await client.post(path, data=data, headers=headers)
                assert response.status_code == 403, name
            # No Origin and no Referer at all: refused too.
            bare = httpx.AsyncClient(base_url=url, cookies=client.cookies)
            async with bare:
                response = await bare.post(path, data={"csrf": token})
                assert response.status_code == 403
                assert "names no Origin" in text(response.text)
            json_body = await client.post(path, json={"csrf": token})
            assert json_body.status_code == 415
            async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
                assert not (await admin.settings()).paused
                # The same-site Referer alone is enough when Origin is absent.
                response = await client.post(
                    path,
                    data={"csrf": token},
                    headers={"origin": "", "referer": url + "/"},
                )
                assert response.status_code == 303
                assert (await admin.settings()).paused


async def test_read_only_refuses_actions_even_when_signed_in(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    app = create_app(redis_url, queues=[QUEUE], token=TOKEN, read_only=True)
    with serving(app) as url:
        async with browser(url) as client:
            await login(client)
            page = await client.get(f"/q/{QUEUE}")
            assert page.status_code == 200
            assert "Pause queue" not in page.text
            assert "started read-only" in text(page.text)
            assert (await act(client, f"/q/{QUEUE}/pause")).status_code == 403
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        assert not (await admin.settings()).paused


async def test_the_host_applications_auth_check_decides(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async def is_admin(request: Request) -> bool:
        role = request.headers.get("x-role")
        if role is None:
            raise HTTPException(401, "who are you?", {"WWW-Authenticate": "Basic"})
        return role == "admin"

    with serving(create_app(redis_url, queues=[QUEUE], auth=is_admin)) as url:
        async with browser(url) as anonymous:
            response = await anonymous.get("/")
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Basic"
        async with browser(url, **{"x-role": "guest"}) as guest:
            assert (await guest.get("/")).status_code == 403
            assert (await act(guest, f"/q/{QUEUE}/pause")).status_code == 403
        async with browser(url, **{"x-role": "admin"}) as admin_client:
            assert "Pause queue" in (await admin_client.get(f"/q/{QUEUE}")).text
            assert (await act(admin_client, f"/q/{QUEUE}/pause")).status_code == 303
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        assert (await admin.settings()).paused


async def test_after_an_action_it_never_redirects_to_another_site(
    redis_url: str,
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with browser(url) as client:
            await login(client)
            for target in (
                "https://evil.example/",
                "//evil.example/",
                "/\\evil.example",
                "javascript:alert(1)",
            ):
                response = await act(client, f"/q/{QUEUE}/resume", next=target)
                assert response.headers["location"] == f"/q/{QUEUE}", target


async def test_mounted_under_a_path_its_urls_and_cookies_follow(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    dashboard = create_app(redis_url, queues=[QUEUE], token=TOKEN)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with dashboard.router.lifespan_context(dashboard):
            yield

    host = Starlette(routes=[Mount("/ops/dash", app=dashboard)], lifespan=lifespan)
    with serving(host) as url:
        async with browser(url) as client:
            first = await client.get("/ops/dash/q/dash")
            assert (
                first.headers["location"]
                == "/ops/dash/login?next=%2Fops%2Fdash%2Fq%2Fdash"
            )
            page = await client.get("/ops/dash/login")
            assert 'action="/ops/dash/login"' in page.text
            signed_in = await client.post(
                "/ops/dash/login",
                data={
                    "csrf": csrf(page.text),
                    "token": TOKEN,
                    "next": "/ops/dash/q/dash",
                },
            )
            assert signed_in.headers["location"] == "/ops/dash/q/dash"
            assert {c.path for c in client.cookies.jar} == {"/ops/dash/"}
            queue = await client.get("/ops/dash/q/dash")
            assert 'href="/ops/dash/q/dash/groups"' in queue.text
            assert 'href="/ops/dash/static/dashboard.css"' in queue.text
            # A "next" outside the mount is not followed.
            paused = await act(client, "/ops/dash/q/dash/pause", next="/elsewhere")
            assert paused.headers["location"] == "/ops/dash/q/dash"
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        assert (await admin.settings()).paused


async def test_every_response_forbids_framing_and_foreign_scripts(
    redis_url: str,
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            for path in ("/", f"/q/{QUEUE}", "/static/dashboard.js", "/nowhere"):
                response = await client.get(path)
                policy = response.headers["content-security-policy"]
                assert "frame-ancestors 'none'" in policy, path
                assert "script-src 'self'" in policy, path
                assert response.headers["x-content-type-options"] == "nosniff"
            script = await client.get("/static/dashboard.js")
            assert script.status_code == 200
            assert "javascript" in script.headers["content-type"]
            css = await client.get("/static/dashboard.css")
            assert css.status_code == 200


async def test_group_names_and_reasons_are_escaped(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    evil = '<script>alert("x")</script>'
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("work", 1, group=evil)
        await producer.enqueue("work", 2, group=evil)
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            for path, params in (
                (f"/q/{QUEUE}/groups", {}),
                (f"/q/{QUEUE}/group", {"name": evil}),
                (f"/q/{QUEUE}", {}),
            ):
                page = await client.get(path, params=params)
                assert page.status_code == 200
                assert evil not in page.text, path
                assert "&lt;script&gt;" in page.text, path


# -- acting ------------------------------------------------------------------------


async def test_dead_letters_are_listed_filtered_requeued_and_purged(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        imports = [
            await producer.enqueue("import", i, group="t1", max_attempts=1)
            for i in range(3)
        ]
        mail = await producer.enqueue("mail", 0, max_attempts=1)
    await drain(redis_client, queue=QUEUE, handlers={"import": fail, "mail": fail})
    app = create_app(redis_url, queues=[QUEUE], token=TOKEN, show_errors=True)
    with serving(app) as url:
        async with browser(url) as client:
            await login(client)

            async def rows(**params: str) -> list[str]:
                page = await client.get(f"/q/{QUEUE}/dead", params=params)
                return re.findall(r'<tr data-task="([^"]+)">', page.text)

            # Oldest first; the ungrouped task may have died among the others.
            assert sorted(await rows()) == sorted([*imports, mail])
            assert await rows(type="mail") == [mail]
            assert await rows(group="T1") == imports  # in their group's order
            assert await rows(reason="cannot import 2") == [imports[2]]
            assert len(await rows(limit="2")) == 2

            requeued = await act(
                client,
                f"/q/{QUEUE}/dead/requeue",
                id=imports[:2],
                next=f"/q/{QUEUE}/dead",
            )
            assert requeued.status_code == 303
            shown = await client.get(requeued.headers["location"])
            assert "requeued 2 of 2 dead letters" in text(shown.text)
            async with (
                aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
                aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
            ):
                states = await producer.status_many([*imports, mail])
                assert states == ["queued", "queued", "dead", "dead"]
                outcomes = await drain(
                    redis_client, queue=QUEUE, handlers={"import": ok}
                )
                assert [o.id for o in outcomes] == imports[:2]  # in group order

                # Purging every dead letter needs the box ticked.
                unconfirmed = await act(client, f"/q/{QUEUE}/dead/purge", all="1")
                shown = await client.get(unconfirmed.headers["location"])
                assert "confirmation box" in text(shown.text)
                assert await producer.status(mail) == "dead"
                nothing = await act(client, f"/q/{QUEUE}/dead/purge", id="not-dead")
                shown = await client.get(nothing.headers["location"])
                assert "none of the 1 tasks is a dead letter" in text(shown.text)

                await act(client, f"/q/{QUEUE}/dead/purge", id=[mail])
                assert await producer.status(mail) is None
                await act(client, f"/q/{QUEUE}/dead/purge", all="1", confirm="yes")
                assert await admin.dead_letters() == []


async def test_requeue_all_requeues_every_dead_letter(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue_many(
            [aiogroupq.Task("import", i, max_attempts=1) for i in range(7)]
        )
    await drain(redis_client, queue=QUEUE, handlers={"import": fail})
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with browser(url) as client:
            await login(client)
            response = await act(client, f"/q/{QUEUE}/dead/requeue", all="1")
            shown = await client.get(response.headers["location"])
            assert "requeued 7 dead letters" in text(shown.text)
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        stats = await admin.stats()
        assert (stats.dead, stats.ready) == (0, 7)


async def test_groups_are_paused_resumed_and_released(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    handlers = {"import": aiogroupq.Handler(fail, on_dead="halt")}
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        dead = await producer.enqueue("import", 0, group="t1", max_attempts=1)
        behind = await producer.enqueue("import", 1, group="t1")
    await drain(redis_client, queue=QUEUE, handlers=handlers)
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with (
            browser(url) as client,
            aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        ):
            await login(client)
            page = await client.get(f"/q/{QUEUE}/group", params={"name": "t1"})
            assert "halted" in text(page.text)
            assert dead in page.text
            assert "Release group" in page.text

            await act(client, f"/q/{QUEUE}/group/pause", name="t1")
            assert (await admin.group_settings("t1")).paused
            await act(client, f"/q/{QUEUE}/group/resume", name="t1")
            assert not (await admin.group_settings("t1")).paused

            released = await act(client, f"/q/{QUEUE}/group/release", name="t1")
            assert (await admin.group_info("t1")).state == aiogroupq.GroupState.READY
            again = await act(client, f"/q/{QUEUE}/group/release", name="t1")
            shown = await client.get(again.headers["location"])
            assert "is not halted" in text(shown.text)
            assert released.status_code == 303
            bad = await act(client, f"/q/{QUEUE}/group/pause", name="")
            shown = await client.get(bad.headers["location"])
            assert "invalid group" in text(shown.text)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        assert await producer.status(dead) == "dead"
        assert await producer.status(behind) == "queued"


async def test_a_task_is_cancelled_from_its_page(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("work", 0, delay=3600)
        with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
            async with browser(url) as client:
                await login(client)
                page = await client.get(f"/q/{QUEUE}/task", params={"id": task_id})
                assert "Cancel task" in page.text
                await act(client, f"/q/{QUEUE}/task/cancel", id=task_id)
                assert await producer.status(task_id) == "cancelled"
                again = await act(client, f"/q/{QUEUE}/task/cancel", id=task_id)
                shown = await client.get(again.headers["location"])
                assert "had already ended" in text(shown.text)


async def test_unreachable_redis_gives_a_503_page() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(f"redis://127.0.0.1:{port}/0", queues=[QUEUE])
    with serving(app) as url:
        async with browser(url) as client:
            response = await client.get(f"/q/{QUEUE}")
    assert response.status_code == 503
    assert "Redis is unreachable" in text(response.text)


# -- configuration and the command -------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queues": []}, "at least one queue"),
        ({"queues": "dash"}, "list of queue names"),
        ({"queues": ["bad name"]}, "queue name 'bad name'"),
        ({"queues": [QUEUE], "token": "short"}, "at least 16 characters, got 5"),
        ({"queues": [QUEUE], "token": TOKEN, "auth": lambda r: True}, "not both"),
        ({"queues": [QUEUE], "auth": "yes"}, "auth must be a callable"),
        ({"queues": [QUEUE], "read_only": "no"}, "read_only must be True or False"),
        ({"queues": [QUEUE], "show_payloads": 1}, "show_payloads must be True"),
        ({"queues": [QUEUE], "refresh": 0}, "refresh must be a number of seconds"),
        ({"queues": [QUEUE], "history": 1}, "history must be a number of seconds"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match=re.escape(message)):
        create_app("redis://127.0.0.1:1/0", **kwargs)


def test_a_bad_url_is_refused_at_once() -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match="Redis URL"):
        create_app("nonsense://", queues=[QUEUE])
    with pytest.raises(aiogroupq.ConfigurationError, match="decode_responses"):
        create_app(redis.asyncio.Redis(decode_responses=True), queues=[QUEUE])


def test_without_starlette_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.setitem(sys.modules, "starlette", None)
    monkeypatch.delitem(sys.modules, "aiogroupq.dashboard")
    with pytest.raises(aiogroupq.MissingExtraError) as caught:
        importlib.import_module("aiogroupq.dashboard")
    assert "pip install 'aiogroupq[dashboard]'" in str(caught.value)


async def test_the_command_without_the_extra_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None; "
        "from aiogroupq._cli.main import main; "
        "sys.exit(main(['dashboard', '--queue', 'q']))"
    )
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-c", code], check=False)
    assert done.returncode == 2
    assert "pip install 'aiogroupq[dashboard]'" in done.stderr.decode()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--queue is required"),
        (["--queue", "bad name"], {}, "queue name 'bad name'"),
        (["--queue", QUEUE, "--token-env", "NO_SUCH_VAR"], {}, "NO_SUCH_VAR"),
        (["--queue", QUEUE, "--token-env", "SHORT"], {"SHORT": "abc"}, "16 characters"),
    ],
)
async def test_the_command_refuses_a_bad_command_line(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-m", "aiogroupq", "dashboard", *argv],
            check=False,
            env={"PATH": "/usr/bin:/bin", **env},
        )
    assert done.returncode == 2
    assert message in done.stderr.decode()


async def test_the_command_serves_the_dashboard(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("work", 1)
    env = {"PATH": "/usr/bin:/bin", "DASH_TOKEN": TOKEN}
    argv = ["--redis-url", redis_url, "--queue", QUEUE, "--queue", "other"]
    async with command(*argv, "--token-env", "DASH_TOKEN", env=env) as client:
        response = await client.get("/")
        assert (response.status_code, response.headers["location"]) == (
            303,
            "/login?next=%2F",
        )
        await login(client)
        queue = await client.get("/q/dash")
        assert figures(queue.text)["ready"] == "1"
        assert 'href="/q/other"' in queue.text
        assert "Pause queue" in queue.text
    # Behind a proxy that serves it under /ops (and strips that prefix), its
    # links and cookies carry the prefix.
    async with command(*argv, "--root-path", "/ops", env=env) as client:
        queue = await client.get("/q/dash")
        assert 'href="/ops/q/other"' in queue.text
        assert "Path=/ops/" in queue.headers["set-cookie"]
        assert "Pause queue" not in queue.text  # no --token-env: read-only


@asynccontextmanager
async def command(*argv: str, env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """Run ``aiogroupq dashboard`` on a free port; yield a client of it once
    it answers; stop it with SIGTERM and check that it stops."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = (sys.executable, "-m", "aiogroupq", "dashboard", *argv, "--port", str(port))
    async with await anyio.open_process(argv, env=env) as process:
        try:
            async with browser(f"http://127.0.0.1:{port}") as client:
                with anyio.fail_after(60):
                    while True:
                        try:
                            await client.get("/static/dashboard.css")
                            break
                        except httpx.TransportError:
                            assert process.returncode is None, "it exited"
                            await anyio.sleep(0.1)
                yield client
        finally:
            process.terminate()
        # uvicorn stops cleanly, then raises the signal again for its caller.
        assert await process.wait() in (0, -signal.SIGTERM)


# -- the charts --------------------------------------------------------------------


def stats_at(now: float, **totals: int) -> aiogroupq.QueueStats:
    """A QueueStats read at *now* with these totals (the rest zero)."""
    zero: dict[str, Any] = dict.fromkeys(aiogroupq.QueueStats.__dataclass_fields__, 0)
    return aiogroupq.QueueStats(
        **{
            **zero,
            "queue": QUEUE,
            "exists": True,
            "paused": False,
            "consumers": (),
            "oldest_waiting": None,
            "next_due_in": None,
            "now": now,
            "totals": {
                "enqueued": 0,
                "succeeded": 0,
                "retried": 0,
                "dead": 0,
                **totals,
            },
        }
    )


def test_rates_are_the_totals_growth_between_samples() -> None:
    history = History(window=600, min_gap=1.0)
    history.add(stats_at(1000.0))
    history.add(stats_at(1000.4, succeeded=99))  # too soon after the first
    history.add(stats_at(1002.0, enqueued=20, succeeded=10, retried=1, dead=3))
    history.add(stats_at(1006.0, enqueued=20, succeeded=10, retried=1, dead=3))
    first, second = history.intervals()
    assert (first.start, first.end) == (1000.0, 1002.0)
    assert (first.enqueued, first.succeeded, first.failed) == (10.0, 5.0, 2.0)
    assert first.failure_rate == pytest.approx(4 / 14)
    assert (second.succeeded, second.failed, second.failure_rate) == (0, 0, None)
    # Over the last 4 s: nothing; over all of it: 10 succeeded in 6 s.
    assert history.rates(4.0) == {
        "enqueued": 0,
        "succeeded": 0,
        "retried": 0,
        "dead": 0,
    }
    rates = history.rates(60.0)
    assert rates is not None
    assert rates["succeeded"] == pytest.approx(10 / 6)


def test_history_forgets_old_samples_and_restarts_after_a_reset() -> None:
    history = History(window=60, min_gap=1.0)
    for second in range(0, 100, 10):
        history.add(stats_at(float(second), succeeded=second))
    assert len(history) == 7  # 40..100 s: within the last 60 s
    assert history.rates(5.0) is not None
    # Totals only grow: lower ones mean the queue's keys were deleted.
    history.add(stats_at(100.0, succeeded=3))
    assert len(history) == 1
    assert history.intervals() == []
    assert history.rates(60.0) is None


def test_the_chart_draws_each_series_and_breaks_at_gaps() -> None:
    history = History(window=600, min_gap=1.0)
    # Ten seconds of samples, a gap of three minutes, then two more samples.
    for second, done in ((0, 0), (2, 8), (4, 16), (6, 20), (186, 20), (188, 30)):
        history.add(stats_at(1000.0 + second, succeeded=done, enqueued=done))
    svg = str(throughput_chart(history.intervals(), 1188.0, 600.0))
    assert svg.startswith('<svg class="chart"')
    assert svg.endswith("</svg>")
    lines = re.findall(r'<polyline class="line (s-\w+)" points="([^"]+)"', svg)
    succeeded = [points for kind, points in lines if kind == "s-succeeded"]
    # Before the gap: one line of three points; the gap's average and the
    # interval after it are drawn apart (a dot each), not joined across it.
    assert [len(points.split()) for points in succeeded] == [3]
    assert svg.count('<circle class="s-succeeded"') == 2
    # The y axis tops at 5/s (the peak: 5/s), and 4/s sits 4/5 of the way up.
    assert ">5/s</text>" in svg
    ys = [float(point.split(",")[1]) for point in succeeded[0].split()]
    plot_top, plot_bottom = 8.0, 150.0 - 18.0
    assert ys[0] == pytest.approx(plot_bottom - 0.8 * (plot_bottom - plot_top), abs=0.1)
    assert "collecting samples" in str(throughput_chart([], 1000.0, 600.0))


def test_the_failure_chart_is_in_percent() -> None:
    history = History(window=600, min_gap=1.0)
    history.add(stats_at(0.0))
    history.add(stats_at(10.0, succeeded=3, dead=1))
    svg = str(failure_chart(history.intervals(), 10.0, 600.0))
    # 1 of 4 ended attempts failed: 25 %, a round figure, so the axis tops
    # there and the lone interval is a dot at the top of the plot.
    assert ">25%</text>" in svg
    assert '<circle class="s-failed" cx="631.1" cy="8.0" r="2"/>' in svg


@pytest.mark.parametrize(
    ("peak", "top"),
    [(0.0, 1.0), (0.3, 1.0), (1.5, 2.0), (2.2, 2.5), (7.0, 10.0), (12.0, 20.0),
     (4800.0, 5000.0), (25.0, 25.0)],
)  # fmt: skip
def test_the_axis_tops_at_a_round_figure(peak: float, top: float) -> None:
    assert nice_max(peak) == top
