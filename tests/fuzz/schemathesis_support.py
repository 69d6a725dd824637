"""What serve's and the gateway's schemathesis tests share: the replica's flags, the checks, the schema.

    FLAGS      `serve --engine fake` flags: tools (hermes) and reasoning (qwen3) on, a short context
    CHECKS     never a 5xx, the status and content type documented, a JSON answer fitting its schema
               (`negative_data_rejection` is added for negative data)
    Document   GET /openapi.json of a live server, loaded by schemathesis, and a session to call it;
               `case(data, method, path, mode)` draws a request from the operation's schema,
               `call(case, mode)` sends it and runs the checks on its answer (the status)
    ErrorLog   the ERROR lines and tracebacks in a folder of server logs, as they grow
"""

from __future__ import annotations

from pathlib import Path

import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

FLAGS = (
    "--fake-text", "Hi there. ", "--fake-max-model-len", "512",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


class Document:
    def __init__(self, base: str) -> None:
        self.base = base
        self.schema = schemathesis.openapi.from_url(base + "/openapi.json")
        self.session = requests.Session()

    def case(self, data: st.DataObject, method: str, path: str, mode: GenerationMode) -> Case:
        """A request for the operation, drawn from its own schema."""
        return data.draw(self.schema[path][method].as_strategy(generation_mode=mode))

    def call(self, case: Case, mode: GenerationMode) -> int:
        response = case.call(base_url=self.base, session=self.session, timeout=60)
        checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
        case.validate_response(response, checks=checks)
        return response.status_code


class ErrorLog:
    """`new()`: the lines logged at ERROR or CRITICAL, and tracebacks, since the last call (every file in `folder`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.read: dict[Path, int] = {}

    def new(self) -> list[str]:
        found = []
        for path in sorted(self.folder.iterdir()):
            with open(path, "rb") as f:
                f.seek(self.read.get(path, 0))
                text = f.read()
                self.read[path] = f.tell()
            found += [f"{path.name}: {line}" for line in text.decode(errors="replace").splitlines()
                      if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")]
        return found
