"""The operator commands of the ``aiogroupq`` command line: see what a queue
is doing (stats, groups, group, task, consumers, dead list/show) and act on
it (dead requeue/purge, release, pause, resume, cancel, repartition).

Every read command prints a table or a page for people, or JSON with
``--json``; ``stats --watch`` refreshes. Exit status: 0 done; 1 nothing to
act on or not found (a queue that does not exist, a group with no tasks and
no settings, an unknown or ended task, a group that is not halted or not
paused, an id that is not a dead letter, a consumer to release that may be alive); 2 a bad command line, an
unreachable Redis, or any other error of aiogroupq's (a permission Redis
refused, a damaged key), in one line.

An action never creates what it acts on: a name with a typo must not leave
settings behind for a queue or group that will never come. Only ``pause
--create`` writes the pause of a queue or group that has no tasks and no
settings yet. The checks read before they write, so they guard against
typos, not against a queue created in between.

Their arguments are added to the parser by ``_cli/ops_args.py``.
"""

from __future__ import annotations

__all__ = ("COMMANDS", "run")

import argparse
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio

from .._inspect import render as _render, views as _views
from .._limits import DEFAULT_RETENTION
from .._store import layout as _layout, scripts as _scripts
from .._store.connection import Client, open_client
from .._store.failures import unavailable_as_error
from .._store.fanout import by_partition, requeue_dead
from .._store.keys import QueueKeys
from .._store.partition import Partitions
from .._store.replies import CancelCode
from .._store.settings import GroupSettings
from ..admin import MAX_PAGE, Admin
from ..errors import AiogroupqError, ConsumerRunningError, TaskNotFoundError
from ..producer import Producer
from .near import did_you_mean
from .ops_args import QUEUE_ENV
from .permissions import explain, is_refusal
from .stdout import complain, say

COMMANDS: Final = frozenset(
    {
        "stats", "groups", "group", "task", "dead", "release", "pause", "resume",
        "cancel", "consumers", "repartition",
    }
)  # fmt: skip


class _Failed(Exception):
    """A command that ran but found nothing to act on: exit status 1."""


class _Missing(_Failed):
    """The queue does not exist: :func:`_run` adds "did you mean" (it holds
    the client the search needs)."""


class _Usage(Exception):
    """A bad argument found while running: exit status 2."""


def run(args: argparse.Namespace) -> int:
    """Run one operator command; return the exit status.

    :raises StdoutClosed: if the reader of the output went away
    """
    name = args.command + (f" {args.action}" if args.command == "dead" else "")
    try:
        if not args.queue:
            raise _Usage(f"--queue is required (or set ${QUEUE_ENV})")
        _check_ids(args)
        return anyio.run(_run, args)
    except _Failed as exc:
        complain(f"aiogroupq {name}: {exc}")
        return 1
    except (_Usage, AiogroupqError) as exc:
        complain(f"aiogroupq {name}: error: {exc}")
        return 2
    except KeyboardInterrupt:  # stops --watch
        return 0


def _check_ids(args: argparse.Namespace) -> None:
    """Refuse an empty task id before connecting (``task ''`` from an unset
    shell variable)."""
    ids = [*getattr(args, "ids", ()), getattr(args, "task_id", None)]
    if any(i == "" for i in ids):
        raise _Usage("a task id is empty (an unset shell variable?)")


@asynccontextmanager
async def _open(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[Client, Admin, Producer]]:
    async with (
        open_client(args.redis_url, retry=True) as client,
        Admin(client, queue=args.queue) as admin,
        # It enqueues nothing: an operator looking into a server that may
        # evict keys must not be refused (or warned on every command).
        Producer(client, queue=args.queue, allow_eviction=True) as producer,
    ):
        yield client, admin, producer


@unavailable_as_error
async def _run(args: argparse.Namespace) -> int:
    QueueKeys(args.queue)  # a bad name is refused before connecting
    async with _open(args) as (client, admin, producer):
        handler = _HANDLERS[args.command]
        try:
            await handler(args, client, admin, producer)
        except _Missing as exc:
            hint = await did_you_mean(client, args.queue)
            raise _Failed(f"{exc}{hint}") from None
        except Exception as exc:
            if not is_refusal(exc):
                raise
            # A script's refusal may not name the command: find out which.
            explained = await explain(client, args.queue, exc)
            if explained is exc:
                raise
            raise explained from None
    return 0


