"""A uid of its own for each sandbox that root starts (evaluator/sandbox.py, evaluator/python_tool.py).

RLIMIT_NPROC counts every process of a uid on the machine: when every sandbox ran as nobody, one
tool call's fork bomb left every other sandbox on the machine unable to fork. Each sandbox now
takes a uid in FIRST_UID .. FIRST_UID + UIDS - 1 that no account or group names and no other
sandbox here holds, as isolate (the IOI's sandbox) does: box N runs as uid 60000 + N. A uid is
held by a lock on a file of its own in LOCK_DIR, which the kernel lets go when its holder ends."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import logging
import os
import pwd
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# above the accounts a machine makes (1000-59999), under systemd's DynamicUser uids (61184-65519, which
# no passwd file may name), and under 65536, so a container's user namespace maps them
FIRST_UID = 60000
UIDS = 1184
NOBODY = 65534  # where every uid of the range is held: the count shared, as before
BOX_USER = f"a uid of its own ({FIRST_UID}-{FIRST_UID + UIDS - 1}), never root"  # Isolation.user
# root's own run directory where there is one (never aged like /tmp, and no other user can make the name
# first), else the temporary directory's
LOCK_DIR = Path("/run/mathrl-sandbox-uids" if os.path.isdir("/run") else tempfile.gettempdir() + "/mathrl-sandbox-uids")
_held: set[int] = set()  # the lock files this process holds: a forked child closes its copies


def _close_held_in_child() -> None:
    # a plain fork (a data loader's workers) would hold the locks for as long as it lives
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


def _lock_dir() -> int | None:
    """LOCK_DIR opened (a directory fd: its files are opened by name in it, so nothing can swap it
    between the check and the open), made ours and private; None where it is not ours."""
    with contextlib.suppress(OSError):  # there already, or not to be made (a read-only /run): the open says
        os.mkdir(LOCK_DIR, 0o700)
    try:
        fd = os.open(LOCK_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("sandbox uids: %s cannot be opened (%s): each sandbox's uid is taken unlocked", LOCK_DIR, exc)
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        log.warning("sandbox uids: %s is not this user's alone: each sandbox's uid is taken unlocked", LOCK_DIR)
        return None
    return fd


def _named(uid: int) -> bool:
    """Whether an account or a group has this number (the sandbox's gid is its uid)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


@contextlib.contextmanager
def box_uid() -> Iterator[int | None]:
    """A uid for one sandbox, held until the block ends; None where this process is not root (then
    bubblewrap's user namespace sees the sandbox as nobody, and there is no uid to give). Starts at a
    random place in the range, so machines whose sandboxes cannot see each other's locks (containers,
    each /run its own) seldom meet; where LOCK_DIR is not ours, a random free-of-accounts uid, unlocked."""
    if os.geteuid() != 0:
        yield None
        return
    where = _lock_dir()
    try:
        start = random.randrange(UIDS)
        for i in range(UIDS):
            uid = FIRST_UID + (start + i) % UIDS
            if _named(uid):
                continue
            if where is None:
                yield uid
                return
            fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=where)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _held.add(fd)
            try:
                yield uid
            finally:
                _held.discard(fd)
                os.close(fd)  # the lock goes with it
            return
        yield NOBODY
    finally:
        if where is not None:
            os.close(where)
