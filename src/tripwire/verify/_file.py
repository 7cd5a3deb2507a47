"""File / object verifier: the file exists, has the right type and size, hash or schema."""

from __future__ import annotations

import hashlib
import json
import mimetypes
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tripwire.core.receipt import OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify._common import (
    DEFAULT_TIMEOUT_S,
    Clock,
    Deadline,
    Finding,
    check_timeout,
    require,
    run_check,
)

__all__ = ["FileCheck"]

_MAGIC: Final[tuple[tuple[bytes, str], ...]] = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
)
_MAGIC_TYPES: Final = frozenset(mime for _, mime in _MAGIC)
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_CHUNK: Final = 1 << 20
_MAX_JSON_BYTES: Final = 64 << 20


def _base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_json_type(content_type: str | None) -> bool:
    return content_type is not None and (
        content_type == "application/json" or content_type.endswith("+json")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FileCheck:
    """Check that a file exists and is what the run was supposed to produce.

    Every expectation is optional (``None`` = not checked); existence is always checked.
    The content type is read from the bytes for the types that have a signature (PDF, PNG,
    JPEG, GIF, ZIP, gzip), so an HTML error page saved as ``invoice.pdf`` fails a
    ``content_type="application/pdf"`` check; other types come from the file name, and JSON
    must also parse. Example::

        FileCheck(path="out/invoice-0042.pdf", content_type="application/pdf", min_size=1024)()
    """

    path: str | os.PathLike[str]
    """The file to check (a local path; mount object stores, or use ``CustomCheck``)."""
    content_type: str | None = None
    """Expected MIME type, e.g. ``"application/pdf"`` (parameters like charset are ignored)."""
    min_size: int | None = None
    """Minimum size in bytes."""
    sha256: str | None = None
    """Expected SHA-256 of the content, lowercase hex."""
    json_schema: Mapping[str, Any] | None = field(default=None, hash=False)
    """A JSON Schema the file's JSON content must satisfy (needs ``tripwire[verify]``)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Time budget of the whole check, in seconds."""
    clock: Clock = time.time
    """Where ``checked_at`` comes from."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise ConfigError("FileCheck.path", self.path, "a non-empty path")
        if self.content_type is not None:
            if not isinstance(self.content_type, str) or "/" not in self.content_type:
                raise ConfigError(
                    "FileCheck.content_type", self.content_type, "a MIME type like 'text/csv'"
                )
            object.__setattr__(self, "content_type", _base_type(self.content_type))
        if self.min_size is not None and (
            isinstance(self.min_size, bool)
            or not isinstance(self.min_size, int)
            or self.min_size < 0
        ):
            raise ConfigError("FileCheck.min_size", self.min_size, "an integer >= 0 (bytes)")
        if self.sha256 is not None:
            digest = self.sha256.lower() if isinstance(self.sha256, str) else self.sha256
            if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
                raise ConfigError("FileCheck.sha256", self.sha256, "64 hex digits")
            object.__setattr__(self, "sha256", digest)
        if self.json_schema is not None:
            jsonschema = require("jsonschema")
            try:
                jsonschema.validators.validator_for(self.json_schema).check_schema(self.json_schema)
            except jsonschema.exceptions.SchemaError as exc:
                raise ConfigError(
                    "FileCheck.json_schema", exc.message[:200], "a valid JSON Schema"
                ) from None
        check_timeout("FileCheck", self.timeout_s)

    def _expected(self) -> dict[str, Scalar]:
        expected: dict[str, Scalar] = {"exists": True}
        if self.content_type is not None:
            expected["content_type"] = self.content_type
        if self.min_size is not None:
            expected["min_size"] = self.min_size
        if self.sha256 is not None:
            expected["sha256"] = self.sha256
        if self.json_schema is not None:
            expected["schema_valid"] = True
        return expected

    def __call__(self) -> OutcomeReceipt:
        """Check the file now; never raises (see :class:`~tripwire.verify.Verifier`)."""
        return run_check(
            kind=VerifierKind.FILE,
            target=str(self.path),
            checked_by="tripwire.verify.file",
            expected=self._expected(),
            timeout_s=self.timeout_s,
            clock=self.clock,
            body=self._check,
        )

    def _check(self, deadline: Deadline) -> Finding:
        path = Path(self.path)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "does not exist"
            return Finding(False, {"exists": False, "detail": what})
        observed: dict[str, Scalar] = {"exists": True}
        passed = True
        size = path.stat().st_size
        observed["size"] = size
        if self.min_size is not None and size < self.min_size:
            passed = False
        if self.sha256 is not None:
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(_CHUNK), b""):
                    deadline.check()  # a timed-out check stops hashing
                    digest.update(chunk)
            observed["sha256"] = digest.hexdigest()
            passed = passed and observed["sha256"] == self.sha256
        needs_json = self.json_schema is not None or _is_json_type(self.content_type)
        document: Any = None
        parsed = False
        if needs_json and size <= _MAX_JSON_BYTES:
            try:
                document = json.loads(path.read_bytes())
                parsed = True
            except (ValueError, UnicodeDecodeError):
                parsed = False
        if self.content_type is not None:
            observed["content_type"] = self._content_type(path, parsed)
            passed = passed and observed["content_type"] == self.content_type
        if self.json_schema is not None:
            valid, where = self._validate(document, parsed, size)
            observed["schema_valid"] = valid
            if where:
                observed["schema_error"] = where
            passed = passed and valid
        return Finding(passed, observed)

    def _content_type(self, path: Path, parsed_json: bool) -> str:
        with path.open("rb") as handle:
            head = handle.read(16)
        for magic, mime in _MAGIC:
            if head.startswith(magic):
                guess = mimetypes.guess_type(path.name)[0]
                # ZIP containers (docx, xlsx, epub...) keep the type their name says.
                if mime == "application/zip" and guess and guess not in _MAGIC_TYPES:
                    return guess
                return mime
        guess = mimetypes.guess_type(path.name)[0]
        if guess in _MAGIC_TYPES:
            return "application/octet-stream"  # the name claims a type the bytes do not show
        if _is_json_type(self.content_type) or _is_json_type(guess):
            if not parsed_json:
                return "application/octet-stream"
            if self.content_type is not None and _is_json_type(self.content_type):
                return self.content_type
            return "application/json"
        return guess or "application/octet-stream"

    def _validate(self, document: Any, parsed: bool, size: int) -> tuple[bool, str | None]:
        if size > _MAX_JSON_BYTES:
            return False, f"file larger than {_MAX_JSON_BYTES} bytes; not validated"
        if not parsed:
            return False, "not valid JSON"
        jsonschema = require("jsonschema")
        validator = jsonschema.validators.validator_for(self.json_schema)(self.json_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
        if error is None:
            return True, None
        # Name where and which rule failed, never the offending value (it is file content).
        return False, f"at {error.json_path}: failed {error.validator!r}"
