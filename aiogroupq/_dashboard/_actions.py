"""The dashboard's actions, each the library call the operator command
makes: pause and resume a queue or a group, release a halted group, requeue
or purge dead letters (a group's with ``group``), cancel a task or a group's
waiting tasks (``group``, with ``running=1`` its running ones too). Each
returns the message shown on the page the form came from; a bad input
raises (shown as an error there)."""

from __future__ import annotations

from typing import Final

from .._inspect.render import count
from ._base import ActionRefused, Dashboard, Form, action, first

#: dead letters read and requeued per round trip by "requeue all"
_BATCH: Final = 500
#: the states a task can be cancelled in
_LIVE: Final = frozenset({"queued", "delayed", "running"})


@action
async def pause_queue(dash: Dashboard, queue: str, form: Form) -> str:
    async with dash.admin(queue) as admin:
        await admin.pause()
    return f"paused queue {queue!r}: nothing new starts; running tasks finish"


@action
async def resume_queue(dash: Dashboard, queue: str, form: Form) -> str:
    async with dash.admin(queue) as admin:
        await admin.resume()
    return f"resumed queue {queue!r}"


@action
async def pause_group(dash: Dashboard, queue: str, form: Form) -> str:
    name = first(form, "name")
    async with dash.admin(queue) as admin:
        await admin.pause_group(name)
    return f"paused group {name!r}: nothing new of it starts; a running task finishes"


@action
async def resume_group(dash: Dashboard, queue: str, form: Form) -> str:
    name = first(form, "name")
    async with dash.admin(queue) as admin:
        await admin.resume_group(name)
    return f"resumed group {name!r}"


@action
async def release_group(dash: Dashboard, queue: str, form: Form) -> str:
    name = first(form, "name")
    async with dash.admin(queue) as admin:
        if not await admin.release_group(name):
            raise ActionRefused(f"group {name!r} is not halted: nothing to release")
    return f"released group {name!r}: it goes on with its next task"


def _ids(form: Form) -> list[str]:
    ids = [i for i in form.get("id", []) if i]
    if ids and first(form, "all"):
        raise ActionRefused("give task ids or all, not both")
    return ids


@action
async def requeue_dead(dash: Dashboard, queue: str, form: Form) -> str:
    ids = _ids(form)
    async with dash.admin(queue) as admin:
        if ids:
            done = await admin.requeue_dead(*ids)
            if not done:
                raise ActionRefused(f"none of the {len(ids)} tasks is a dead letter")
            return f"requeued {count(done)} of {count(len(ids))} dead letters"
        if not first(form, "all"):
            raise ActionRefused("select the dead letters to requeue")
        left = (await admin.stats()).dead
        # Only what is dead now: one that dies again meanwhile has a later
        # place in the list and is not chased.
        done = 0
        while left > 0:
            letters = await admin.dead_letters(limit=min(_BATCH, left), payloads=False)
            if not letters:
                break
            requeued = await admin.requeue_dead(*(d.id for d in letters))
            if not requeued:  # left alone (damaged): do not loop on them
                break
            done += requeued
            left -= len(letters)
    return f"requeued {count(done)} dead letters"


@action
async def purge_dead(dash: Dashboard, queue: str, form: Form) -> str:
    if group := first(form, "group"):
        return await _purge_group(dash, queue, form, group)
    ids = _ids(form)
    async with dash.admin(queue) as admin:
        if ids:
            done = await admin.purge_dead(*ids)
            if not done:
                raise ActionRefused(f"none of the {len(ids)} tasks is a dead letter")
            return f"purged {count(done)} of {count(len(ids))} dead letters"
        if not first(form, "all"):
            raise ActionRefused("select the dead letters to purge")
        if first(form, "confirm") != "yes":
            raise ActionRefused(
                "purging every dead letter needs the confirmation box ticked"
            )
        done = await admin.purge_dead(all=True)
    return f"purged {count(done)} dead letters"


async def _purge_group(dash: Dashboard, queue: str, form: Form, group: str) -> str:
    """Purge the group's dead letters (the group page's form)."""
    if form.get("id") or first(form, "all"):
        raise ActionRefused("give task ids, all or a group, not several")
    if first(form, "confirm") != "yes":
        raise ActionRefused(
            "purging a group's dead letters needs the confirmation box ticked"
        )
    async with dash.admin(queue) as admin:
        done = await admin.purge_group(group)
    if not done:
        raise ActionRefused(f"group {group!r} has no dead letters")
    return f"purged {count(done)} dead letters of group {group!r}"


async def _cancel_group(dash: Dashboard, queue: str, form: Form, group: str) -> str:
    """Cancel the group's waiting tasks, with ``running=1`` its running ones
    too (the group page's form)."""
    if first(form, "id"):
        raise ActionRefused("give a task id or a group, not both")
    if first(form, "confirm") != "yes":
        raise ActionRefused(
            "cancelling a group's tasks needs the confirmation box ticked"
        )
    running = first(form, "running") == "1"
    async with dash.admin(queue) as admin:
        done = await admin.cancel_group(group, running=running)
    if not done:
        raise ActionRefused(f"group {group!r} has no task to cancel")
    if running:
        return (
            f"cancelled {count(done)} tasks of group {group!r} (a running one "
            "is cancelled by its consumer at its next heartbeat)"
        )
    return f"cancelled {count(done)} tasks of group {group!r}"


@action
async def cancel_task(dash: Dashboard, queue: str, form: Form) -> str:
    if group := first(form, "group"):
        return await _cancel_group(dash, queue, form, group)
    task_id = first(form, "id")
    if not task_id:
        raise ActionRefused("name the task to cancel")
    async with dash.producer(queue) as producer:
        state = await producer.status(task_id)
        if state is not None and state not in _LIVE:
            raise ActionRefused(f"task {task_id!r} had already ended ({state})")
        if not await producer.cancel(task_id):
            raise ActionRefused(f"task {task_id!r} had already ended")
    if state == "running":
        return (
            f"task {task_id!r} is running: its consumer cancels it at its next "
            "heartbeat"
        )
    return f"cancelled task {task_id!r}"
