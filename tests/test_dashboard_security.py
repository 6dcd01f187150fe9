"""The dashboard's defences, against a real uvicorn server and the test
Redis: the ``Host`` allow-list (DNS rebinding) and the origins its forms may
come from, errors hidden with the payloads, a dead-letter page that does
not read the payloads it hides, logout that ends the session, and the
throttling of failed logins.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._cli.dashboard import allowed_hosts
from aiogroupq._dashboard import _throttle
from aiogroupq._dashboard._hosts import LOOPBACK, AllowedHosts
from aiogroupq._dashboard._throttle import LoginThrottle
from aiogroupq.dashboard import create_app
from aiogroupq.errors import ConfigurationError
from aiogroupq.testing import drain
from tests._web import serving
from tests.test_dashboard import TOKEN, act, browser, command, csrf, login, text

QUEUE = "dash"
SECRET = "sk_live_51HxSecretTokenValue"


def port_of(url: str) -> int:
    return httpx.URL(url).port or 80


# -- Host and Origin -----------------------------------------------------------


async def test_a_request_for_another_host_is_refused(redis_url: str) -> None:
    """A page of evil.example whose name was made to resolve to 127.0.0.1
    (DNS rebinding) reaches the server with Host: evil.example: refused,
    before any page, asset or login."""
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        port = port_of(url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for host in (
                "evil.example",
                f"evil.example:{port}",
                "127.0.0.1.evil.example",
            ):
                for path in ("/", f"/q/{QUEUE}/dead", "/static/dashboard.css"):
                    response = await client.get(path, headers={"host": host})
                    assert response.status_code == 400, (host, path)
                    assert response.headers["content-type"].startswith("text/plain")
                    assert "host" in response.text
                    assert "evil" not in response.text  # not echoed
            for host in (
                f"127.0.0.1:{port}",
                f"localhost:{port}",
                "[::1]",
                "localhost",
            ):
                response = await client.get("/", headers={"host": host})
                assert response.status_code == 200, host
    # A dashboard given its own names answers to them, and only to them.
    app = create_app(
        redis_url,
        queues=[QUEUE],
        allowed_hosts=["dash.example.com", "*.ops.example.com", "10.0.0.5:8443"],
    )
    with serving(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            verdicts = {
                host: (await client.get("/", headers={"host": host})).status_code
                for host in (
                    "dash.example.com",
                    "DASH.example.com:8000",
                    "a.ops.example.com",
                    "ops.example.com",
                    "10.0.0.5:8443",
                    "10.0.0.5",
                    f"127.0.0.1:{port_of(url)}",
                )
            }
    assert verdicts == {
        "dash.example.com": 200,
        "DASH.example.com:8000": 200,
        "a.ops.example.com": 200,
        "ops.example.com": 400,  # *.domain: the names under it
        "10.0.0.5:8443": 200,
        "10.0.0.5": 400,  # another port than the one named
        f"127.0.0.1:{port_of(url)}": 400,  # not among the names given
    }


async def test_a_form_must_come_from_an_allowed_origin(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        port = port_of(url)
        async with (
            browser(url) as client,
            aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        ):
            await login(client)
            path = f"/q/{QUEUE}/pause"
            refused = {
                # An allowed Host, the form from another site.
                "evil origin": {"origin": "http://evil.example"},
                "evil origin, same port": {"origin": f"http://evil.example:{port}"},
                # Another port of the loopback is another site (a dev server).
                "another port": {"origin": "http://localhost:3000"},
                "not http": {"origin": f"ftp://127.0.0.1:{port}"},
            }
            for name, headers in refused.items():
                response = await client.post(
                    path,
                    data={"csrf": client.cookies["aiogroupq_csrf"]},
                    headers=headers,
                )
                assert response.status_code == 403, name
                assert "not from this dashboard" in text(response.text), name
            # DNS rebinding: the page's Host and Origin agree, both evil.
            rebound = await client.post(
                path,
                data={"csrf": client.cookies["aiogroupq_csrf"]},
                headers={
                    "host": f"evil.example:{port}",
                    "origin": f"http://evil.example:{port}",
                },
            )
            assert rebound.status_code == 400
            assert not (await admin.settings()).paused
            # The loopback's other names, on the port it serves: allowed.
            for origin in (f"http://localhost:{port}", url):
                response = await client.post(
                    path,
                    data={"csrf": client.cookies["aiogroupq_csrf"]},
                    headers={"origin": origin},
                )
                assert response.status_code == 303, origin
            assert (await admin.settings()).paused


async def test_the_origin_is_checked_against_the_allowed_hosts_not_the_host(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Behind a TLS proxy that forwards to 127.0.0.1 with its own Host, the
    browser's origin is the public name: allowed when it is listed (with
    its port), whatever Host the request carries."""
    app = create_app(
        redis_url,
        queues=[QUEUE],
        token=TOKEN,
        allowed_hosts=["127.0.0.1", "dash.example.com:443"],
    )
    with serving(app) as url:
        async with (
            browser(url, origin="https://dash.example.com") as client,
            aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
        ):
            assert (await login(client)).status_code == 303
            response = await act(client, f"/q/{QUEUE}/pause")
            assert response.status_code == 303
            assert (await admin.settings()).paused
            for origin in ("https://dash.example.com:8443", "https://evil.example"):
                response = await client.post(
                    f"/q/{QUEUE}/resume",
                    data={"csrf": client.cookies["aiogroupq_csrf"]},
                    headers={"origin": origin},
                )
                assert response.status_code == 403, origin
            assert (await admin.settings()).paused


