"""Operating a queue: group and queue settings, pause and resume, dead
letters (list, requeue, purge, release a halted group), and what the queue
is doing (counts, groups, tasks, consumers)."""

from __future__ import annotations

__all__ = (
    "Admin",
    "ConsumerInfo",
    "GroupInfo",
    "GroupPage",
    "GroupSettings",
    "QueueSettings",
    "QueueStats",
    "Rate",
    "TaskDetails",
)

import functools
from collections.abc import AsyncGenerator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Final,
    Literal,
    ParamSpec,
    Self,
    TypeVar,
)

import anyio
from redis.exceptions import ResponseError

from ._inspect import (
    aggregate as _aggregate,
    consumers as _consumers,
    estimate as _estimate,
    preview as _preview,
    reads as _reads,
)
from ._inspect.refusals import view_refusal
from ._inspect.views import (
    ConsumerInfo,
    GroupInfo,
    GroupPage,
    GroupSort,
    QueueStats,
    TaskDetails,
)
from ._limits import DEFAULT_RETENTION, START_WINDOW
from ._store import (
    group_ops as _group_ops,
    repartition as _repartition,
    scripts as _scripts,
    settings as _settings,
    validate as _validate,
)
from ._store.codec import dead_letter
from ._store.connection import RedisLike, open_client
from ._store.failures import unavailable_as_error
from ._store.fanout import (
    by_partition,
    dead_letter_rows,
    each_partition,
    requeue_dead,
)
from ._store.handle import QueueHandle
from ._store.layout import UNREADABLE, refresh
from ._store.queries import dead_ids
from ._store.server_checks import check_server
from ._store.settings import Fairness, GroupSettings, Ordering, QueueSettings, Rate
from ._store.wrongtype import corrupt_key, is_wrong_type
from .errors import ConfigurationError, InvalidGroupError, TaskNotFoundError

if TYPE_CHECKING:
    from ._inspect.estimate import StartEstimate
    from ._store.keys import QueueKeys
    from ._store.partition import Partitions
    from .task import DeadLetter

#: groups refilled per script call after the queue's defaults change
_REFILL_BATCH: Final = 500
#: most groups one :meth:`Admin.groups` page holds
MAX_PAGE: Final = 100
_SORTS: Final = ("busiest", "oldest", "halted", "paused")

P = ParamSpec("P")
T = TypeVar("T")


