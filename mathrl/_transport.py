"""How the SDK's calls are written once and run both sync and async (mathrl/client.py).

A call is an operation: a generator that yields the steps it needs done (`Send` a request, `Open` a
streamed answer and read its lines, `Sleep`, ask the `RetryLimit`) and is sent each step's result,
so it holds the call's whole logic and does no I/O itself. `SyncTransport` (on an httpx.Client) and
`AsyncTransport` (on an httpx.AsyncClient) carry the steps out; an exception a step raises is thrown
into the operation where it yielded. A resource is a class of operations decorated with `call` or
`iterator`; `SyncResource` and `AsyncResource` turn them into plain methods, or coroutine methods
and async iterators, with the same parameters."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, get_args, get_origin, overload

import httpx

T = TypeVar("T")
Y_co = TypeVar("Y_co", covariant=True)
P = ParamSpec("P")


@dataclass(frozen=True)
class Send:
    """Send a request and read its whole answer: the result is the httpx.Response."""

    method: str
    url: str
    kw: dict[str, Any]


@dataclass(frozen=True)
class Open:
    """Send a request and read only the head of its answer: the result is the httpx.Response,
    whose lines `NextLine` reads; it stays open until `Close` or the end of the operation."""

    method: str
    url: str
    kw: dict[str, Any]


@dataclass(frozen=True)
class NextLine:
    """The next line of an opened answer: a str, or None at its end."""

    response: httpx.Response


@dataclass(frozen=True)
class ReadBody:
    """Read the rest of an opened answer (to parse an error answer whole)."""

    response: httpx.Response


@dataclass(frozen=True)
class Close:
    """Close an opened answer before the operation ends."""

    response: httpx.Response


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class RetryLimit:
    """Ask how many times a failed request may be sent again: the result is the client's `max_retries`."""


@dataclass(frozen=True)
class Item(Generic[T]):
    """Not a step: the next item of an `iterator` operation, handed to the caller."""

    value: T


Step = Send | Open | NextLine | ReadBody | Close | Sleep | RetryLimit
Op = Generator[Step, Any, T]  # an operation: its steps, then its value
Pager = Generator[Step | Item[T], Any, None]  # an operation whose items the caller iterates


class Steps(Generic[Y_co, T]):
    """An operation walked step by step: answer each step it yields with `reply` or `fail`
    before taking the next; `value` is what it returned."""

    value: T

    def __init__(self, op: Generator[Y_co, Any, T]) -> None:
        self._op = op
        self._reply: Any = None
        self._error: Exception | None = None

    def __iter__(self) -> Iterator[Y_co]:
        while True:
            reply, error, self._reply, self._error = self._reply, self._error, None, None
            try:
                step = self._op.send(reply) if error is None else self._op.throw(error)
            except StopIteration as end:
                self.value = end.value
                return
            yield step

    def reply(self, value: Any) -> None:
        self._reply = value

    def fail(self, error: Exception) -> None:
        self._error = error


def collect(pager: Pager[T]) -> Op[list[T]]:
    """An operation: every item of `pager` in one list (its steps pass through)."""
    items: list[T] = []
    steps = Steps(pager)
    for step in steps:
        if isinstance(step, Item):
            items.append(step.value)
            continue
        try:
            steps.reply((yield step))
        except Exception as exc:
            steps.fail(exc)
    return items


class _SyncIO(contextlib.ExitStack):
    """One operation's steps on an httpx.Client; the answers it opened close when it ends."""

    def __init__(self, http: httpx.Client, max_retries: int) -> None:
        super().__init__()
        self.http = http
        self.max_retries = max_retries
        self.lines: dict[httpx.Response, Iterator[str]] = {}

    def do(self, step: Step) -> Any:
        match step:
            case Send(method, url, kw):
                return self.http.request(method, url, **kw)
            case Open(method, url, kw):
                resp = self.enter_context(self.http.stream(method, url, **kw))
                self.lines[resp] = resp.iter_lines()
                return resp
            case NextLine(resp):
                return next(self.lines[resp], None)
            case ReadBody(resp):
                return resp.read()
            case Close(resp):
                return resp.close()
            case Sleep(seconds):
                return time.sleep(seconds)
            case RetryLimit():
                return self.max_retries


class _AsyncIO(contextlib.AsyncExitStack):
    """`_SyncIO` on an httpx.AsyncClient."""

    def __init__(self, http: httpx.AsyncClient, max_retries: int) -> None:
        super().__init__()
        self.http = http
        self.max_retries = max_retries
        self.lines: dict[httpx.Response, AsyncIterator[str]] = {}

    async def do(self, step: Step) -> Any:
        match step:
            case Send(method, url, kw):
                return await self.http.request(method, url, **kw)
            case Open(method, url, kw):
                resp = await self.enter_async_context(self.http.stream(method, url, **kw))
                self.lines[resp] = resp.aiter_lines()
                return resp
            case NextLine(resp):
                return await anext(self.lines[resp], None)
            case ReadBody(resp):
                return await resp.aread()
            case Close(resp):
                return await resp.aclose()
            case Sleep(seconds):
                return await asyncio.sleep(seconds)
            case RetryLimit():
                return self.max_retries


