"""``_handlers.build_routes``: each handler shape gets the payload type it declares.

This module uses ``from __future__ import annotations`` on purpose: every
annotation below is a string that the registry has to resolve, as in most
user code today.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Any, TypedDict

import msgspec
import pytest

from aiogroupq import ConfigurationError
from aiogroupq._work.handlers import build_routes


class Point(msgspec.Struct):
    x: int
    y: int


@dataclasses.dataclass
class Order:
    id: int


class Mail(TypedDict):
    to: str


# -- parameter shapes ---------------------------------------------------------


def test_handler_without_parameters_takes_no_payload() -> None:
    async def ping() -> None:
        pass

    route = build_routes({"ping": ping})["ping"]
    assert route.takes_payload is False
    assert route.func is ping


def test_unannotated_handler_gets_builtins() -> None:
    async def handler(payload):  # type: ignore[no-untyped-def]  # the point
        del payload

    route = build_routes({"t": handler})["t"]
    assert route.takes_payload is True
    assert route.payload_type is Any
    decoded = route.decoder.decode(msgspec.msgpack.encode({"a": [1, 2]}))
    assert decoded == {"a": [1, 2]}
    assert type(decoded) is dict


def test_string_annotation_of_a_struct_is_resolved() -> None:
    async def handler(payload: Point) -> None:
        del payload

    route = build_routes({"t": handler})["t"]
    assert route.payload_type is Point
    assert route.decoder.decode(msgspec.msgpack.encode({"x": 1, "y": 2})) == Point(1, 2)


def test_dataclass_and_typeddict_annotations() -> None:
    async def orders(payload: Order) -> None:
        del payload

    async def mails(payload: Mail) -> None:
        del payload

    routes = build_routes({"o": orders, "m": mails})
    assert routes["o"].payload_type is Order
    assert routes["o"].decoder.decode(msgspec.msgpack.encode({"id": 3})) == Order(3)
    assert routes["m"].payload_type is Mail
    assert routes["m"].decoder.decode(msgspec.msgpack.encode({"to": "a"})) == {
        "to": "a"
    }


def test_generic_builtin_annotation_validates() -> None:
    async def handler(payload: list[int]) -> None:
        del payload

    route = build_routes({"t": handler})["t"]
    assert route.decoder.decode(msgspec.msgpack.encode([1, 2])) == [1, 2]
    with pytest.raises(msgspec.ValidationError):
        route.decoder.decode(msgspec.msgpack.encode(["a"]))


def test_annotated_extras_are_kept() -> None:
    # include_extras: msgspec constraints in Annotated must reach the decoder.
    async def handler(payload: Annotated[int, msgspec.Meta(ge=0)]) -> None:
        del payload

    route = build_routes({"t": handler})["t"]
    assert route.decoder.decode(msgspec.msgpack.encode(5)) == 5
    with pytest.raises(msgspec.ValidationError):
        route.decoder.decode(msgspec.msgpack.encode(-1))


def test_optional_second_parameter_is_allowed() -> None:
    async def handler(payload: Point, retries: int = 3) -> None:
        del payload, retries

    route = build_routes({"t": handler})["t"]
    assert route.payload_type is Point


def test_keyword_only_parameters_are_not_the_payload() -> None:
    async def handler(payload: Point, *, verbose: bool = False) -> None:
        del payload, verbose

    assert build_routes({"t": handler})["t"].payload_type is Point


def test_wrapped_handler_uses_the_inner_annotation() -> None:
    async def inner(payload: Point) -> None:
        del payload

    @functools.wraps(inner)
    async def outer(*args: Any, **kwargs: Any) -> None:
        await inner(*args, **kwargs)

    route = build_routes({"t": outer})["t"]
    assert route.takes_payload is True
    assert route.payload_type is Point


async def _prefixed(prefix: str, payload: Point) -> None:
    del prefix, payload


def test_partial_of_async_function_is_accepted() -> None:
    route = build_routes({"t": functools.partial(_prefixed, "x")})["t"]
    assert route.takes_payload is True


def test_partial_of_async_function_keeps_the_payload_annotation() -> None:
    # A partial that binds leading arguments leaves `payload: Point`; the
    # handler must receive a Point, not a dict.
    route = build_routes({"t": functools.partial(_prefixed, "x")})["t"]
    assert route.payload_type is Point
    assert isinstance(
        route.decoder.decode(msgspec.msgpack.encode({"x": 1, "y": 2})), Point
    )


class _CallableHandler:
    def __init__(self) -> None:
        self.seen: list[Point] = []

    async def __call__(self, payload: Point) -> None:
        self.seen.append(payload)


def test_callable_object_with_async_call() -> None:
    handler = _CallableHandler()
    route = build_routes({"t": handler})["t"]
    assert route.takes_payload is True
    # `self` is bound, so the payload is the first parameter after it.
    assert route.payload_type is Point


def test_bound_async_method() -> None:
    handler = _CallableHandler()
    route = build_routes({"t": handler.__call__})["t"]
    assert route.payload_type is Point


# -- refusals -----------------------------------------------------------------


def _untyped(handlers: dict[str, Any]) -> Any:
    """Let wrongly-shaped handlers past the type checker: we test the runtime."""
    return handlers


def test_unresolvable_annotation_is_a_configuration_error() -> None:
    async def handler(payload: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        del payload

    with pytest.raises(ConfigurationError, match="'t'") as info:
        build_routes({"t": handler})
    assert "NoSuchType" in str(info.value)


def test_locally_defined_type_in_string_annotation_is_refused_clearly() -> None:
    # With postponed annotations a class local to a function is not in the
    # handler's globals: this must fail at construction, not at the first task.
    class Local(msgspec.Struct):
        a: int

    async def handler(payload: Local) -> None:
        del payload

    with pytest.raises(ConfigurationError, match="Local"):
        build_routes({"t": handler})


def test_type_msgspec_cannot_decode_is_a_configuration_error() -> None:
    # msgspec refuses a union of two dict-like types when the decoder is
    # built: the consumer must say so at construction, not crash later.
    async def handler(payload: Point | Order) -> None:
        del payload

    with pytest.raises(ConfigurationError, match="not supported"):
        build_routes({"t": handler})


def test_sync_function_is_refused() -> None:
    def handler(payload: Point) -> None:
        del payload

    with pytest.raises(ConfigurationError, match="async"):
        build_routes(_untyped({"t": handler}))


def test_partial_of_sync_function_is_refused() -> None:
    def handler(prefix: str, payload: Point) -> None:
        del prefix, payload

    with pytest.raises(ConfigurationError, match="async"):
        build_routes(_untyped({"t": functools.partial(handler, "x")}))


def test_callable_object_with_sync_call_is_refused() -> None:
    class Sync:
        def __call__(self, payload: Point) -> None:
            del payload

    with pytest.raises(ConfigurationError, match="async"):
        build_routes(_untyped({"t": Sync()}))


def test_two_required_parameters_are_refused() -> None:
    async def handler(a: int, b: int) -> None:
        del a, b

    with pytest.raises(ConfigurationError, match="requires 2"):
        build_routes({"t": handler})


@pytest.mark.parametrize("handlers", [{}, None, [("t", _prefixed)]])
def test_handlers_must_be_a_non_empty_mapping(handlers: Any) -> None:
    with pytest.raises(ConfigurationError, match="non-empty mapping"):
        build_routes(handlers)


@pytest.mark.parametrize("name", ["", 3])
def test_task_type_names_must_be_non_empty_strings(name: Any) -> None:
    async def handler() -> None:
        pass

    with pytest.raises(ConfigurationError, match=repr(name)):
        build_routes({name: handler})