def _refusals_named(
    view: Callable[Concatenate[Admin, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Admin, P], Coroutine[Any, Any, T]]:
    """A view whose script Redis refused a command raises
    :class:`~aiogroupq.PermissionDeniedError` naming the commands to grant:
    Redis 7.0 answers a refusal inside a script with a plain ``ERR`` whose
    wording varies, so the commands are tried out instead
    (``_inspect/refusals.py``)."""

    @functools.wraps(view)
    async def wrapper(self: Admin, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await view(self, *args, **kwargs)
        except Exception as exc:
            named = await view_refusal(self._open_client(), self._keys, exc)
            if named is None:
                raise
            raise named from exc

    return wrapper


class Admin(QueueHandle, anyio.AsyncContextManagerMixin):
    """Settings, pause and resume of one queue and its groups, its dead
    letters, and views of what it is doing; use it as
    ``async with Admin(...) as admin``.

    Settings live in Redis, so every producer and consumer of the queue
    follows them at once. Dead letters are listed (:meth:`dead_letters`),
    run again (:meth:`requeue_dead`) or deleted (:meth:`purge_dead`), and a
    group halted behind one goes on with :meth:`release_group`. The views (:meth:`stats`, :meth:`group_info`,
    :meth:`groups`, :meth:`task`, :meth:`position`, :meth:`consumers`) are
    each one read-only script per partition (after one read of the
    partition layout) over counters and indexes, never a scan of the queue.

    :param redis: a ``redis://`` URL, or a ``redis.asyncio.Redis`` client to
        borrow (never closed by us; must have ``decode_responses=False``)
    :param queue: the queue name
    :param partitions: as for :class:`Producer` (None: what the queue stores).
        A partitioned queue's settings go to every partition, a group's to
        its own, and the views sum up or merge the partitions'
    :raises ConfigurationError: if an argument is unusable
    """

    def __init__(
        self, redis: RedisLike, *, queue: str, partitions: int | None = None
    ) -> None:
        super().__init__(redis, queue, partitions)

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[Self]:
        async with open_client(self._redis, retry=True) as client:
            await check_server(client, eviction=False)
            await self._open_layout(client)
            self._client = client
            try:
                yield self
            finally:
                self._client = None

    async def _current(self) -> Partitions:
        """The partitions, with the layout read again (another client may
        have repartitioned the queue since we entered)."""
        await refresh(self._open_client(), self._parts)
        return self._parts

    # -- groups ---------------------------------------------------------------

    @unavailable_as_error
    async def set_group(
        self,
        group: str,
        *,
        concurrency: int | None = None,
        rate: Rate | Literal[False] | None = None,
        max_size: int | None = None,
        priority: int | None = None,
        weight: int | None = None,
        ordering: Ordering | None = None,
    ) -> None:
        """Replace a group's settings (each ``None`` leaves that one to the
        queue's default): ``set_group(g, weight=2)`` drops an earlier
        ``concurrency=4``; :meth:`update_group` changes one setting and
        keeps the others. A raised concurrency starts waiting tasks at once; a
        lowered one lets running tasks finish. Pausing is separate
        (:meth:`pause_group`) and unchanged by this call.

        :param concurrency: tasks of the group that may run at once, in
            enqueue order (1 keeps them strictly one at a time)
        :param rate: at most ``rate.limit`` starts per ``rate.period``;
            ``False``: no limit even if the queue has a default
        :param max_size: most live tasks; an enqueue beyond it raises
            :class:`~aiogroupq.GroupFullError` and writes nothing
        :param priority: priority (0-9) of the group's tasks enqueued without
            one; with concurrency above 1 all of the group's tasks wait at it
        :param weight: 1-100: under backlog, the group's share of starts is
            its weight over the sum of the waiting groups' weights (a round
            gives it *weight* turns: its next task goes to the front of the
            ready line *weight* - 1 times in a row, then once to the tail)
        :param ordering: ``"strict"`` (the default): a retried task runs
            again before any later task of its group; ``"exclusive"``: still
            one task at a time (up to *concurrency*), but while a task waits
            out its retry backoff later tasks run, and it re-joins the tail
            of the group's line when due
        :raises InvalidGroupError: for a bad group name
        :raises ConfigurationError: for a bad setting
        """
        name = _settings.group_name(group)
        fields = _settings.group_fields(
            concurrency=concurrency,
            rate=rate,
            max_size=max_size,
            priority=priority,
            weight=weight,
            ordering=ordering,
        )
        for keys in (await self._current()).of_group(name):
            await _scripts.control(
                self._open_client(), keys, "group", name, *fields.values()
            )

    @unavailable_as_error
    async def update_group(
        self,
        group: str,
        *,
        concurrency: int | Literal["keep"] | None = "keep",
        rate: Rate | Literal[False, "keep"] | None = "keep",
        max_size: int | Literal["keep"] | None = "keep",
        priority: int | Literal["keep"] | None = "keep",
        weight: int | Literal["keep"] | None = "keep",
        ordering: Ordering | Literal["keep"] | None = "keep",
    ) -> None:
        """Change only the settings given and keep the group's others, where
        :meth:`set_group` replaces them all: after ``set_group(g,
        concurrency=4)``, ``update_group(g, weight=2)`` keeps the
        concurrency of 4. A setting left out (``"keep"``) stays as it is;
        one given as ``None`` goes back to the queue's default. The change
        is one script call per partition, so a concurrent change of another
        setting is kept too (no read and write back from here). The
        parameters are :meth:`set_group`'s.

        :raises InvalidGroupError: for a bad group name
        :raises ConfigurationError: for a bad setting, or none given
        """
        name = _settings.group_name(group)
        args = _settings.update_args(
            concurrency=concurrency,
            rate=rate,
            max_size=max_size,
            priority=priority,
            weight=weight,
            ordering=ordering,
        )
        for keys in (await self._current()).of_group(name):
            await _scripts.control(self._open_client(), keys, "update", name, *args)

    async def _hash_fields(self, key: str, what: str) -> dict[str, str]:
        """The fields of the settings hash *key*; one of another type is a
        :class:`~aiogroupq.CorruptQueueError` saying *what* is lost."""
        client = self._open_client()
        try:
            raw: Any = await client.hgetall(key)
        except ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            raise await corrupt_key(client, key, "hash", what) from None
        return {bytes(k).decode(): bytes(v).decode() for k, v in raw.items()}

    @unavailable_as_error
    async def group_settings(self, group: str) -> GroupSettings:
        """A group's own settings (all ``None`` if it has none).

        :raises CorruptQueueError: if its settings hash holds another type
        """
        name = _settings.group_name(group)
        keys = (await self._current()).of_group(name)[-1]
        fields = await self._hash_fields(
            keys.group_conf(name), f"the settings of group {name!r} cannot be read"
        )
        return _settings.group_settings_of(fields)

    @unavailable_as_error
    async def pause_group(self, group: str) -> None:
        """Start no new task of the group; running ones finish. Its waiting
        tasks keep their order and are shown as paused.

        Returns once no task of the group can start until it is resumed: a
        consumer starts a task it claimed only within 3 s of the claim, so
        when the group's latest claim is more recent, this waits out the rest.

        Like every setting, the pause of a group with no tasks yet (or of a
        queue nothing was enqueued to yet) is kept for the tasks to come:
        nothing checks that the name is one in use. To refuse a name with a
        typo, as ``aiogroupq pause`` does unless ``--create``, look first:
        :meth:`stats` (``exists``), :meth:`group_info` and
        :meth:`group_settings`."""
        name = _settings.group_name(group)
        window_ms = round(START_WINDOW * 1000)
        wait_ms = 0
        for keys in (await self._current()).of_group(name):
            waited = await _scripts.control(
                self._open_client(), keys, "pause", name, window_ms
            )
            wait_ms = max(wait_ms, waited)
        if wait_ms > 0:
            # A consumer may still start a task it claimed before the pause
            # until that claim's start window ends: wait it out, so that the
            # pause is exact once this returns.
            await anyio.sleep(wait_ms / 1000)

    @unavailable_as_error
    async def resume_group(self, group: str) -> None:
        """Let a paused group start tasks again, in order."""
        name = _settings.group_name(group)
        for keys in (await self._current()).of_group(name):
            await _scripts.control(self._open_client(), keys, "resume", name)

    # -- the queue ------------------------------------------------------------

    @unavailable_as_error
    async def configure(
        self,
        *,
        fairness: Fairness = "round_robin",
        group_concurrency: int = 1,
        group_rate: Rate | None = None,
        priority_aging: float | timedelta | None = None,
        group_weight: int = 1,
    ) -> None:
        """Replace the queue's settings (pause is separate: :meth:`pause`).

        :param fairness: ``"round_robin"`` (the default): groups take turns,
            so a group arriving behind others' backlogs starts within about
            one turn of each; ``"drain"``: a group's next task runs right
            after its previous one (better cache locality, but a new group
            waits for the busy groups' backlogs)
        :param group_concurrency: the concurrency of groups without their own
        :param group_rate: the rate limit of groups without their own
        :param priority_aging: seconds after which a waiting task counts as
            one priority level higher (so no priority starves); ``None``:
            strict priorities
        :param group_weight: the weight (1-100) of groups without their own
            (see :meth:`set_group`); with ``"drain"`` weights change nothing
        :raises ConfigurationError: for a bad setting
        """
        args = _settings.queue_args(
            fairness=fairness,
            group_concurrency=group_concurrency,
            group_rate=group_rate,
            priority_aging=priority_aging,
            group_weight=group_weight,
        )
        client = self._open_client()

        async def apply(keys: QueueKeys) -> None:
            await _scripts.control(client, keys, "queue", *args)
            # A raised default concurrency frees slots of groups with a line.
            start = 0
            while groups := await client.zrange(
                keys.backlog, start, start + _REFILL_BATCH - 1
            ):
                await _scripts.control(client, keys, "refill", *groups)
                start += _REFILL_BATCH

        await each_partition((await self._current()).all(), apply)

    @unavailable_as_error
    async def settings(self) -> QueueSettings:
        """The queue's settings.

        :raises CorruptQueueError: if its ``conf`` hash holds another type
        """
        fields = await self._hash_fields(self._keys.conf, UNREADABLE)
        return _settings.queue_settings_of(fields)

    @unavailable_as_error
    async def pause(self) -> None:
        """Start no new task anywhere in the queue; running ones finish, and
        enqueues are still accepted."""
        await self._everywhere("qpause")

    @unavailable_as_error
    async def resume(self) -> None:
        """Let a paused queue start tasks again."""
        await self._everywhere("qresume")

    async def _everywhere(self, op: str) -> None:
        client = self._open_client()

        async def apply(keys: QueueKeys) -> None:
            await _scripts.control(client, keys, op)

        await each_partition((await self._current()).all(), apply)

    # -- views ----------------------------------------------------------------

    @unavailable_as_error
    @_refusals_named
    async def stats(self) -> QueueStats:
        """The queue's counts: tasks ready, parked, held back, delayed,
        running and dead; groups with live tasks, waiting, halted, paused and
        rate-limited; live consumers; the age of the oldest waiting work; and
        the totals since the queue began. One script call per partition
        (after one ``HGET`` of the layout), O(log n): cheap enough to call
        every second on any queue.

        :raises CorruptQueueError: if a key it reads holds the wrong type
        """
        parts = await self._current()
        if not parts.partitioned:
            return await _reads.queue_stats(self._open_client(), self._keys)
        return await _aggregate.queue_stats(self._open_client(), parts)

    @unavailable_as_error
    @_refusals_named
    async def group_info(self, group: str) -> GroupInfo:
        """A group as seen now, with its state and the reason for it: why it
        is, or is not, running (one script call, after one ``HGET`` of the
        layout; while a task runs, one pipeline more reads its consumer's
        registry entry, to tell whether it is alive, silent or gone).

        :raises InvalidGroupError: for a bad group name
        """
        name = _settings.group_name(group)
        return await _aggregate.group_info(
            self._open_client(), await self._current(), name
        )

    @unavailable_as_error
    @_refusals_named
    async def groups(
        self, *, sort: GroupSort = "busiest", limit: int = 20, cursor: int = 0
    ) -> GroupPage:
        """One page of groups, each as :meth:`group_info` describes it.

        :param sort: ``"busiest"``: the longest lines first; ``"oldest"``: the
            lines that have waited longest first; ``"halted"`` or
            ``"paused"``: the halted or paused groups (in no order)
        :param limit: groups per page, 1 to 100 (a page of halted or paused
            groups may hold a few more or fewer)
        :param cursor: 0 for the first page, then the page's ``next_cursor``
        :raises ConfigurationError: for a bad *sort*, *limit* or *cursor*
        """
        if sort not in _SORTS:
            raise ConfigurationError(f"sort must be one of {_SORTS}, got {sort!r}")
        _settings.check_int("limit", limit, 1, MAX_PAGE)
        _settings.check_int("cursor", cursor, 0, 2**63 - 1)
        parts = await self._current()
        if not parts.partitioned:
            return await _reads.group_page(
                self._open_client(),
                self._keys,
                sort,
                cursor,
                limit,
            )
        return await _aggregate.group_page(
            self._open_client(), parts, sort, cursor, limit
        )

    @unavailable_as_error
    @_refusals_named
    async def task(self, task_id: str) -> TaskDetails:
        """One task as seen now: state, attempts, consumer and lease, due
        time, error, place in its group, payload.

        :raises TaskNotFoundError: for an unknown (or expired) id
        :raises CorruptTaskError: if its stored state is not a TaskState
        """
        checked = _validate.task_id(task_id)
        details = await _reads.task_details(
            self._open_client(), self._parts.of_id(checked), checked
        )
        if details is None:
            raise TaskNotFoundError(task_id)
        return details

    @unavailable_as_error
    async def position(self, task_id: str) -> int | None:
        """How many tasks of its group start before it: 0 when it runs or is
        its group's next; ``None`` when it does not wait in a group's order
        (ungrouped, still in its first delay, or ended).

        :raises TaskNotFoundError: for an unknown (or expired) id
        """
        return (await self.task(task_id)).position

    @unavailable_as_error
    @_refusals_named
    async def estimate(
        self, task_id: str, *, start_counting: bool = True
    ) -> StartEstimate | None:
        """When a waiting (queued or delayed) task is expected to start, from
        its place in the ready line or its group's line, its group's
        concurrency and rate limit, and the queue's recent start rate (see
        :class:`StartEstimate` for the basis it states, and docs/operating.md
        for the model). One read-only script call, plus one per other
        partition for the queue's rate.

        The rate is counted by the claims in a small rolling counter (the
        last 30 s), kept only once an estimate was asked of the queue: the
        first call switches it on for every partition (one ``HSET`` of
        each partition's ``conf``) and returns ``None``, as do calls
        until a second of starts was counted.

        :param start_counting: switch the counter on if it is off (the
            command line's and the dashboard's task pages only read: they
            pass ``False``)
        :return: the estimate, or ``None`` when there can be none: an unknown,
            ended, running or starting task; no starts counted yet (or none
            in the last 30 s); the queue, or the task's group, paused or
            halted; a task more than 10,000 places back; a client that may
            not switch the counter on
        :raises InvalidTaskError: for a task id that is not a non-empty str
        :raises CorruptQueueError: if the queue's ``conf`` or the task's
            hash holds the wrong type
        """
        checked = _validate.task_id(task_id)
        if not isinstance(start_counting, bool):
            raise ConfigurationError(
                f"start_counting must be True or False, not {start_counting!r}"
            )
        explained = await _estimate.explain(
            self._open_client(), await self._current(), checked, start_counting
        )
        return explained.estimate

    @unavailable_as_error
    @_refusals_named
    async def _explain_estimate(self, task_id: str) -> _estimate.Explained:
        """The task pages' read of an estimate (the counter left as it is),
        with the reason where there is none."""
        return await _estimate.explain(
            self._open_client(),
            await self._current(),
            _validate.task_id(task_id),
            switch_on=False,
        )

    @unavailable_as_error
    @_refusals_named
    async def consumers(self, *, limit: int = 1000) -> list[ConsumerInfo]:
        """The registered consumers, live ones first (latest heartbeat first),
        then those gone silent in the last few leases; each with what is
        known of it now (``ConsumerInfo.status``: alive, silent, or gone,
        its process not running on this host) and the tasks it holds on the
        server. One script call, and one pipeline per further partition.

        :param limit: the most to list
        """
        _settings.check_int("limit", limit, 1, 100_000)
        return await _consumers.consumer_list(
            self._open_client(), await self._current(), limit
        )

    @unavailable_as_error
    async def release_consumer(self, name: str) -> int:
        """Hand back the tasks of a dead consumer now, rather than when its
        lease ends: each goes back to the front of its group, its attempt
        counted (past its last attempt it is dead-lettered), as the
        recovery at the lease's end would do it, and fenced as that is: the
        consumer's late heartbeat or result is refused, should it come back.

        Refused while the consumer may still run them: while the registry
        counts it alive (it heartbeat within its lease), unless it is
        registered on this host and its process is gone. So a consumer
        killed on this host is released at once; one on another host, once
        its lease is over (the first claim after that recovers its tasks
        anyway; this hands them back without waiting for one).

        Its registry entry stays, listed as gone, until it expires. A task
        cancelled while it was held keeps its state for the default
        retention (an hour), whatever the consumers' ``retention``.

        :param name: the consumer's name (``ConsumerInfo.name``)
        :return: how many tasks were handed back (0 for a consumer that holds
            none, or an unknown name)
        :raises ConsumerRunningError: while the consumer may be alive; its
            message says what is known of it and when its lease ends
        :raises ConfigurationError: for a name that is not a non-empty string
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"name must be a consumer's name (a non-empty str), got {name!r}"
            )
        client, parts = self._open_client(), await self._current()
        await _consumers.check_releasable(client, parts, name)
        return await _group_ops.release_consumer(
            client, parts, name, retention_ms=round(DEFAULT_RETENTION * 1000)
        )

    # -- dead letters ---------------------------------------------------------

    @unavailable_as_error
    async def dead_letters(
        self, *, limit: int = 100, payloads: bool = True
    ) -> list[DeadLetter]:
        """The oldest *limit* dead-lettered tasks of the queue, oldest first.

        :param payloads: ``False`` leaves the bulky fields unread: each
            letter's ``payload`` is then ``None`` and its ``traceback``
            ``""``, and the listing reads a few hundred bytes per letter
            however large the payloads are (a page that shows no payloads)
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        if not isinstance(payloads, bool):
            raise ConfigurationError(
                f"payloads must be True or False, got {payloads!r}"
            )
        if not payloads:
            return await _reads.dead_letters_brief(
                self._open_client(), await self._current(), limit
            )
        rows = await dead_letter_rows(self._open_client(), await self._current(), limit)
        return [dead_letter(row) for row in rows]

    @unavailable_as_error
    async def requeue_dead(self, *task_ids: str) -> int:
        """Run dead-lettered tasks again, each at the front of its group with a
        fresh set of attempts (a group halted by it resumes with it).

        A requeue adds a live task to its group as an enqueue does, so it
        keeps the group's ``max_size``: a dead letter whose group is full
        stays dead (and is not counted); requeue it once the group has room.
        The one exception is the task a group is halted behind, the group's
        only way on: it is requeued even into a full group.

        :return: how many of *task_ids* were dead and were requeued (not
            counted: ids that were not dead, had damaged keys, or belong to
            a full group)
        """
        ids = [_validate.task_id(t) for t in task_ids]
        return await requeue_dead(self._open_client(), await self._current(), ids)

    @unavailable_as_error
    async def payload_previews(self, *task_ids: str) -> dict[str, str]:
        """The start of each dead letter's payload as text ("" for none), at
        most 1.5 KiB of each read however large it is (a dead-letter page's)."""
        ids = [_validate.task_id(t) for t in task_ids]
        return await _preview.payload_previews(
            self._open_client(), await self._current(), ids
        )

    @unavailable_as_error
    async def purge_dead(self, *task_ids: str, all: bool = False) -> int:
        """Delete the given dead letters, or every one with ``all=True``.

        With no ids and no ``all=True`` nothing is deleted: an id list that
        happens to be empty must not wipe the queue's dead letters.
        A group halted by a purged task passes on to its next task.

        :param all: delete every dead letter of the queue (no ids then)
        :return: how many dead letters were deleted
        :raises ConfigurationError: for task ids together with ``all=True``
        """
        if not isinstance(all, bool):
            raise ConfigurationError(f"all must be True or False, got {all!r}")
        if task_ids and all:
            raise ConfigurationError(
                f"purge_dead got {len(task_ids)} task ids and all=True: pass "
                "either the ids to delete or all=True, not both"
            )
        client = self._open_client()
        if not all:
            ids = [_validate.task_id(t) for t in task_ids]
            groups = by_partition(await self._current(), ids)
            return sum(
                [
                    await _scripts.dead_action(client, keys, "purge", mine)
                    for keys, mine in groups.items()
                ]
            )

        async def purge(keys: QueueKeys) -> int:
            total = 0
            while batch := await dead_ids(client, keys, 500):
                total += await _scripts.dead_action(client, keys, "purge", batch)
            return total

        return sum(await each_partition((await self._current()).all(), purge))

    @unavailable_as_error
    async def release_group(self, group: str) -> bool:
        """Let a group halted by a dead-lettered task (``on_dead="halt"``)
        continue with its next task; the dead task stays dead.

        :return: False if the group was not halted
        """
        checked = _validate.group(group)
        if checked is None:
            raise InvalidGroupError(group, "is None; name the halted group")
        client = self._open_client()
        done = 0
        for keys in (await self._current()).of_group(checked):
            done += await _scripts.dead_action(client, keys, "release", [checked])
        return done >= 1

    @unavailable_as_error
    async def cancel_group(self, group: str, *, running: bool = False) -> int:
        """Cancel every queued and delayed task of a group, each as
        :meth:`Producer.cancel <aiogroupq.Producer.cancel>` cancels one: the
        tasks in its line, those ready to run, held back (the group paused,
        halted or out of its rate), in a retry's backoff or in their first
        delay. They end ``cancelled``, kept for the retention window (one
        hour); the group stays as it was (paused, halted, its settings) and
        takes new tasks at once.

        Each script call is atomic and cancels at most 500 tasks; a larger
        group takes several calls. Between them the group goes on: a task
        whose turn comes because a running one ended may start, and tasks
        enqueued meanwhile may be cancelled or not (the line is read up to
        its length at the start plus the tasks then in their first delay,
        so the call ends however fast tasks arrive). Tasks enqueued after it
        returns are not touched. For an exact cut, :meth:`pause_group`
        first. Finding tasks in their first delay reads the queue's delayed
        set (500 a round trip) while the group has any; everything else is
        read from the group's own keys.

        A halted group's dead task is a dead letter, not cancelled: the
        group stays halted behind it (:meth:`release_group`, or
        :meth:`purge_group` to delete it). Running tasks finish unless
        *running*.

        :param running: also ask the consumers of the group's running tasks
            to cancel them, as :meth:`Producer.cancel
            <aiogroupq.Producer.cancel>` does: at their next heartbeat
        :return: how many tasks were cancelled, plus how many running ones
            were asked to be (0 for a group with no such task, or unknown)
        :raises InvalidGroupError: for a bad group name
        :raises ConfigurationError: if *running* is not a bool
        """
        name = _settings.group_name(group)
        if not isinstance(running, bool):
            raise ConfigurationError(f"running must be True or False, got {running!r}")
        client = self._open_client()
        done = 0
        for keys in (await self._current()).of_group(name):
            done += await _group_ops.cancel_group(
                client,
                keys,
                name,
                running=running,
                retention_ms=round(DEFAULT_RETENTION * 1000),
            )
        return done

    @unavailable_as_error
    async def purge_group(self, group: str) -> int:
        """Delete a group's dead letters, as :meth:`purge_dead` deletes given
        ones (a group halted by one goes on with its next task).

        Nothing indexes dead letters by group, so this reads the queue's
        whole dead set, 500 ids a round trip with their groups, and purges
        the group's in calls of at most 500: its cost grows with the
        queue's dead letters, not the group's. A task dead-lettered while it
        runs may be purged or not.

        :return: how many dead letters were deleted (0 for a group with
            none, or unknown)
        :raises InvalidGroupError: for a bad group name
        """
        name = _settings.group_name(group)
        client = self._open_client()
        done = 0
        for keys in (await self._current()).of_group(name):
            done += await _group_ops.purge_group(client, keys, name)
        return done

    # -- partitions -----------------------------------------------------------

    @unavailable_as_error
    async def partitions(self) -> tuple[int, int | None]:
        """The queue's partition count, and while it is being repartitioned
        the count it moves to (else ``None``)."""
        layout = (await self._current()).layout
        return layout.parts, layout.target

    @unavailable_as_error
    async def start_repartition(self, partitions: int) -> None:
        """Begin moving the queue to *partitions* partitions, live.

        Each group keeps its order: its new tasks go to its old partition
        while it has live tasks there, and to its new one after (see
        docs/scaling.md); consumers claim from both meanwhile. Call
        :meth:`finish_repartition` until it reports nothing left. Calling
        this again with the same count resumes an interrupted start.

        :raises ConfigurationError: for a bad count, the current count, or
            while a repartition to another count is under way
        """
        await _repartition.start(self._open_client(), self._parts, partitions)

    @unavailable_as_error
    async def finish_repartition(self) -> list[str]:
        """Complete a repartition if no group has live tasks outside its new
        partition any more and no partition beyond the new count holds
        tasks; return what it still waits for (empty: finished).

        :raises ConfigurationError: if no repartition is under way
        """
        shown, total = await _repartition.finish(self._open_client(), self._parts)
        if total > len(shown):
            shown.append(f"... and {total - len(shown)} more")
        return shown
