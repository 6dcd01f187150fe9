"""The dashboard's pages: the queues overview, a queue, its groups, a group,
a task, the dead letters, the consumers; and the token login."""

from __future__ import annotations

from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .._inspect.render import estimate_of, estimate_text
from .._inspect.views import GroupInfo, GroupState
from ..errors import AiogroupqError, InvalidGroupError, TaskNotFoundError
from ..task import TaskState
from . import _auth
from ._base import Dashboard, Urls, View, first, page, read_form, safe_next
from ._history import failure_chart, throughput_chart

#: groups per page of the groups list
GROUPS_PAGE: Final = 50
#: groups shown on a queue's page
BUSIEST: Final = 8
#: dead letters listed by default, and at most
DEAD_DEFAULT, DEAD_MAX = 100, 1000
#: seconds over which the rates beside the totals are averaged
RATE_SPAN: Final = 60.0
_SORTS: Final = {"backlog": "busiest", "age": "oldest"}
#: states a group may be filtered by; halted and paused are listed from
#: their own indexes, the others are filtered from the pages of lines
STATES: Final = tuple(state.value for state in GroupState)


@page
async def overview(dash: Dashboard, view: View) -> Response:
    cards = []
    for queue in dash.queues:
        async with dash.admin(queue) as admin:
            stats = await dash.stats(admin)
        history = dash.histories[queue]
        cards.append(
            {
                "stats": stats,
                "rates": history.rates(RATE_SPAN),
                "chart": throughput_chart(history.intervals(), stats.now, dash.window),
            }
        )
    return dash.render(
        view.request, "overview.html", {"cards": cards}, access=view.access, live=True
    )


@page
async def queue_page(dash: Dashboard, view: View) -> Response:
    async with dash.admin(view.queue) as admin:
        stats = await dash.stats(admin)
        busiest = await admin.groups(sort="busiest", limit=BUSIEST)
        halted = await admin.groups(sort="halted", limit=BUSIEST)
    history = dash.histories[view.queue]
    intervals = history.intervals()
    return dash.render(
        view.request,
        "queue.html",
        {
            "stats": stats,
            "rates": history.rates(RATE_SPAN),
            "busiest": [dash.shown_group(g) for g in busiest.groups],
            "halted": [dash.shown_group(g) for g in halted.groups],
            "throughput": throughput_chart(intervals, stats.now, dash.window),
            "failures": failure_chart(intervals, stats.now, dash.window),
            "window": dash.window,
        },
        access=view.access,
        queue=view.queue,
        live=True,
    )


@page
async def groups_page(dash: Dashboard, view: View) -> Response:
    sort = view.param("sort", "backlog")
    sort = sort if sort in _SORTS else "backlog"
    state = view.param("state")
    state = state if state in STATES else ""
    search = view.param("q").strip()
    cursor_text = view.param("cursor", "0")
    cursor = int(cursor_text) if cursor_text.isdigit() else 0
    exact: GroupInfo | None = None
    problem = None
    async with dash.admin(view.queue) as admin:
        listed = state if state in ("halted", "paused") else _SORTS[sort]
        found = await admin.groups(
            sort=listed,  # type: ignore[arg-type]
            limit=GROUPS_PAGE,
            cursor=min(cursor, 2**63 - 1),
        )
        if search:
            try:
                exact = await admin.group_info(search)
            except InvalidGroupError as exc:
                problem = str(exc)
    needle = search.casefold()
    rows = [
        dash.shown_group(g)
        for g in found.groups
        if (not state or g.state == state)
        and (not needle or needle in g.group.casefold())
        and (exact is None or g.group != exact.group)
    ]
    if exact is not None and exact.state == GroupState.IDLE and rows:
        # The text was a part of names, not a group of its own: an idle
        # "group" of that name would only be noise above the matches.
        exact = None
    return dash.render(
        view.request,
        "groups.html",
        {
            "rows": rows,
            "exact": None if exact is None else dash.shown_group(exact),
            "problem": problem,
            "search": search,
            "state": state,
            "sort": sort,
            "states": STATES,
            "scanned": len(found.groups),
            "cursor": cursor,
            "next_cursor": found.next_cursor,
        },
        access=view.access,
        queue=view.queue,
        live=True,
    )


@page
async def group_page(dash: Dashboard, view: View) -> Response:
    name = view.request.query_params.get("name", "")
    if not name:
        return RedirectResponse(view.urls.queue(view.queue, "groups"), status_code=303)
    async with dash.admin(view.queue) as admin:
        info = await admin.group_info(name)
        settings = await admin.group_settings(name)
    return dash.render(
        view.request,
        "group.html",
        {"info": dash.shown_group(info), "settings": settings},
        access=view.access,
        queue=view.queue,
        live=True,
    )


@page
async def task_page(dash: Dashboard, view: View) -> Response:
    task_id = view.request.query_params.get("id", "").strip()
    context: dict[str, Any] = {
        "task_id": task_id,
        "task": None,
        "result": None,
        "estimate": None,
    }
    if not task_id:
        return dash.render(
            view.request, "task.html", context, access=view.access, queue=view.queue
        )
    async with dash.admin(view.queue) as admin:
        try:
            details = await admin.task(task_id)
        except TaskNotFoundError:
            return dash.render(
                view.request,
                "task.html",
                {**context, "missing": True},
                access=view.access,
                queue=view.queue,
                status=404,
            )
        # A waiting task's start estimate, where the queue's start counter
        # is on (the page only reads: Admin.estimate() switches it on).
        estimate = await estimate_of(admin._explain_estimate, details)
    context["task"] = details
    context["estimate"] = None if estimate is None else estimate_text(estimate)
    if dash.show_payloads:
        context["payload"] = _as_text(details.payload)
        if details.has_result and details.state == TaskState.SUCCEEDED:
            context["result"] = await _result(dash, view.queue, task_id)
    return dash.render(
        view.request,
        "task.html",
        context,
        access=view.access,
        queue=view.queue,
        live=details.state in ("queued", "delayed", "running"),
    )


