"""Engines and sessions. One engine per URL per process."""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from mathrl.errors import UNSTORABLE as UNSTORABLE  # raised here; its callers import them from here
from mathrl.errors import nul_pointer
from store.errors import Unstorable as Unstorable

T = TypeVar("T")
log = logging.getLogger("mathrl.db")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cur.execute("PRAGMA busy_timeout=30000")  # API, worker and job process share the file
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _finite(value: Any) -> Any:
    """`value` with every NaN and infinity (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_serializer(value: Any) -> str:
    """How every JSON column is written, by every route and every worker (the store's one check):
    NaN and infinities become null (PostgreSQL refuses them, 'Token "NaN" is invalid', where
    SQLite stores them, so an event carrying an undefined metric failed its job on one store and
    not the other), and a NUL character anywhere is refused (Unstorable) before it is stored."""
    text = json.dumps(_finite(value))
    if "\\u0000" in text and (where := nul_pointer(value)) is not None:
        raise Unstorable(where)
    return text


def _refuse_nul_strings(session: Session, _context: Any, _instances: Any) -> None:
    """The same check for the text columns of every row a session writes (a key's name, a job's
    name): PostgreSQL refuses a NUL there, SQLite would store it."""
    from sqlalchemy import inspect

    for row in (*session.new, *session.dirty):
        for attr in inspect(row).mapper.column_attrs:
            value = getattr(row, attr.key, None)
            if isinstance(value, str) and "\x00" in value:
                raise Unstorable(f"/{attr.key}")


event.listen(Session, "before_flush", _refuse_nul_strings)


def _refuse_nul_parameters(
    _conn: Any, _cursor: Any, _statement: str, parameters: Any, context: Any, _executemany: bool
) -> None:
    """The same check for what no ORM flush sees: the statements a job's sink sends itself (its
    samples' prompts and completions, a batch's lines). Before, a NUL from an uploaded file reached
    PostgreSQL, which refused it after the job's work was done, and the job's error showed the
    statement and its parameters."""
    rows = parameters if isinstance(parameters, list) else [parameters]
    for row in rows:
        values = row.items() if isinstance(row, dict) else enumerate(row or ())
        for name, value in values:
            if isinstance(value, str) and "\x00" in value:
                if isinstance(name, int):
                    names = getattr(getattr(context, "compiled", None), "positiontup", None) or []
                    name = names[name] if name < len(names) else f"parameter {name}"
                raise Unstorable("/" + re.sub(r"(__|_m)\d+$", "", str(name)))


def error_text(exc: BaseException) -> str:
    """What `exc` says, in words, for a job's error or a log a user reads: a database error without
    the statement, its parameters (other values of the rows written) or SQLAlchemy's help link."""
    text = str(exc)
    if isinstance(exc, StatementError):  # the driver's first line: PostgreSQL's next ones quote the statement
        return (text.strip().splitlines() or [type(exc).__name__])[0]
    for tail in ("\n[SQL:", "\n[parameters:", "\n(Background on this error"):
        text = text.split(tail, 1)[0]
    return text.strip()


@lru_cache(maxsize=8)
def get_engine(url: str, echo: bool = False) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, echo=echo, json_serializer=json_serializer, connect_args={"timeout": 30, "check_same_thread": False}
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "before_cursor_execute", _refuse_nul_parameters)
        return engine
    # connect_timeout: an unreachable server fails a request in seconds instead of hanging it
    engine = create_engine(
        url,
        echo=echo,
        json_serializer=json_serializer,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        connect_args={"connect_timeout": 5},
    )
    event.listen(engine, "before_cursor_execute", _refuse_nul_parameters)
    return engine


@lru_cache(maxsize=8)
def get_sessionmaker(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = get_sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def is_transient(exc: BaseException) -> bool:
    """The database is down or the connection dropped: the same write may succeed later.
    (A constraint violation or a bad query is not transient.)"""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def retry_transient(fn: Callable[[], T], what: str, give_up_after: float = 300.0, max_wait: float = 2.0) -> T:
    """Run `fn` (one whole transaction) until it succeeds, riding out a database outage with
    a bounded backoff (0.1 s doubling to `max_wait`). Raises the last error after
    `give_up_after` seconds, or at once for an error that is not transient."""
    deadline = time.monotonic() + give_up_after
    wait = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + wait > deadline:
                raise
            log.warning("%s: database unavailable (%s); retrying in %.1fs", what, type(exc).__name__, wait)
            time.sleep(wait)
            wait = min(wait * 2, max_wait)
