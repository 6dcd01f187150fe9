"""The operator commands' arguments: :func:`add_commands` adds ``stats``,
``groups``, ``group``, ``task``, ``consumers``, ``dead``, ``release``,
``pause``, ``resume``, ``cancel`` and ``repartition`` to the ``aiogroupq``
parser (``_cli/args.py``); ``_cli/ops.py`` runs them.
"""

from __future__ import annotations

__all__ = ("QUEUE_ENV", "add_commands")

import argparse
import os
from dataclasses import dataclass
from typing import Final

#: where ``--queue`` is read from when it is not given
QUEUE_ENV: Final = "AIOGROUPQ_QUEUE"


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], redis_url: str
) -> None:
    """Add the operator commands to the ``aiogroupq`` parser.

    :param commands: the parser's subcommands
    :param redis_url: the default ``--redis-url``
    """
    # Every command that runs takes these, after its own arguments or before.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--queue",
        default=os.environ.get(QUEUE_ENV),
        help=f"queue name (default: ${QUEUE_ENV})",
    )
    common.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", redis_url),
        help="Redis URL (default: $REDIS_URL, else %(default)s)",
    )
    adder = _Adder(commands, common)
    _add_reading(adder)
    _add_dead(adder)
    _add_acting(adder)


@dataclass(frozen=True, slots=True)
class _Adder:
    """Adds commands that take the common options (``--queue``,
    ``--redis-url``)."""

    commands: argparse._SubParsersAction[argparse.ArgumentParser]
    common: argparse.ArgumentParser

    def command(
        self, name: str, text: str, description: str, *, leaf: bool = True
    ) -> argparse.ArgumentParser:
        """A command; *leaf*: one that runs (not a group of subcommands)."""
        return self.commands.add_parser(
            name,
            help=text,
            description=description,
            parents=[self.common] if leaf else [],
        )


def _as_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def _add_reading(adder: _Adder) -> None:
    """stats, groups, group, task, consumers."""
    stats = adder.command(
        "stats",
        "a queue's counts: tasks, groups, consumers, totals",
        "Print a queue's counts: tasks ready, parked behind busy groups, held "
        "back, delayed, running and dead; groups with tasks, waiting, halted, "
        "paused and rate-limited; live consumers and their heartbeats; the age "
        "of the oldest waiting work; and the totals since the queue began. One "
        "script call per partition that scans nothing, cheap on any queue.",
    )
    _as_json(stats)
    stats.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    stats.add_argument(
        "--interval", type=_seconds, default=1.0, help="seconds between refreshes"
    )
    stats.add_argument(
        "--count", type=_positive, help="with --watch: stop after this many pages"
    )

    groups = adder.command(
        "groups",
        "list groups: the busiest, the oldest, halted or paused ones",
        "List one page of groups with their state and the reason for it. "
        "Pages never walk every group: pass the printed cursor for the next.",
    )
    _as_json(groups)
    groups.add_argument(
        "--sort",
        choices=("busiest", "oldest", "halted", "paused"),
        default="busiest",
        help="busiest: longest lines first; oldest: lines waiting longest "
        "first; halted, paused: those groups (default: %(default)s)",
    )
    groups.add_argument(
        "--limit", type=_positive, default=20, help="groups per page (default: 20)"
    )
    groups.add_argument("--cursor", type=int, default=0, help="the page to show")

    group = adder.command(
        "group",
        "one group: its state and why it is, or is not, running",
        "Show one group: its state (idle, ready, running, at its cap, waiting "
        "for a retry, rate-limited, paused, halted, delayed), the reason in "
        "one sentence, its running tasks with their consumers and leases, its "
        "next task, its line and its settings.",
    )
    group.add_argument("name", metavar="GROUP", help="the group key")
    _as_json(group)

    task = adder.command(
        "task",
        "one task: state, attempts, consumer, place in its group",
        "Show one task: its state, attempts, consumer and lease, due time, "
        "last error, place in its group's order and payload.",
    )
    task.add_argument("task_id", metavar="ID", help="the task id")
    _as_json(task)

    consumers = adder.command(
        "consumers",
        "the consumers: hosts, pids, tasks in flight, heartbeats",
        "List the registered consumers, live ones first, then those that went "
        "silent without leaving in the last few leases.",
    )
    _as_json(consumers)


