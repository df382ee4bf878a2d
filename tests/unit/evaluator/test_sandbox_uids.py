"""Each sandbox's own uid (evaluator/sandbox_uids.py): never one that another sandbox on this machine
holds, nor an account's or a group's, and free again once its sandbox ends, whatever it forked."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path

import pytest

from evaluator import sandbox_uids

pytestmark = [
    pytest.mark.quick,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a sandbox a uid of its own (else bwrap's nobody)"),
]


def test_sandboxes_hold_distinct_uids_that_no_account_names_and_give_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_uids, "LOCK_DIR", tmp_path / "uids")
    names = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    first = next(a for a in sorted(names) if a + 1 not in names and a + 2 not in names)  # a name, two free
    monkeypatch.setattr(sandbox_uids, "FIRST_UID", first)
    monkeypatch.setattr(sandbox_uids, "UIDS", 3)
    for _ in range(10):  # each starts at a random place in the range
        with sandbox_uids.box_uid() as a, sandbox_uids.box_uid() as b:
            assert {a, b} == {first + 1, first + 2}, (first, a, b)
    monkeypatch.setattr(sandbox_uids, "FIRST_UID", 61000)
    monkeypatch.setattr(sandbox_uids, "UIDS", 1)
    with sandbox_uids.box_uid() as one, sandbox_uids.box_uid() as none_left:
        assert (one, none_left) == (61000, sandbox_uids.NOBODY)  # every uid held: the shared count, as before
    with sandbox_uids.box_uid() as back:
        assert back == 61000  # given back when its holder ended


def test_a_lock_directory_that_is_not_ours_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_to_all = tmp_path / "uids"
    open_to_all.mkdir(mode=0o777)
    open_to_all.chmod(0o777)  # anyone could hold (or fake) a lock there
    monkeypatch.setattr(sandbox_uids, "LOCK_DIR", open_to_all)
    assert sandbox_uids._lock_dir() is None
    monkeypatch.setattr(sandbox_uids, "FIRST_UID", 61000)
    monkeypatch.setattr(sandbox_uids, "UIDS", 1)
    with sandbox_uids.box_uid() as uid:
        assert uid == 61000 and not list(open_to_all.iterdir())


def test_a_forked_child_does_not_keep_a_sandboxs_uid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flock belongs to the open file, which a fork shares: a job process's forked workers (a data
    loader's) kept its sandbox's uid held for as long as they lived. A child closes its copies."""
    monkeypatch.setattr(sandbox_uids, "LOCK_DIR", tmp_path / "uids")
    monkeypatch.setattr(sandbox_uids, "FIRST_UID", 61000)
    monkeypatch.setattr(sandbox_uids, "UIDS", 1)
    r, w = os.pipe()
    started_r, started_w = os.pipe()
    with sandbox_uids.box_uid() as uid:
        pid = os.fork()
        if pid == 0:  # lives past the sandbox's end
            os.write(started_w, b"x")
            os.read(r, 1)
            os._exit(0)
        os.read(started_r, 1)  # the child runs (its fork handlers ran before fork returned there)
    try:
        with sandbox_uids.box_uid() as again:
            assert (uid, again) == (61000, 61000)
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
