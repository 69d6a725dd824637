"""The docs stay true: docs/cli.md is what `make docs` writes from the flags' declarations, it names
every flag the real `--help` prints, and every relative link and #anchor in the
README, ARCHITECTURE.md and docs/ leads somewhere. No engine, no server, no network.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from streamproxy import cli, docs_cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "tests" / "README.md", ROOT / "bench" / "README.md",
                *(ROOT / "docs").glob("*.md")])

# Written on another branch (vLLM's front-end flags and routes); links to it may land before it does.
PENDING = {ROOT / "docs" / "flags-and-routes.md"}

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def test_cli_page_is_what_make_docs_writes() -> None:
    assert docs_cli.TARGET.read_text() == docs_cli.render(), "docs/cli.md is stale: run `make docs`"


def test_check_mode_says_so_when_the_page_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "docs" / "cli.md"
    page.parent.mkdir()
    monkeypatch.setattr(docs_cli, "ROOT", tmp_path)
    monkeypatch.setattr(docs_cli, "TARGET", page)
    assert docs_cli.main(["--check"]) == 1
    assert capsys.readouterr().err == "docs/cli.md is stale: run `make docs`\n"
    assert docs_cli.main([]) == 0
    assert docs_cli.main(["--check"]) == 0


def test_the_page_shows_built_in_defaults_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROXY_PORT", "9999")
    monkeypatch.setenv("STREAMPROXY_SSE_HEARTBEAT", "3")
    assert docs_cli.render() == docs_cli.TARGET.read_text()


def _help_flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def test_the_page_names_every_flag_of_serve_help_without_vllm(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # `streamproxy serve --engine fake --help`, through the CLI's own parser (no engine is built).
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help at hyphens: no line breaks inside a flag
    with pytest.raises(SystemExit) as exit_:
        cli.build(["--engine", "fake", "--help"])
    assert exit_.value.code == 0
    flags = _help_flags(capsys.readouterr().out)
    assert {"--port", "--sse-heartbeat", "--fake-token-delay", "--model"} <= flags
    assert flags - {"--help"} <= _help_flags(docs_cli.TARGET.read_text())


def test_the_page_names_every_flag_of_gateway_help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)  # main() configures logging for a process
    monkeypatch.setenv("COLUMNS", "1000")
    cli.main(["gateway", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: streamproxy gateway --config FILE.yaml")
    flags = _help_flags(out)
    assert {"--port", "--admin-key", "--request-timeout"} <= flags
    assert flags - {"--help"} <= _help_flags(docs_cli.TARGET.read_text())


def test_the_page_has_the_cli_usage() -> None:
    assert cli.USAGE in docs_cli.TARGET.read_text()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", page.read_text()))
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return _LINK.findall(text)


def test_slugs_are_githubs() -> None:
    assert slug("Several API servers (`--api-server-count N`)") == "several-api-servers---api-server-count-n"
    assert slug("The engine's start and death") == "the-engines-start-and-death"
    assert slug("`streamproxy gateway`") == "streamproxy-gateway"


def test_the_link_reader_skips_code_and_sees_every_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n[d](w.md#h) ![img](i.png)\n")
    assert links(page) == ["x.md", "w.md#h"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if dest in PENDING and not dest.exists():
            continue
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert broken == []