def _add_dead(adder: _Adder) -> None:
    """dead list, show, requeue, purge."""
    dead = adder.command(
        "dead",
        "dead letters: list, show, requeue, purge",
        "Inspect and act on dead-lettered tasks.",
        leaf=False,
    )
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    dead_list = actions.add_parser(
        "list",
        help="the oldest dead letters",
        description="List dead letters, oldest first.",
        parents=[adder.common],
    )
    dead_list.add_argument("--limit", type=_positive, default=50, help="how many")
    _as_json(dead_list)
    dead_show = actions.add_parser(
        "show",
        help="one dead letter with its reason and traceback",
        description="Show one dead letter: reason, traceback, payload.",
        parents=[adder.common],
    )
    dead_show.add_argument("task_id", metavar="ID")
    _as_json(dead_show)
    for action, text in (
        ("requeue", "run dead letters again, each first in its group's line"),
        ("purge", "delete dead letters (a group halted by one goes on)"),
    ):
        parser = actions.add_parser(
            action,
            help=text,
            description=text[0].upper() + text[1:] + ".",
            parents=[adder.common],
        )
        parser.add_argument("ids", nargs="*", metavar="ID", help="task ids")
        parser.add_argument(
            "--all", action="store_true", help="every dead letter there is now"
        )
        if action == "purge":
            parser.add_argument(
                "--group",
                metavar="GROUP",
                help="every dead letter of this group (reads the queue's "
                "whole dead set to find them)",
            )
            _confirmed(parser)


def _confirmed(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--yes",
        action="store_true",
        help="with --group: do it (without, the command says what it would "
        "do and exits 1)",
    )


def _add_acting(adder: _Adder) -> None:
    """release, pause, resume, cancel, repartition."""
    release = adder.command(
        "release",
        "let a halted group go on, or hand a dead consumer's tasks back",
        "Let a group halted behind a dead task go on with its next task; the "
        "dead task stays dead. With --consumer, hand the tasks of a dead "
        "consumer back now rather than when its lease ends, each to the front "
        "of its group (its attempt counted); refused (exit status 1) while "
        "the consumer may be alive: while it heartbeats within its lease, "
        "unless it runs on this host and its process is gone.",
    )
    release.add_argument("name", metavar="GROUP", nargs="?", help="a halted group")
    release.add_argument(
        "--consumer",
        metavar="NAME",
        help="hand back this dead consumer's tasks (aiogroupq consumers lists "
        "the names)",
    )
    pause = adder.command(
        "pause",
        "stop starting tasks of a group, or of the whole queue",
        "Stop starting tasks of a group, or of the whole queue; running tasks "
        "are not touched. A queue or group with no tasks and no settings is "
        "most likely a typo: it is refused (exit status 1) unless --create.",
    )
    pause.add_argument("name", metavar="GROUP", nargs="?", help="default: the queue")
    pause.add_argument(
        "--create",
        action="store_true",
        help="pause a queue or group that has no tasks or settings yet, for "
        "the tasks to come",
    )
    resume = adder.command(
        "resume",
        "start tasks of a paused group, or queue, again",
        "Start tasks of a paused group, or of the paused queue, again, in "
        "order. One that is not paused is reported (exit status 1).",
    )
    resume.add_argument("name", metavar="GROUP", nargs="?", help="default: the queue")
    cancel = adder.command(
        "cancel",
        "cancel a task, or a group's waiting tasks (a running one at its "
        "consumer's next heartbeat)",
        "Cancel a task wherever it waits; a running task is cancelled by its "
        "consumer at its next heartbeat. With --group, cancel every queued "
        "and delayed task of the group (and with --running its running ones "
        "too); a halted group's dead task stays a dead letter.",
    )
    cancel.add_argument("task_id", metavar="ID", nargs="?", help="the task id")
    cancel.add_argument(
        "--group", metavar="GROUP", help="cancel this group's waiting tasks"
    )
    cancel.add_argument(
        "--running",
        action="store_true",
        help="with --group: also cancel its running tasks",
    )
    _confirmed(cancel)
    repartition = adder.command(
        "repartition",
        "change a live queue's partition count, keeping every group's order",
        "Begin moving the queue to --to partitions (each group's tasks in its "
        "old partition finish before its new partition starts any), then "
        "finish the move once nothing holds it open; without --wait, only "
        "report what still does (exit status 1). --finish alone finishes a "
        "move begun earlier. See docs/scaling.md.",
    )
    repartition.add_argument(
        "--to", type=_positive, metavar="K", help="the new partition count"
    )
    repartition.add_argument(
        "--finish", action="store_true", help="finish a move begun earlier"
    )
    repartition.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help="keep trying to finish for up to this long",
    )


def _positive(text: str) -> int:
    if (value := int(text)) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    if not 0.05 <= (value := float(text)) < 86_400:
        raise argparse.ArgumentTypeError(f"must be seconds >= 0.05, got {text}")
    return value
