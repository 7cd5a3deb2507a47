"""FileCheck against real files in tmp_path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tripwire.core.receipt import Evidence, VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify import FileCheck

T0 = 1_700_000_000.0
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2 "abc"
PDF = b"%PDF-1.7\n" + b"0" * 2000 + b"\n%%EOF\n"


def clock() -> float:
    return T0


def test_existing_pdf_with_type_and_size_passes(tmp_path: Path) -> None:
    path = tmp_path / "invoice-0042.pdf"
    path.write_bytes(PDF)
    receipt = FileCheck(path=path, content_type="application/pdf", min_size=1024, clock=clock)()
    assert receipt.passed is True
    assert receipt.error is None
    assert receipt.kind is VerifierKind.FILE
    assert receipt.evidence is Evidence.INDEPENDENT
    assert receipt.checked_at == T0
    assert receipt.target == str(path)
    assert receipt.observed == {
        "exists": True,
        "size": 2016,
        "content_type": "application/pdf",
    }
    assert receipt.expected == {
        "exists": True,
        "content_type": "application/pdf",
        "min_size": 1024,
    }


def test_missing_file_fails_without_error(tmp_path: Path) -> None:
    receipt = FileCheck(path=tmp_path / "nope.pdf", clock=clock)()
    assert receipt.passed is False
    assert receipt.error is None
    assert receipt.observed["exists"] is False


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    receipt = FileCheck(path=tmp_path, clock=clock)()
    assert receipt.passed is False
    assert receipt.observed["exists"] is False


def test_html_error_page_saved_as_pdf_fails_the_type_check(tmp_path: Path) -> None:
    path = tmp_path / "invoice.pdf"
    path.write_bytes(b"<html><body>502 Bad Gateway</body></html>" * 50)
    receipt = FileCheck(path=path, content_type="application/pdf", clock=clock)()
    assert receipt.passed is False
    assert receipt.observed["content_type"] == "application/octet-stream"


def test_too_small_fails(tmp_path: Path) -> None:
    path = tmp_path / "report.csv"
    path.write_text("a,b\n")
    receipt = FileCheck(path=path, min_size=100, content_type="text/csv", clock=clock)()
    assert receipt.passed is False
    assert receipt.observed["size"] == 4
    assert receipt.observed["content_type"] == "text/csv"


def test_sha256_match_and_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_bytes(b"abc")
    ok = FileCheck(path=path, sha256=ABC_SHA256.upper(), clock=clock)()
    assert ok.passed is True
    assert ok.observed["sha256"] == ABC_SHA256
    path.write_bytes(b"abd")
    bad = FileCheck(path=path, sha256=ABC_SHA256, clock=clock)()
    assert bad.passed is False
    assert bad.observed["sha256"] != ABC_SHA256


SCHEMA = {
    "type": "object",
    "required": ["invoice", "total"],
    "properties": {"invoice": {"type": "string"}, "total": {"type": "number"}},
}


def test_json_schema_valid(tmp_path: Path) -> None:
    path = tmp_path / "invoice.json"
    path.write_text(json.dumps({"invoice": "INV-0042", "total": 120.5}))
    receipt = FileCheck(
        path=path, json_schema=SCHEMA, content_type="application/json", clock=clock
    )()
    assert receipt.passed is True
    assert receipt.observed["schema_valid"] is True
    assert receipt.observed["content_type"] == "application/json"


def test_json_schema_violation_names_the_path_not_the_value(tmp_path: Path) -> None:
    path = tmp_path / "invoice.json"
    path.write_text(json.dumps({"invoice": "INV-0042", "total": "secret-amount"}))
    receipt = FileCheck(path=path, json_schema=SCHEMA, clock=clock)()
    assert receipt.passed is False
    assert receipt.observed["schema_valid"] is False
    assert receipt.observed["schema_error"] == "at $.total: failed 'type'"
    assert "secret-amount" not in json.dumps(receipt.to_dict())


def test_invalid_json_fails_schema_and_type(tmp_path: Path) -> None:
    path = tmp_path / "invoice.json"
    path.write_text("{not json")
    receipt = FileCheck(
        path=path, json_schema=SCHEMA, content_type="application/json", clock=clock
    )()
    assert receipt.passed is False
    assert receipt.observed["schema_valid"] is False
    assert receipt.observed["content_type"] == "application/octet-stream"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sha256": "xyz"}, "FileCheck.sha256"),
        ({"min_size": -1}, "FileCheck.min_size"),
        ({"content_type": "pdf"}, "FileCheck.content_type"),
        ({"json_schema": {"type": "no-such-type"}}, "FileCheck.json_schema"),
        ({"timeout_s": 0}, "FileCheck.timeout_s"),
    ],
)
def test_bad_settings_fail_at_construction(
    tmp_path: Path, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        FileCheck(path=tmp_path / "x", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_missing_jsonschema_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # makes `import jsonschema` fail
    with pytest.raises(ModuleNotFoundError) as info:
        FileCheck(path=tmp_path / "x.json", json_schema=SCHEMA)
    assert "pip install 'tripwire[verify]'" in str(info.value)


def test_a_timed_out_sha256_check_stops_hashing(tmp_path: Path) -> None:
    import threading

    big = tmp_path / "huge.bin"
    with big.open("wb") as handle:
        handle.truncate(64 << 30)  # 64 GiB, sparse: reading it takes far longer than 0.2 s
    before = {t for t in threading.enumerate() if t.name == "tripwire-verify-file"}
    receipt = FileCheck(path=big, sha256="0" * 64, timeout_s=0.2)()
    assert receipt.passed is False
    assert receipt.error == "timed out after 0.2 s"
    left = {t for t in threading.enumerate() if t.name == "tripwire-verify-file"} - before
    assert {t for t in left if t.is_alive()} == set()