async def _require_queue(
    admin: Admin, args: argparse.Namespace, hint: str = ""
) -> None:
    """Say so when an empty answer comes from a queue that does not exist,
    and act on no such queue."""
    if not (await admin.stats()).exists:
        raise _missing(args, hint)


def _missing(args: argparse.Namespace, hint: str = "") -> _Missing:
    return _Missing(
        f"queue {args.queue!r} does not exist on this server: nothing was "
        "ever enqueued to it, configured or consumed (check --queue and "
        f"--redis-url){hint}"
    )


async def _group_exists(admin: Admin, info: _views.GroupInfo) -> bool:
    """Whether the group has live tasks, is halted or paused, or has settings
    of its own: what a group with a typo in its name has none of."""
    if (
        info.state == _views.GroupState.DAMAGED
        or info.holders
        or info.running
        or info.backlog
        or info.delayed
        or info.halted_by is not None
        or info.paused
    ):
        return True
    return await admin.group_settings(info.group) != GroupSettings()


def _no_group(args: argparse.Namespace, hint: str = "") -> _Failed:
    return _Failed(
        f"group {args.name!r} has no live tasks and no settings in queue "
        f"{args.queue!r}: check the name (a group whose tasks all ended looks "
        f"the same){hint}"
    )


# -- reading -------------------------------------------------------------------


