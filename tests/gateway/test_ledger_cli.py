"""`streamproxy usage`: the ledger's sums as a table (exact text) or as GET /v1/usage's JSON, from the
store `--ledger` names or the gateway config's `ledger:`; bad flags and an unreachable ledger are
one-line errors."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time

import pytest

from harness.process import ROOT
from streamproxy.ledger.records import LedgerRecord
from streamproxy.ledger.store import open_store
from streamproxy.ledger.usage_cli import main

NOW = time.time()


def rec(i: int, deployment: str, key: str, prompt: int, completion: int, hours_ago: float) -> LedgerRecord:
    return LedgerRecord(ts_us=int((NOW - hours_ago * 3600) * 1_000_000), request_id=f"r{i}", deployment=deployment, replica=None,
                        key_id=key, route="/v1/chat/completions", status=200, prompt_tokens=prompt, cached_prompt_tokens=1,
                        completion_tokens=completion, duration_ms=1.0)


RECORDS = [
    rec(1, "support-bot", "team-a", 100, 10, 1),
    rec(2, "support-bot", "team-b", 2000, 300, 2),
    rec(3, "smol", "team-a", 5, 7, 3),
    rec(4, "smol", "team-a", 1, 1, 24 * 10),  # ten days ago: outside --since 7d
]


@pytest.fixture
def ledger(tmp_path) -> str:
    url = f"sqlite://{tmp_path}/ledger.db"

    async def fill() -> None:
        store = await open_store(url)
        await store.write(RECORDS)
        await store.close()

    asyncio.run(fill())
    return url


def run(*argv: str) -> str:
    out = io.StringIO()
    assert main(list(argv), out) == 0
    return out.getvalue()


def test_by_key_over_the_last_seven_days_as_a_table(ledger):
    assert run("--since", "7d", "--by", "key", "--ledger", ledger) == (
        "key     requests  prompt  cached  completion  total\n"
        "team-a         2     105       2          17    122\n"
        "team-b         1    2000       1         300   2300\n"
        "------  --------  ------  ------  ----------  -----\n"
        "total          3    2105       3         317   2422\n"
    )


def test_by_deployment_and_key_from_the_gateway_config_and_as_json(ledger, tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text(f"ledger: {ledger}\ndeployments: []\n")
    text = run("--since", "30d", "--by", "deployment,key", "--config", str(config))
    assert text.splitlines()[1:4] == [
        "smol         team-a         2       6       2           8     14",
        "support-bot  team-a         1     100       1          10    110",
        "support-bot  team-b         1    2000       1         300   2300",
    ]
    report = json.loads(run("--since", "7d", "--by", "", "--deployment", "smol", "--json", "--ledger", ledger))
    assert [(r["requests"], r["total_tokens"]) for r in report["data"]] == [(1, 12)]
    assert report["group_by"] == [] and report["object"] == "list"


def test_bad_flags_and_an_unreachable_ledger_are_one_line_errors(ledger, tmp_path):
    with pytest.raises(SystemExit, match="--since must be a duration like 7d, 12h, 30m or 90s, not 'week'"):
        run("--since", "week", "--ledger", ledger)
    with pytest.raises(SystemExit, match="--by takes deployment, key, day and month"):
        run("--by", "model", "--ledger", ledger)
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(SystemExit, match=r"cannot read the ledger at sqlite://.*dir\.db"):
        run("--ledger", f"sqlite://{tmp_path}/dir.db")


def test_the_command_line_entry_point(ledger):
    done = subprocess.run([sys.executable, "-m", "streamproxy", "usage", "--since", "7d", "--by", "key", "--ledger", ledger],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "total          3    2105       3         317   2422"