class SyncTransport:
    """Runs operations on `self.http` (read at each call: a test may swap it)."""

    http: httpx.Client
    max_retries: int

    def _run(self, op: Op[T]) -> T:
        steps = Steps(op)
        for _ in self._items(steps):  # a call's operation yields no Item
            pass
        return steps.value

    def _iterate(self, pager: Pager[T]) -> Iterator[T]:
        return self._items(Steps(pager))

    def _items(self, steps: Steps[Step | Item[T], Any]) -> Iterator[T]:
        with _SyncIO(self.http, self.max_retries) as io:
            for step in steps:
                if isinstance(step, Item):
                    yield step.value
                    continue
                try:
                    steps.reply(io.do(step))
                except Exception as exc:
                    steps.fail(exc)


class AsyncTransport:
    """`SyncTransport` on an httpx.AsyncClient."""

    http: httpx.AsyncClient
    max_retries: int

    async def _run(self, op: Op[T]) -> T:
        steps = Steps(op)
        async for _ in self._items(steps):  # a call's operation yields no Item
            pass
        return steps.value

    def _iterate(self, pager: Pager[T]) -> AsyncIterator[T]:
        return self._items(Steps(pager))

    async def _items(self, steps: Steps[Step | Item[T], Any]) -> AsyncIterator[T]:
        async with _AsyncIO(self.http, self.max_retries) as io:
            for step in steps:
                if isinstance(step, Item):
                    yield step.value
                    continue
                try:
                    steps.reply(await io.do(step))
                except Exception as exc:
                    steps.fail(exc)


class SyncResource:
    """A resource of `Client`: its `call` and `iterator` operations become methods here."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _methods_from_operations(cls, sync=True)


class AsyncResource:
    """A resource of `AsyncClient`: its operations become coroutine methods and async iterators."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _methods_from_operations(cls, sync=False)


class _Operation(Generic[P, T]):
    """A resource's operation: its method written once (its first parameter is the resource)."""

    def __init__(self, op: Callable[Concatenate[Any, P], Any]) -> None:
        self.op = op

    def method(self, sync: bool) -> Callable[..., Any]:
        raise NotImplementedError

    def returns(self, value: Any, sync: bool) -> Any:
        """What the method returns, given the operation's return annotation."""
        raise NotImplementedError


class call(_Operation[P, T]):
    """An operation whose value the method returns (awaitable on the async resource)."""

    def __init__(self, op: Callable[Concatenate[Any, P], Op[T]]) -> None:
        super().__init__(op)

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Self: ...
    @overload
    def __get__(self, obj: SyncResource, owner: type[Any] | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: AsyncResource, owner: type[Any] | None = None) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: object, owner: type[Any] | None = None) -> Any:
        return self  # only on the shared class: each resource class holds the method made from it

    def method(self, sync: bool) -> Callable[..., Any]:
        op = self.op
        if sync:

            def run(res: SyncResource, /, *args: Any, **kwargs: Any) -> Any:
                return res._c._run(op(res, *args, **kwargs))

            return run

        async def run_async(res: AsyncResource, /, *args: Any, **kwargs: Any) -> Any:
            return await res._c._run(op(res, *args, **kwargs))

        return run_async

    def returns(self, value: Any, sync: bool) -> Any:
        value = get_args(value)[2]  # Op[T] is Generator[Step, Any, T]: T (awaited, on the async resource)
        return None if value is type(None) else value


class iterator(_Operation[P, T]):
    """An operation whose `Item`s the method's iterator yields, sending its requests as it
    advances (an async iterator on the async resource)."""

    def __init__(self, op: Callable[Concatenate[Any, P], Pager[T]]) -> None:
        super().__init__(op)

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Self: ...
    @overload
    def __get__(self, obj: SyncResource, owner: type[Any] | None = None) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, obj: AsyncResource, owner: type[Any] | None = None) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, obj: object, owner: type[Any] | None = None) -> Any:
        return self

    def method(self, sync: bool) -> Callable[..., Any]:
        op = self.op

        def items(res: SyncResource | AsyncResource, /, *args: Any, **kwargs: Any) -> Any:
            return res._c._iterate(op(res, *args, **kwargs))  # arguments bound now, steps run as it advances

        return items

    def returns(self, value: Any, sync: bool) -> Any:
        # Pager[T] is Generator[Step | Item[T], Any, None]: Iterator[T] or AsyncIterator[T]
        item = next(get_args(t)[0] for t in get_args(get_args(value)[0]) if get_origin(t) is Item)
        returned: Any = Iterator if sync else AsyncIterator
        return returned[item]


def _methods_from_operations(cls: type[Any], sync: bool) -> None:
    """Set on `cls` a method for each operation it inherits, with the operation's name, doc and
    parameters, and what it returns to the caller."""
    for name in dir(cls):
        operation = inspect.getattr_static(cls, name)
        if not isinstance(operation, _Operation):
            continue
        method = operation.method(sync)
        signature = inspect.signature(operation.op, eval_str=True)
        signature = signature.replace(return_annotation=operation.returns(signature.return_annotation, sync))
        method.__name__ = name
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        method.__module__ = cls.__module__
        method.__doc__ = operation.op.__doc__
        method.__signature__ = signature  # type: ignore[attr-defined]
        method.__annotations__ = {
            p.name: p.annotation for p in signature.parameters.values() if p.annotation != p.empty
        }
        method.__annotations__["return"] = signature.return_annotation
        setattr(cls, name, method)
