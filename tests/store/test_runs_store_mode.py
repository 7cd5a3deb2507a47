"""The embedded SQLite store is private to its owner."""

from __future__ import annotations

import stat
from pathlib import Path

from tripwire.store.runs import RunStore


def test_a_new_sqlite_store_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = RunStore.open(f"sqlite:///{path}")
    try:
        store.ping()
        for p in tmp_path.iterdir():  # the database and its -wal / -shm files
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name
    finally:
        store.dispose()


def test_an_existing_file_keeps_the_mode_its_owner_gave_it(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.touch(mode=0o640)
    path.chmod(0o640)
    store = RunStore.open(f"sqlite:///{path}")
    store.dispose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
