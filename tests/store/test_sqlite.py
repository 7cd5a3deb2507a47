"""The SQLite idempotency store: atomic claims, and records that survive a process restart."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tripwire.store.base import Record
from tripwire.store.sqlite import SQLiteIdempotencyStore


def test_claim_complete_release(tmp_path: Path) -> None:
    store = SQLiteIdempotencyStore(tmp_path / "ops.db")
    assert store.claim("op-1") is None
    assert store.claim("op-1") == Record("pending")
    store.complete("op-1", b'{"id":1}')
    assert store.claim("op-1") == Record("done", b'{"id":1}')
    assert store.claim("op-2") is None
    store.release("op-2")
    assert store.claim("op-2") is None  # released: claimable again
    store.release("op-1")  # a done record is never released
    assert store.claim("op-1") == Record("done", b'{"id":1}')
    store.close()


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from tripwire.idempotency import idempotent
    from tripwire.store.sqlite import SQLiteIdempotencyStore

    db, log = sys.argv[1], sys.argv[2]

    @idempotent(SQLiteIdempotencyStore(db))
    def send_email(to, subject):
        with open(log, "a") as fh:
            fh.write(to + "\\n")
        return {"message_id": "m-" + to}

    result = send_email(to="a@example.com", subject="Your receipt")
    print(json.dumps({"status": result.status, "value": result.value}))
    """
)


def test_idempotency_survives_a_process_restart(tmp_path: Path) -> None:
    db, log = tmp_path / "ops.db", tmp_path / "sent.log"
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT)
    outputs = []
    for _ in range(2):  # two separate processes: the second is the "restarted" agent
        done = subprocess.run(
            [sys.executable, str(script), str(db), str(log)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert outputs[0] == '{"status": "executed", "value": {"message_id": "m-a@example.com"}}'
    assert outputs[1] == '{"status": "already_sent", "value": {"message_id": "m-a@example.com"}}'
    assert log.read_text() == "a@example.com\n"  # acted once
