"""A uid of its own for each sandbox that root starts (evaluator/sandbox.py, evaluator/python_tool.py).

RLIMIT_NPROC counts every process of a uid on the machine. When every sandbox ran as nobody they
shared one count: a tool call's fork bomb, held at its limit until its timeout, left every other
job's tool calls and graders on the machine unable to fork. Each sandbox now takes a uid from
FIRST_UID .. FIRST_UID + UIDS - 1 that no account names and no other sandbox here holds, and drops to
it; its processes count against it alone. Isolate (the IOI's sandbox) does the same: box N runs as
uid 60000 + N. A uid is held by a lock on a file of its own (LOCK_DIR), which the kernel lets go when
its holder ends, however it ends."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

FIRST_UID = 60000  # Debian keeps 60000-64999 for no account; under 65536, so a container's user namespace maps them
UIDS = 4096
NOBODY = 65534  # where every uid of the range is held (or the lock directory is not ours): the count shared
BOX_USER = f"a uid of its own ({FIRST_UID}-{FIRST_UID + UIDS - 1}), never root"  # Isolation.user
LOCK_DIR = Path(tempfile.gettempdir()) / "mathrl-sandbox-uids"


def _lock_dir() -> Path | None:
    """LOCK_DIR, made ours and private: None where something else already holds that name."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(LOCK_DIR, 0o700)
    st = os.lstat(LOCK_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return LOCK_DIR


def _account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@contextlib.contextmanager
def box_uid() -> Iterator[int]:
    """A uid for one sandbox, held until the block ends. Starts at a random place in the range, so
    machines whose sandboxes cannot see each other's locks (containers, each /tmp its own) seldom meet."""
    where = _lock_dir()
    start = random.randrange(UIDS)
    for i in range(UIDS):
        uid = FIRST_UID + (start + i) % UIDS
        if _account(uid):
            continue
        if where is None:
            yield uid
            return
        fd = os.open(where / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # the lock goes with it
        return
    yield NOBODY