async def _stats(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    shown = 0
    previous: _views.QueueStats | None = None
    while True:
        stats = await admin.stats()
        if args.json:
            say(_render.to_json(stats, pretty=not args.watch), flush=True)
        if not stats.exists:
            raise _missing(args)
        if not args.json:
            rates = None
            if previous is not None and stats.now > previous.now:
                elapsed = stats.now - previous.now
                rates = {
                    k: (n - previous.totals.get(k, 0)) / elapsed
                    for k, n in stats.totals.items()
                }
            if args.watch and sys.stdout.isatty():
                say("\x1b[H\x1b[2J", end="", raw=True)  # clear the terminal
            elif shown:
                say()
            say(_render.render_stats(stats, rates), flush=True)
        shown += 1
        previous = stats
        if not args.watch or (args.count is not None and shown >= args.count):
            return
        await anyio.sleep(args.interval)


async def _groups(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    if args.limit > MAX_PAGE:
        raise _Usage(f"--limit must be at most {MAX_PAGE}, got {args.limit}")
    if args.cursor < 0:
        raise _Usage(f"--cursor must be >= 0, got {args.cursor}")
    page = await admin.groups(sort=args.sort, limit=args.limit, cursor=args.cursor)
    if not page.groups and args.cursor == 0:
        await _require_queue(admin, args)
    if args.json:
        say(_render.to_json(page))
        return
    if not page.groups:
        say(
            f"no {args.sort} groups"
            if args.sort in ("halted", "paused")
            else "no group has a line"
        )
    else:
        say(_render.table(_render.GROUP_HEADERS, map(_render.group_row, page.groups)))
    if page.next_cursor is not None:
        say(f"next page: --cursor {page.next_cursor}")


async def _group(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    info = await admin.group_info(args.name)
    if not await _group_exists(admin, info):
        await _require_queue(admin, args)
        if args.json:  # the view still, as ``stats --json`` prints one
            say(_render.to_json(info))
        raise _no_group(args)
    say(_render.to_json(info) if args.json else _render.render_group(info))


async def _task(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    details = await _task_details(args, admin)
    # A waiting task's start estimate, where the queue's start counter is
    # on (the page only reads: Admin.estimate() switches it on).
    estimate = await _render.estimate_of(admin._explain_estimate, details)
    if args.json:
        say(_render.task_json(details, estimate))
    else:
        say(_render.render_task(details, estimate))


async def _task_details(args: argparse.Namespace, admin: Admin) -> _views.TaskDetails:
    try:
        return await admin.task(args.task_id)
    except TaskNotFoundError:
        raise await _no_task(args, admin) from None


async def _no_task(args: argparse.Namespace, admin: Admin) -> _Failed:
    await _require_queue(admin, args)
    return _Failed(f"no task {args.task_id!r} in queue {args.queue!r} (or it expired)")


async def _consumers(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    found = await admin.consumers()
    if not found:
        await _require_queue(admin, args)
    if args.json:
        say(_render.to_json(found))
    elif not found:
        say("no consumer is registered")
    else:
        now = (await admin.stats()).now
        say(_render.table(_render.CONSUMER_HEADERS, _render.consumer_rows(now, found)))


# -- dead letters ----------------------------------------------------------------


async def _dead(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    if args.action == "list":
        # The table shows no payload: a letter of megabytes costs a few
        # hundred bytes read instead (--json prints them whole).
        letters = await admin.dead_letters(limit=args.limit, payloads=args.json)
        if not letters:
            await _require_queue(admin, args)
        if args.json:
            say(_render.to_json(letters))
            return
        stats = await admin.stats()
        if not letters:
            say("no dead letters")
            return
        say(_render.table(_render.DEAD_HEADERS, _render.dead_rows(stats.now, letters)))
        if stats.dead > len(letters):
            say(f"({_render.count(stats.dead - len(letters))} more: --limit)")
    elif args.action == "show":
        details = await _task_details(args, admin)
        if details.state != "dead":
            raise _Failed(f"task {args.task_id!r} is not dead: it is {details.state}")
        say(_render.to_json(details) if args.json else _render.render_task(details))
    else:
        await _act_on_dead(args, client, admin)


async def _act_on_dead(args: argparse.Namespace, client: Client, admin: Admin) -> None:
    op = args.action
    if getattr(args, "group", None) is not None:
        if args.ids or args.all:
            raise _Usage("give task ids, --all or --group (one of them) to purge")
        await _require_queue(admin, args)
        if not args.yes:
            raise _Failed(
                f"this deletes every dead letter of group {args.group!r}: add "
                "--yes to do it"
            )
        done = await admin.purge_group(args.group)
        if not done:
            raise _Failed(
                f"group {args.group!r} has no dead letters in queue {args.queue!r}"
            )
        say(f"purged {_render.count(done)} dead letters of group {args.group!r}")
        return
    if bool(args.ids) == args.all:
        raise _Usage(f"give task ids or --all (not both) to {op}")
    parts = Partitions(args.queue)
    await _layout.refresh(client, parts)

    async def act(keys: QueueKeys, ids: list[str]) -> int:
        if op == "requeue":
            return await requeue_dead(client, parts, ids)
        return await _scripts.dead_action(client, keys, op, ids)

    done = 0
    if args.ids:
        await _require_queue(admin, args)
        ids = list(dict.fromkeys(args.ids))  # each once
        dead, not_dead = await _sorted_out(client, parts, ids)
        # Progress over the dead letters only: "requeued: 1/1" for an id
        # that was none would read as success.
        progress = _render.Progress(f"{op}d", len(dead))
        for start in range(0, len(dead), _scripts.DEAD_BATCH):
            chunk = dead[start : start + _scripts.DEAD_BATCH]
            for keys, mine in by_partition(parts, chunk).items():
                done += await act(keys, mine)
            progress.update(done, final=start + len(chunk) == len(dead))
        say(f"{op}d {_render.count(done)} of {_tasks(len(ids))}")
        if not_dead:
            states = await _states(admin, not_dead)
            raise _Failed(f"not a dead letter: {states}")
        if done < len(dead):
            full = (
                await _full_groups(client, parts, admin, dead)
                if op == "requeue"
                else []
            )
            raise _Failed(
                f"left alone: {_tasks(len(dead) - done)} no longer dead (requeued "
                "or purged meanwhile), damaged (aiogroupq check)"
                + (
                    f", or of a group at its max_size ({', '.join(map(repr, full))}: "
                    "requeue once it has room, or raise its max_size)"
                    if full
                    else ""
                )
            )
        return
    stats = await admin.stats()
    if not stats.exists:
        raise _missing(args)
    # Only what is dead now: a task dead-lettered meanwhile is not chased.
    until_ms = round(stats.now * 1000)
    progress = _render.Progress(f"{op}d", stats.dead)
    looked = 0
    for keys in parts.all():
        skipped = 0
        while ids := await _dead_before(client, keys, until_ms, skipped):
            acted = await act(keys, ids)
            done += acted
            looked += len(ids)
            # Left alone (damaged keys, or a group that moved away): still in
            # the index, so page past them.
            skipped += len(ids) - acted if op == "requeue" else 0
            progress.update(looked)
    progress.update(looked, final=True)
    say(f"{op}d {_render.count(done)} dead letters")


async def _sorted_out(
    client: Client, parts: Partitions, ids: Sequence[str]
) -> tuple[list[str], list[str]]:
    """*ids* split into dead letters and the others, each in the given order."""
    dead_ones: set[str] = set()
    for start in range(0, len(ids), _scripts.DEAD_BATCH):
        chunk = ids[start : start + _scripts.DEAD_BATCH]
        for keys, mine in by_partition(parts, chunk).items():
            # ZSCORE, not ZMSCORE: a worker's rule grants it (operations.md)
            async with client.pipeline(transaction=False) as pipe:
                for task_id in mine:
                    pipe.zscore(keys.dead, task_id)
                scores: list[Any] = await pipe.execute()
            dead_ones.update(
                i for i, s in zip(mine, scores, strict=True) if s is not None
            )
    dead = [i for i in ids if i in dead_ones]
    return dead, [i for i in ids if i not in dead_ones]


#: ids named one by one in a message; more are counted
_SHOWN_IDS: Final = 10


async def _full_groups(
    client: Client, parts: Partitions, admin: Admin, ids: Sequence[str]
) -> list[str]:
    """The groups at their max_size among those of *ids* still dead (a
    requeue leaves them so: a requeue adds a live task as an enqueue does)."""
    still, _ = await _sorted_out(client, parts, ids)
    full: list[str] = []
    for task_id in still[:_SHOWN_IDS]:
        group = (await admin.task(task_id)).group
        if (
            group is not None
            and group not in full
            and (await admin.group_info(group)).full
        ):
            full.append(group)
    return full


async def _states(admin: Admin, ids: Sequence[str]) -> str:
    """``'a' (queued), 'b' (no such task) and 3 more``."""
    shown = []
    for task_id in ids[:_SHOWN_IDS]:
        try:
            state = str((await admin.task(task_id)).state)
        except TaskNotFoundError:
            state = "no such task"
        shown.append(f"{task_id!r} ({state})")
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    return ", ".join(shown) + more


def _tasks(n: int) -> str:
    return f"{_render.count(n)} task{'' if n == 1 else 's'}"


async def _dead_before(
    client: Client, keys: QueueKeys, until_ms: int, offset: int
) -> list[str]:
    """Dead task ids of the index, oldest first, up to *until_ms*."""
    batch: list[Any] = await client.zrangebyscore(
        keys.dead, "-inf", until_ms, start=offset, num=_scripts.DEAD_BATCH
    )
    return [bytes(i).decode(errors="surrogateescape") for i in batch]


# -- acting ----------------------------------------------------------------------


async def _release(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    if (args.name is None) == (args.consumer is None):
        raise _Usage("give a halted GROUP or --consumer NAME (not both)")
    await _require_queue(admin, args)
    if args.consumer is not None:
        await _release_consumer(args, admin)
        return
    if not await admin.release_group(args.name):
        if not await _group_exists(admin, await admin.group_info(args.name)):
            raise _no_group(args)
        raise _Failed(f"group {args.name!r} is not halted")
    say(f"released group {args.name!r}: it goes on with its next task")


async def _release_consumer(args: argparse.Namespace, admin: Admin) -> None:
    """Hand a dead consumer's tasks back; exit 1 while it may be alive, or
    for a name that is not registered and holds nothing."""
    name = args.consumer
    try:
        done = await admin.release_consumer(name)
    except ConsumerRunningError as exc:
        raise _Failed(str(exc)) from None
    if done:
        say(
            f"handed back {_tasks(done)} of consumer {name!r}, each to the front "
            "of its group"
        )
        return
    known = {c.name: c for c in await admin.consumers()}
    if name not in known:
        raise _Failed(
            f"no consumer named {name!r} is registered in queue {args.queue!r}, "
            "and it holds no task (aiogroupq consumers lists the names)"
        )
    raise _Failed(
        f"consumer {name!r} is {known[name].status} and holds no task: nothing "
        "to hand back"
    )


#: what ``pause`` without ``--create`` adds to "does not exist"
_CREATE: Final = "; to pause it before its first task, add --create"


async def _pause(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    if args.name is None:
        stats = await admin.stats()
        if not stats.exists and not args.create:
            raise _missing(args, _CREATE)
        if stats.paused:
            raise _Failed(f"queue {args.queue!r} is already paused")
        await admin.pause()
        say(f"paused queue {args.queue!r}")
        return
    settings = await admin.group_settings(args.name)
    if not settings.paused and not args.create:
        await _require_queue(admin, args, _CREATE)
        if not await _group_exists(admin, await admin.group_info(args.name)):
            raise _no_group(args, _CREATE)
    if settings.paused:
        raise _Failed(f"group {args.name!r} is already paused")
    await admin.pause_group(args.name)
    say(f"paused group {args.name!r}")


async def _resume(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    stats = await admin.stats()
    if not stats.exists:
        raise _missing(args)
    if args.name is None:
        if not stats.paused:
            paused = stats.groups_paused
            raise _Failed(
                f"queue {args.queue!r} is not paused"
                + (
                    f" ({_groups_text(paused)} paused: aiogroupq groups --sort paused)"
                    if paused
                    else ""
                )
            )
        await admin.resume()
        say(f"resumed queue {args.queue!r}")
        return
    if not (await admin.group_settings(args.name)).paused:
        if not await _group_exists(admin, await admin.group_info(args.name)):
            raise _no_group(args)
        raise _Failed(
            f"group {args.name!r} is not paused"
            + (" (the whole queue is: aiogroupq resume)" if stats.paused else "")
        )
    await admin.resume_group(args.name)
    say(f"resumed group {args.name!r}")


def _groups_text(n: int) -> str:
    return "1 group is" if n == 1 else f"{_render.count(n)} groups are"


async def _cancel(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    if (args.task_id is None) == (args.group is None):
        raise _Usage("give a task id or --group GROUP (not both)")
    if args.running and args.group is None:
        raise _Usage("--running goes with --group")
    if args.group is not None:
        await _cancel_group(args, admin)
        return
    code = await _scripts.cancel(
        client,
        Partitions(args.queue).of_id(args.task_id),
        args.task_id,
        retention_ms=round(DEFAULT_RETENTION * 1000),
    )
    if code is CancelCode.NOT_FOUND:
        raise await _no_task(args, admin)
    if code is CancelCode.FINISHED:
        state = await producer.status(args.task_id)
        raise _Failed(f"task {args.task_id!r} had already ended ({state})")
    if code is CancelCode.REQUESTED:
        say(
            f"task {args.task_id!r} is running: its consumer cancels it at its "
            "next heartbeat"
        )
    else:
        say(f"cancelled task {args.task_id!r}")


async def _cancel_group(args: argparse.Namespace, admin: Admin) -> None:
    await _require_queue(admin, args)
    if args.yes:
        done = await admin.cancel_group(args.group, running=args.running)
    else:
        info = await admin.group_info(args.group)
        waiting = info.backlog + info.delayed
        waiting += sum(1 for h in info.holders if h.slot not in ("running", "line"))
        running = info.running if args.running else 0
        if waiting or running:
            raise _Failed(
                f"this cancels every queued and delayed task of group "
                f"{args.group!r} ({_tasks(waiting)} now"
                + (f", and {running} running" if running else "")
                + "): add --yes to do it"
            )
        done = 0
    if not done:
        if not await _group_exists(admin, await admin.group_info(args.group)):
            raise _no_group(argparse.Namespace(name=args.group, queue=args.queue))
        raise _Failed(
            f"group {args.group!r} has no queued or delayed task"
            + (" and none running" if args.running else "")
            + ": nothing to cancel"
        )
    if args.running:
        say(
            f"cancelled {_tasks(done)} of group {args.group!r} (a running one "
            "is cancelled by its consumer at its next heartbeat)"
        )
    else:
        say(f"cancelled {_tasks(done)} of group {args.group!r}")


async def _repartition(
    args: argparse.Namespace, client: Client, admin: Admin, producer: Producer
) -> None:
    if (args.to is None) != bool(args.finish):
        raise _Usage("give either --to K (start, then finish) or --finish")
    await _require_queue(admin, args)
    if args.to is not None:
        await admin.start_repartition(args.to)
        say(f"queue {args.queue!r}: moving to {args.to} partitions")
    deadline = anyio.current_time() + (args.wait or 0.0)
    while reasons := await admin.finish_repartition():
        if anyio.current_time() >= deadline:
            for reason in reasons:
                say(f"  waiting: {reason}")
            raise _Failed(
                "the move is under way; run 'aiogroupq repartition --finish' "
                "again (or with --wait SECONDS) once these are done"
            )
        await anyio.sleep(0.5)
    parts, _ = await admin.partitions()
    say(f"queue {args.queue!r}: {parts} partitions, the move is finished")


_HANDLERS: Final = {
    "stats": _stats,
    "groups": _groups,
    "group": _group,
    "task": _task,
    "consumers": _consumers,
    "dead": _dead,
    "release": _release,
    "pause": _pause,
    "resume": _resume,
    "cancel": _cancel,
    "repartition": _repartition,
}
