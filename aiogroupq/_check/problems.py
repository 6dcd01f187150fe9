"""What the consistency check reports: a :class:`Problem` per broken
invariant, of one of the kinds below (a module constant each, whose comment
says what it means). The rules that find them are in ``_check/rules.py``.
"""

from __future__ import annotations

__all__ = (
    "BAD_CONF",
    "BAD_COUNT",
    "BAD_ENVELOPE",
    "BAD_FENCE",
    "BAD_LAYOUT",
    "BAD_SETTING",
    "BAD_TASK",
    "DUPLICATE",
    "GROUP_OVERLAP",
    "LOST_TASK",
    "MISPLACED",
    "NOT_INFLIGHT",
    "ORPHAN_ENTRY",
    "OVERSIZED",
    "SLOT_MISMATCH",
    "STALE_STARTS",
    "STRAY_SLOT",
    "STUCK_HELD",
    "STUCK_PARK",
    "UNINDEXED_DEAD",
    "UNKNOWN_KEY",
    "UNMARKED_HEAD",
    "WRONG_PARTITION",
    "WRONG_SLOT",
    "WRONG_TYPE",
    "Problem",
    "sort_problems",
)

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

#: a key of the queue hashes to another cluster slot than the queue's fixed keys
WRONG_SLOT: Final = "wrong-slot"
#: a key under the queue's prefix that no script creates
UNKNOWN_KEY: Final = "unknown-key"
#: a key of the queue holds the wrong Redis type (e.g. ``ready`` is not a LIST)
WRONG_TYPE: Final = "wrong-type"
#: a task hash misses a field its state needs, or has an unusable value
BAD_TASK: Final = "bad-task"
#: a live task's envelope does not decode (the consumer would dead-letter it)
BAD_ENVELOPE: Final = "bad-envelope"
#: a live task's envelope or payload is larger than the consumers' payload
#: limit (they would dead-letter it unread)
OVERSIZED: Final = "oversized"
#: a ready / line / delayed / lease / recovery-key / dead entry names no task
ORPHAN_ENTRY: Final = "orphan-entry"
#: an entry names a task whose state, group or owner does not belong there
MISPLACED: Final = "misplaced"
#: a live task is in more than one place (or twice in one list)
DUPLICATE: Final = "duplicate"
#: a live task is in no place: nothing will ever run or recover it
LOST_TASK: Final = "lost-task"
#: a running task is missing from its owner's recovery key ``inflight:<c>``
NOT_INFLIGHT: Final = "not-inflight"
#: a group's slot holder is marked for another state than its task is in
#: (e.g. a running task whose mark is not its fencing token)
SLOT_MISMATCH: Final = "slot-mismatch"
#: a slot mark or halt marker of a group names no live task of the group
#: (a mark left behind holds a slot for ever)
STRAY_SLOT: Final = "stray-slot"
#: a grouped task in the ready list (or held back) without its slot mark
UNMARKED_HEAD: Final = "unmarked-head"
#: a group has a line while a slot is free and it is neither paused nor
#: halted: nothing will ever move the line
STUCK_PARK: Final = "stuck-park"
#: a group holds heads back (``held:<g>``) while it is neither paused nor
#: halted and no rate wake-up ``~<g>`` is pending: nothing will bring them back
STUCK_HELD: Final = "stuck-held"
#: more running tasks in a group than its concurrency and slots allow: with
#: concurrency 1, two at once (exclusion is broken)
GROUP_OVERLAP: Final = "group-overlap"
#: the fence counter is not an integer, or a token is above it
BAD_FENCE: Final = "bad-fence"
#: a dead task missing from the dead-letter index, where nobody would find it
UNINDEXED_DEAD: Final = "unindexed-dead"
#: a count kept by the scripts (a group's k, d or w, a stats counter, the
#: backlog, waiting, halted or paused index) disagrees with the keys, or a
#: group's hash is left over with nothing in it
BAD_COUNT: Final = "bad-count"
#: a group has live tasks in a partition it does not belong to under the
#: queue's layout, or in two partitions at once (its order and exclusion
#: across them are not kept); only a repartition's protocol moves groups
WRONG_PARTITION: Final = "wrong-partition"
#: a partition's copy of the queue's partition layout (conf ``parts``)
#: differs from partition 0's: its enqueues refuse tasks routed by the
#: queue's layout (any client entering brings a copy one step behind up to
#: date)
BAD_LAYOUT: Final = "bad-layout"
#: a flag of the queue's ``conf`` hash that the scripts rely on is missing:
#: ``pu`` while tasks wait in ``pready`` or carry a priority (claims would
#: never look there), ``gc`` while groups have settings (they would be
#: ignored), ``uq`` while tasks hold unique keys (never freed)
BAD_CONF: Final = "bad-conf"
#: a stored setting no aiogroupq call writes: a group's weight (``wt`` of
#: ``gconf:<g>``) or the queue's default weight (``wt`` of ``conf``) that is
#: not an integer from 1 to 100, or a group's ordering (``o``) that is not
#: ``exclusive``; the scripts take it as unset (the default), and the repair
#: removes it
BAD_SETTING: Final = "bad-setting"

#: the estimates' start counter (``starts``) holds more fields than claims
#: leave in it (``_limits.py`` ``STARTS_MOST``): fields no claim
#: wrote, which no claim sweeps (each does a bounded part of that work);
#: they cost memory only, and the repair deletes them in slices
STALE_STARTS: Final = "stale-starts"


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant.

    :ivar kind: what is broken, e.g. ``"stuck-park"`` (a group's line behind
        a free slot) or ``"lost-task"`` (a live task in no list)
    :ivar task_id: the task concerned, if one is
    :ivar group: the group concerned, if one is
    :ivar detail: a sentence for humans (key names, values seen)
    :ivar key: the key concerned, if one is
    """

    kind: str
    task_id: str | None
    group: str | None
    detail: str
    #: the key concerned (the list holding a wrong entry, the damaged key, the
    #: task's or the group's hash), if one is
    key: str | None = None

    def __str__(self) -> str:
        where = "".join(
            f" {label} {value!r}"
            for label, value in (("task", self.task_id), ("group", self.group))
            if value is not None
        )
        return f"{self.kind}{where}: {self.detail}"


def sort_problems(problems: Iterable[Problem]) -> list[Problem]:
    """*problems* without repeats, by kind, group, task and detail."""
    return sorted(
        set(problems),
        key=lambda p: (p.kind, p.group or "", p.task_id or "", p.detail),
    )
