"""The labelled corpus of recorded agent runs, for the tests that read it.

It is evaluation data, not in the repository: ``TRIPWIRE_CORPUS``, else ``../shared/corpus``
next to the checkout. Without it the calling test skips, loudly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

CORPUS = Path(os.environ.get("TRIPWIRE_CORPUS") or Path(__file__).resolve().parents[2] / "shared" / "corpus")


def corpus_files() -> list[Path]:
    """Every labelled trace file of the corpus (OTLP/JSON), in ``labels.jsonl`` order."""
    labels = CORPUS / "labels.jsonl"
    if not labels.is_file():
        pytest.skip(f"SKIPPED LOUDLY: no labelled corpus at {CORPUS} (set TRIPWIRE_CORPUS); it is not in the repository")
    return [CORPUS / json.loads(line)["file"] for line in labels.read_text().splitlines() if line]