async def _result(dash: Dashboard, queue: str, task_id: str) -> str:
    async with dash.producer(queue) as producer:
        try:
            return _as_text(await producer.result(task_id, timeout=0))
        except AiogroupqError as exc:  # expired meanwhile, undecodable...
            return f"(not readable: {exc})"


def _as_text(value: object) -> str:
    """A payload or result for people: indented JSON, else its repr."""
    try:
        data = msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return repr(value)
    return msgspec.json.format(data, indent=2).decode()


@page
async def dead_page(dash: Dashboard, view: View) -> Response:
    limit_text = view.param("limit", str(DEAD_DEFAULT))
    limit = min(int(limit_text), DEAD_MAX) if limit_text.isdigit() else DEAD_DEFAULT
    limit = max(limit, 1)
    kind = view.param("type")
    group = view.param("group").strip()
    # A filter on hidden reasons would tell them apart: there is none then.
    reason = view.param("reason").strip() if dash.show_errors else ""
    async with dash.admin(view.queue) as admin:
        stats = await dash.stats(admin)
        # Payloads are never read whole here: a page of large ones would cost
        # their whole size, at every live refresh. The page shows the start
        # of each shown one, read from the first bytes of its envelope.
        letters = await admin.dead_letters(limit=limit, payloads=False)
        types = sorted({d.type for d in letters})
        shown = [
            d
            for d in letters
            if (not kind or d.type == kind)
            and (not group or group.casefold() in (d.group or "").casefold())
            and (not reason or reason.casefold() in d.reason.casefold())
        ]
        payloads = (
            await admin.payload_previews(*(d.id for d in shown))
            if dash.show_payloads
            else {}
        )
    return dash.render(
        view.request,
        "dead.html",
        {
            "stats": stats,
            "letters": shown,
            "fetched": len(letters),
            "types": types,
            "kind": kind,
            "group": group,
            "reason": reason,
            "limit": limit,
            "payloads": payloads,
            "filtered": bool(kind or group or reason),
        },
        access=view.access,
        queue=view.queue,
        live=True,
    )


@page
async def consumers_page(dash: Dashboard, view: View) -> Response:
    async with dash.admin(view.queue) as admin:
        stats = await dash.stats(admin)
        found = await admin.consumers()
    return dash.render(
        view.request,
        "consumers.html",
        {"stats": stats, "consumers": found},
        access=view.access,
        queue=view.queue,
        live=True,
    )


# -- the token login --------------------------------------------------------------


async def login_page(dash: Dashboard, request: Request) -> Response:
    urls = Urls(_auth.root_path(request))
    if not dash.guard.uses_login:
        return RedirectResponse(urls.home(), status_code=303)
    access = await dash.guard.access(request)
    return dash.render(
        request,
        "login.html",
        {"next": request.query_params.get("next", ""), "failed": False},
        access=access,
    )


async def login(dash: Dashboard, request: Request) -> Response:
    urls = Urls(_auth.root_path(request))
    if not dash.guard.uses_login:
        return RedirectResponse(urls.home(), status_code=303)
    form = await read_form(request)
    nobody = _auth.Access(False, False, False, None)
    if (problem := _auth.csrf_problem(request, form, dash.hosts)) is not None:
        return dash.error(request, 403, "Refused", problem, access=nobody)
    throttle = dash.guard.throttle
    address = request.client.host if request.client else "?"
    if wait := throttle.retry_after(address):
        # Refused before the token is compared: a guess made now is not
        # tested, so guessing faster gains nothing.
        response = dash.render(
            request,
            "login.html",
            {"next": first(form, "next"), "failed": False, "retry_after": wait},
            access=nobody,
            status=429,
        )
        response.headers["retry-after"] = str(wait)
        return response
    if not dash.guard.check_token(first(form, "token")):
        throttle.failed(address)
        return dash.render(
            request,
            "login.html",
            {"next": first(form, "next"), "failed": True},
            access=nobody,
            status=401,
        )
    throttle.succeeded(address)
    response = RedirectResponse(safe_next(request, form, urls.home()), status_code=303)
    _auth.set_cookie(
        request,
        response,
        _auth.SESSION_COOKIE,
        dash.guard.new_session(),
        max_age=_auth.SESSION_TTL,
    )
    return response


async def logout(dash: Dashboard, request: Request) -> Response:
    urls = Urls(_auth.root_path(request))
    form = await read_form(request)
    if (problem := _auth.csrf_problem(request, form, dash.hosts)) is not None:
        nobody = _auth.Access(False, False, False, None)
        return dash.error(request, 403, "Refused", problem, access=nobody)
    # Ended here, not only forgotten by this browser: a copy of the cookie
    # (another tab's, a stolen one) is refused from now on.
    dash.guard.end_session(request.cookies.get(_auth.SESSION_COOKIE))
    response = RedirectResponse(urls.login(), status_code=303)
    _auth.forget_cookie(request, response, _auth.SESSION_COOKIE)
    return response