def test_allowed_hosts_are_parsed_and_matched() -> None:
    hosts = AllowedHosts(["Dash.Example.com", "*.example.org", "::1", "[fe80::1]:8000"])
    assert hosts.allows_host("dash.example.com:8000", "http")
    assert hosts.allows_host("dash.example.com.", "http")
    assert hosts.allows_host("a.b.example.org", "https")
    assert not hosts.allows_host("example.org", "https")
    assert not hosts.allows_host("dash.example.com.evil.example", "http")
    assert hosts.allows_host("[::1]:8000", "http")
    assert hosts.allows_host("[fe80::1]:8000", "http")
    assert not hosts.allows_host("[fe80::1]:8001", "http")
    for bad in ("", "a b", "dash.example.com:99999", "user@dash.example.com", "x/y"):
        assert not hosts.allows_host(bad, "http"), bad
    # Origins: an allowed name on the port the request was sent to.
    assert hosts.allows_origin("http://dash.example.com:8000", "dash.example.com:8000")
    assert hosts.allows_origin("https://dash.example.com", "dash.example.com")
    assert not hosts.allows_origin(
        "http://dash.example.com:3000", "dash.example.com:8000"
    )
    assert not hosts.allows_origin("null", "dash.example.com")
    assert hosts.allows_origin("http://[fe80::1]:8000", "10.0.0.1:1")
    # Any Host (the application checks it): the form comes from that host.
    anyhost = AllowedHosts(["*"])
    assert anyhost.allows_host("anything.example", "http")
    assert anyhost.allows_origin("https://anything.example", "anything.example")
    assert not anyhost.allows_origin("https://evil.example", "anything.example")
    assert not anyhost.allows_origin("http://anything.example:1", "anything.example")
    assert AllowedHosts(LOOPBACK).allows_host("127.0.0.1:8000", "http")
    for bad_list, message in (
        ([], "empty"),
        ("localhost", "a list"),
        (["dash.example.com/x"], "not a host name"),
        (["*.*.example.com"], "not a host name"),
        ([None], "a host name"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            AllowedHosts(bad_list)  # type: ignore[arg-type]


def test_the_command_allows_the_address_it_listens_on() -> None:
    assert allowed_hosts("127.0.0.1", []) == ["127.0.0.1", "localhost", "::1"]
    assert allowed_hosts("::1", ["dash.lan"]) == [
        "::1",
        "localhost",
        "127.0.0.1",
        "dash.lan",
    ]
    assert allowed_hosts("0.0.0.0", []) == list(LOOPBACK)
    assert allowed_hosts("10.0.0.5", ["dash.lan"]) == ["10.0.0.5", "dash.lan"]
    assert allowed_hosts("dash.lan", []) == ["dash.lan"]


async def test_the_command_takes_allowed_hosts(redis_url: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    argv = ["--redis-url", redis_url, "--queue", QUEUE, "--allowed-host", "dash.lan"]
    async with command(*argv, env=env) as client:
        assert (await client.get("/")).status_code == 200  # 127.0.0.1, bound
        named = await client.get("/", headers={"host": "dash.lan:8000"})
        assert named.status_code == 200
        assert (
            await client.get("/", headers={"host": "evil.example"})
        ).status_code == 400


# -- errors hidden with the payloads -------------------------------------------


async def test_errors_that_quote_a_payload_are_hidden_with_it(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async def leaky(payload: dict[str, str]) -> None:
        raise RuntimeError(f"the payment API refused key {payload['key']}")

    handlers: dict[str, Any] = {
        "pay": leaky,
        "halting": aiogroupq.Handler(leaky, on_dead="halt"),
    }
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        dead = await producer.enqueue("pay", {"key": SECRET}, max_attempts=1)
        halter = await producer.enqueue(
            "halting", {"key": SECRET}, group="g1", max_attempts=1
        )
        await producer.enqueue("halting", {"key": "next"}, group="g1")
        await drain(redis_client, queue=QUEUE, handlers=handlers)
        # A task that failed once and waits for its retry: its last error.
        retrying = await producer.enqueue("pay", {"key": SECRET}, max_attempts=3)
        consumer = aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers=handlers, retry_backoff=3600
        )
        async with consumer, aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
            with anyio.fail_after(30):
                while (await admin.task(retrying)).error is None:
                    await anyio.sleep(0.02)
    paths = [
        ("/q/dash/task", {"id": dead}),
        ("/q/dash/task", {"id": halter}),
        ("/q/dash/task", {"id": retrying}),
        ("/q/dash/dead", {}),
        ("/q/dash/dead", {"reason": SECRET[:12]}),
        ("/q/dash/group", {"name": "g1"}),
        ("/q/dash/groups", {"state": "halted"}),
        ("/q/dash", {}),
    ]

    async def leaks(**kwargs: Any) -> dict[str, int]:
        found = {}
        with serving(create_app(redis_url, queues=[QUEUE], **kwargs)) as url:
            async with browser(url) as client:
                for path, params in paths:
                    page = await client.get(path, params=params)
                    assert page.status_code == 200, (path, params)
                    found[f"{path} {params}"] = page.text.count(SECRET)
        return found

    hidden = await leaks()
    print("secret shown, payloads hidden:", sum(hidden.values()), hidden)  # noqa: T201
    assert sum(hidden.values()) == 0
    errors = await leaks(show_errors=True)
    print("secret shown, errors shown:", sum(errors.values()))  # noqa: T201
    assert all(
        errors[f"/q/dash/task {{'id': '{i}'}}"] for i in (dead, halter, retrying)
    )
    assert errors["/q/dash/group {'name': 'g1'}"] > 0
    assert errors["/q/dash/dead {}"] > 0
    # The reason filter, which would tell hidden reasons apart, is gone.
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        assert len(await admin.dead_letters()) == 2
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with browser(url) as client:
            page = await client.get("/q/dash/dead", params={"reason": "no such text"})
            assert 'name="reason"' not in page.text
            assert page.text.count('<tr data-task="') == 2
            task = text((await client.get("/q/dash/task", params={"id": dead})).text)
            assert "Hidden: error messages and tracebacks" in task
            group = text(
                (await client.get("/q/dash/group", params={"name": "g1"})).text
            )
            assert f"halted behind dead task {halter}; requeue or purge it" in group


# -- the dead-letter page reads no payload it hides -----------------------------


async def test_the_dead_letter_page_does_not_read_hidden_payloads(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    letters, size = 20, 256 * 1024
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(
            [
                aiogroupq.Task("big", os.urandom(size), max_attempts=1)
                for _ in range(letters)
            ]
        )

    async def fail(payload: bytes) -> None:
        raise RuntimeError("cannot import")

    await drain(redis_client, queue=QUEUE, handlers={"big": fail})

    async def sent() -> int:
        return int((await redis_client.info("stats"))["total_net_output_bytes"])

    read: dict[bool, int] = {}
    for shown in (False, True):
        app = create_app(redis_url, queues=[QUEUE], show_payloads=shown)
        with serving(app) as url:
            async with browser(url) as client:
                await client.get("/")  # the client connected, the scripts loaded
                before = await sent()
                page = await client.get(f"/q/{QUEUE}/dead")
                read[shown] = await sent() - before
        assert sorted(
            row.split('"')[0] for row in page.text.split('<tr data-task="')[1:]
        ) == sorted(ids)
        assert page.text.count("<td>big</td>") == letters  # the type, without "e"
    total = letters * size
    print(  # noqa: T201
        f"dead-letter page, {letters} letters of {size // 1024} KiB: "
        f"{read[False]:,} B read from Redis with payloads hidden, "
        f"{read[True]:,} B with payloads shown ({total:,} B of payloads)"
    )
    assert read[False] < total / 100
    # Shown, each letter's preview is read (a bounded prefix of its envelope),
    # never its whole payload: more than hidden, far less than the payloads.
    assert read[False] < read[True] < total / 10


async def test_dead_letters_without_payloads_keep_the_rest(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async def fail(payload: Any) -> None:
        raise RuntimeError("boom")

    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE, partitions=3) as producer,
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
    ):
        await producer.enqueue_many(
            [
                aiogroupq.Task("imp", {"n": i}, group=f"g{i % 4}", max_attempts=1)
                for i in range(9)
            ]
            + [aiogroupq.Task("solo", 1, max_attempts=1)]
        )
        await drain(redis_client, queue=QUEUE, handlers={"imp": fail, "solo": fail})
        full = await admin.dead_letters(limit=7)
        brief = await admin.dead_letters(limit=7, payloads=False)
        assert [
            (d.id, d.type, d.group, d.reason, d.attempts, d.dead_at) for d in brief
        ] == [(d.id, d.type, d.group, d.reason, d.attempts, d.dead_at) for d in full]
        assert {d.payload for d in brief} == {None}
        assert {d.traceback for d in brief} == {""}
        assert all("Traceback" in d.traceback for d in full)
        # A dead letter enqueued before tasks kept their type in "i": its
        # envelope is read for it.
        oldest = full[0]
        keys = [k async for k in redis_client.scan_iter(match=f"*:t:{oldest.id}")]
        assert len(keys) == 1
        await redis_client.hdel(keys[0], "i")
        (legacy,) = await admin.dead_letters(limit=1, payloads=False)
        assert (legacy.id, legacy.type, legacy.group) == (
            oldest.id,
            oldest.type,
            oldest.group,
        )
        with pytest.raises(ConfigurationError, match="payloads must be True or False"):
            await admin.dead_letters(payloads=1)  # type: ignore[arg-type]


# -- sessions and logins ---------------------------------------------------------


async def test_logout_ends_the_session_itself(redis_url: str) -> None:
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with browser(url) as client:
            await login(client)
            session = client.cookies["aiogroupq_session"]
            other_tab = await login(client)  # a second session stays live
            assert other_tab.status_code == 303
            second = client.cookies["aiogroupq_session"]
            client.cookies.set("aiogroupq_session", session)
            assert (await client.get("/")).status_code == 200
            assert (await act(client, "/logout")).status_code == 303
        # A copy of the cookie, kept or stolen, is refused after the logout.
        async with browser(url) as copy:
            copy.cookies.set("aiogroupq_session", session)
            response = await copy.get("/")
            print("the old cookie after logout:", response.status_code)  # noqa: T201
            assert response.status_code == 303
            assert response.headers["location"].startswith("/login")
            refused = await act(copy, f"/q/{QUEUE}/pause")
            assert refused.status_code == 403
            copy.cookies.set("aiogroupq_session", second)
            assert (await copy.get("/")).status_code == 200


async def test_failed_logins_are_throttled(redis_url: str) -> None:
    with serving(create_app(redis_url, queues=[QUEUE], token=TOKEN)) as url:
        async with browser(url) as client:
            page = await client.get("/login")
            form = {"csrf": csrf(page.text), "next": "/"}
            statuses = []
            started = time.monotonic()
            for i in range(30):
                response = await client.post(
                    "/login", data={**form, "token": f"guess-number-{i:04d}-xx"}
                )
                statuses.append(response.status_code)
            elapsed = time.monotonic() - started
            checked = statuses.count(401)
            print(  # noqa: T201
                f"30 wrong tokens in {elapsed:.2f} s: {checked} checked "
                f"({checked / elapsed:.1f} checked/s), {statuses.count(429)} "
                "refused unchecked (429)"
            )
            assert set(statuses) == {401, 429}
            # The free ones, then one each time a lockout (1 s, 2 s, 4 s...)
            # ran out while the guesses went on.
            free = _throttle.FREE_FAILURES
            assert statuses[:free] == [401] * free
            assert checked <= free + 1 + math.log2(elapsed + 1)
            assert "Too many failed sign-ins" in text(response.text)
            wait = int(response.headers["retry-after"])
            assert 1 <= wait <= 2 ** (checked - free - 1)
            # The right token during the lockout is not even compared...
            locked = await client.post("/login", data={**form, "token": TOKEN})
            assert locked.status_code == 429
            # ...and works once the lockout is over.
            await anyio.sleep(wait)
            signed_in = await client.post("/login", data={**form, "token": TOKEN})
            assert signed_in.status_code == 303
            assert (await client.get("/")).status_code == 200


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lockouts_grow_per_address_and_all_addresses_share_a_budget() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(_throttle.FREE_FAILURES):
        assert throttle.retry_after("a") == 0
        throttle.failed("a")
    assert throttle.retry_after("a") == 0
    lockouts = []
    for _ in range(4):
        throttle.failed("a")
        lockouts.append(throttle.retry_after("a"))
        clock.now += lockouts[-1]
    assert lockouts == [1, 2, 4, 8]
    assert throttle.retry_after("b") == 0  # another address: its own count
    throttle.succeeded("a")
    assert throttle.retry_after("a") == 0
    for _ in range(50):
        throttle.failed("a")
    clock.now += _throttle.FORGET_AFTER + 1  # forgotten (the lockout too)
    assert throttle.retry_after("a") == 0
    # Many addresses, a few failures each: the shared budget runs out.
    fresh = LoginThrottle(clock)
    for i in range(_throttle.GLOBAL_BURST):
        assert fresh.retry_after(f"10.0.0.{i}") == 0
        fresh.failed(f"10.0.0.{i}")
    assert fresh.retry_after("10.9.9.9") == 1
    clock.now += _throttle.GLOBAL_EVERY
    assert fresh.retry_after("10.9.9.9") == 0
    # The longest lockout is bounded.
    for _ in range(40):
        fresh.failed("z")
    assert fresh.retry_after("z") <= _throttle.MAX_LOCKOUT


def test_a_guesser_that_never_stops_stays_locked_out_for_the_longest_lockout() -> None:
    # Days of steady guessing: thousands of lockouts in a row; the doubling
    # must stop at the bound instead of overflowing a float.
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(_throttle.FREE_FAILURES + 2_000):
        throttle.failed("a")
        clock.now += throttle.retry_after("a")
    throttle.failed("a")
    assert throttle.retry_after("a") == _throttle.MAX_LOCKOUT
