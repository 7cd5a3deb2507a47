"""The command line's own output: one that cannot be written ends the command with a line on
standard error, never a traceback (a real process, its standard output a full device or a pipe
closed early)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MAIN = "from tripwire.cli import main; main()"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("args", [["demo"], ["--help"], ["replay", "--help"]])
def test_a_full_device_is_one_line_and_exit_1(args: list[str]) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", MAIN, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == "error: cannot write the output: No space left on device"


def test_a_reader_that_leaves_early_is_no_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)  # as `| head -c 10` does
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "Exception ignored" not in err, err
