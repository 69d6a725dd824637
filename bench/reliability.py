"""`make reliability`: storms, fuzzers, a mixed soak and the engine's death, summed up in one table.

Phases, in this order (`--skip` leaves some out):

1. storms: the serve edge's storm tests (tests/production: test_client_gone,
   test_limits, test_engine_death, test_client_timeouts: a thousand
   disconnects, clients vanishing at any point or never reading, engine-error
   storms, slowloris and stalled bodies, each ending back at its baseline;
   the fake engine dying under load) and the gateway's
   (`tests/gateway -m storm`), through pytest;
2. fuzz: `STREAMPROXY_FUZZ=long pytest tests/fuzz` when that folder exists
   (inputs tried: the tests' `inputs` properties, or Hypothesis's statistics);
3. soak: bench/soak.py's mixed load (streams, non-streams, completions,
   tools, engine errors, disconnects, slow readers, bad input, all at once)
   on a `streamproxy serve --engine fake` process for `--soak-minutes`
   (default $SOAK_MINUTES, else 30) after a warm-up (10% of it, 15-120 s).
   RSS and open fds of the server are taken idle after the warm-up and idle
   after the soak (the client's connections closed, nothing running): growth
   must stay under 5%. Sampled every 5 s in between for the JSON;
4. recovery (fake engine): a server under a minimal supervisor (restart on
   exit), a poison prompt kills its engine under 20 streams: fault -> /health
   503 -> exit 1 -> restarted and healthy, timed;
5. engine death (vLLM): tests/engine/test_engine_death.py (`kill -9` of the
   engine core under 50 streams + 10 non-streams); recovery there is its
   fault -> exit plus the cold start it measured (`--no-engine` skips it).

Prints one table and writes it with every detail to
bench/results/reliability-<time>.{md,json}; pytest's output and the servers'
logs go to bench/results/logs/. Exit status 1 when a bound is not met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Any

import aiohttp

from . import procstat
from .servers import RESULTS, ROOT, Server, fake_server, stop_on_signals
from .soak import Soak, Tally, server_args

GROWTH_BOUND = 0.05
GRACE = 2.0
STORMS_SERVE = [
    "tests/production/test_client_gone.py", "tests/production/test_limits.py", "tests/production/test_engine_death.py",
    "tests/production/test_client_timeouts.py",  # slowloris, stalled bodies, idle keep-alives, the connection cap
]
_METRIC = re.compile(rb"^(streamproxy_engine_requests|streamproxy_active_streams) (\S+)$", re.M)
# Hypothesis's statistics, old ("12 passing examples, 0 failing examples, 3 invalid examples") and
# new ("1500 passing, 0 failing, and 115 invalid test cases") wording.
_HYPOTHESIS = re.compile(r"(\d+) passing(?: examples?)?, (\d+) failing(?: examples?)?, (?:and )?(\d+) invalid (?:examples?|test cases)")


# -- pytest phases -------------------------------------------------------------------------------


def run_pytest(name: str, args: list[str], stamp: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    logs = RESULTS / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    xml, log = logs / f"reliability-{stamp}-{name}.xml", logs / f"reliability-{stamp}-{name}.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=legacy",
           f"--junitxml={xml}", *args]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    print(f"[{name}] {' '.join(cmd[3:])}", flush=True)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.run(cmd, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT).returncode
    result: dict[str, Any] = {"name": name, "returncode": code, "seconds": round(time.monotonic() - t0, 1), "log": str(log),
                              "tests": []}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else (
                "skipped" if case.find("skipped") is not None else "passed")
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            result["tests"].append({"name": case.get("name"), "file": case.get("classname"), "outcome": outcome,
                                    "seconds": float(case.get("time") or 0), "properties": props})
    for outcome in ("passed", "failed", "skipped"):
        result[outcome] = sum(t["outcome"] == outcome for t in result["tests"])
    # pytest: 0 all passed, 5 nothing collected (a marker with no tests); anything else failed.
    result["ok"] = code in (0, 5) and result["failed"] == 0
    print(f"[{name}] {result['passed']} passed, {result['failed']} failed, {result['skipped']} skipped "
          f"in {result['seconds']} s (exit {code})", flush=True)
    if name == "fuzz":
        text = log.read_text(errors="replace")
        tried = sum(int(a) + int(b) + int(c) for a, b, c in _HYPOTHESIS.findall(text))
        tried += sum(int(float(v)) for t in result["tests"] for k, v in t["properties"].items() if k in ("inputs", "inputs_tried") and v)
        result["inputs_tried"] = tried
    return result


def _property(result: dict[str, Any], test: str, name: str) -> float | None:
    for t in result.get("tests", []):
        if t["name"].startswith(test) and name in t["properties"]:
            return float(t["properties"][name])
    return None


# -- the server's numbers ------------------------------------------------------------------------


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _metrics(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(base + "/metrics") as resp:
        return {m.decode(): float(v) for m, v in _METRIC.findall(await resp.read())}


async def idle_snapshot(srv: Server, bound: float = 60.0) -> dict[str, Any]:
    """RSS and fds once nothing runs (the client's connections are closed by then) and a second has passed."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        deadline = time.monotonic() + bound
        while True:
            now = await _metrics(session, srv.base)
            if not any(now.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    return {"rss_bytes": procstat.rss_bytes(srv.pid), "fds": _fds(srv.pid), "still_running": now}


async def _sample(srv: Server, timeline: list[dict[str, Any]], t0: float) -> None:
    async with aiohttp.ClientSession() as session:
        while True:
            await asyncio.sleep(5.0)
            try:
                m = await _metrics(session, srv.base)
                timeline.append({"t": round(time.monotonic() - t0, 1), "rss_bytes": procstat.rss_bytes(srv.pid),
                                 "fds": _fds(srv.pid), "active_streams": m.get("streamproxy_active_streams", 0.0)})
            except (aiohttp.ClientError, OSError):
                pass


# -- soak ----------------------------------------------------------------------------------------


def _tally_dict(t: Tally) -> dict[str, Any]:
    return {"sent": dict(t.sent), "ok": dict(t.ok), "lost": dict(t.lost), "bad_input_5xx": t.bad_input_5xx,
            "bad_input_accepted": t.bad_input_accepted, "examples": t.examples}


async def soak_phase(minutes: float, concurrency: int, stamp: str) -> dict[str, Any]:
    srv = fake_server(server_args(), f"reliability-{stamp}-soak")
    srv.start()
    try:
        srv.wait_ready(60)
        seconds = minutes * 60
        warm = min(max(0.1 * seconds, 15.0), 120.0)
        print(f"[soak] warm-up {warm:.0f} s, then {seconds:.0f} s at {concurrency} clients", flush=True)
        warmup = await Soak(srv.base, srv.port).run(concurrency, warm, seed=1)
        before = await idle_snapshot(srv)
        timeline: list[dict[str, Any]] = []
        t0 = time.monotonic()
        sampler = asyncio.create_task(_sample(srv, timeline, t0))
        try:
            main = await Soak(srv.base, srv.port).run(concurrency, seconds, seed=2)
        finally:
            sampler.cancel()
        wall = time.monotonic() - t0
        after = await idle_snapshot(srv)
        alive = srv.proc.poll() is None
    finally:
        srv.stop()
    total = sum(main.sent.values())
    result = {
        "minutes": minutes, "warmup_s": warm, "concurrency": concurrency, "wall_s": round(wall, 1),
        "requests": total, "requests_per_s": round(total / wall, 1) if wall else 0.0,
        "peak_active_streams": max((s["active_streams"] for s in timeline), default=0.0),
        "warmup": _tally_dict(warmup), "main": _tally_dict(main), "idle_before": before, "idle_after": after,
        "rss_growth": (after["rss_bytes"] - before["rss_bytes"]) / before["rss_bytes"],
        "fd_growth": (after["fds"] - before["fds"]) / before["fds"], "server_alive": alive, "timeline": timeline,
        "log": str(srv.stdout_path),
    }
    print(f"[soak] {total} requests ({result['requests_per_s']}/s), lost {sum(main.lost.values())}, "
          f"RSS {result['rss_growth']:+.1%}, fds {result['fd_growth']:+.1%}", flush=True)
    return result


# -- recovery under a supervisor (fake engine) ---------------------------------------------------


async def recovery_phase(stamp: str, streams: int = 20) -> dict[str, Any]:
    crash = "poison-CRASH-prompt"
    srv = fake_server(["--fake-token-delay", "0.02", "--fake-crash-on", crash, "--engine-death-grace", str(GRACE),
                       "--access-log", "off"], f"reliability-{stamp}-recovery")
    srv.start()
    try:
        srv.wait_ready(60)
        url = srv.base + "/v1/chat/completions"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            started = 0

            async def stream(i: int) -> bytes:
                nonlocal started
                body = {"messages": [{"role": "user", "content": f"story {i}"}], "stream": True, "max_tokens": 2000}
                async with session.post(url, json=body) as resp:
                    got = await resp.content.readuntil(b"\n\n")
                    started += 1
                    return got + await resp.read()

            tasks = [asyncio.ensure_future(stream(i)) for i in range(streams)]
            while started < streams:
                await asyncio.sleep(0.02)
            t0 = time.monotonic()
            poison = asyncio.ensure_future(session.post(url, json={"messages": [{"role": "user", "content": crash}]}))
            unhealthy = await _until_health(session, srv.base, 503, t0)
            bodies = await asyncio.gather(*tasks)
            (await poison).release()
            ended_in_error = sum(b.rstrip().endswith(b"data: [DONE]") and b'"error"' in b for b in bodies)
            code = srv.proc.poll()
            while code is None and time.monotonic() - t0 < 30:
                await asyncio.sleep(0.02)
                code = srv.proc.poll()
            exited = time.monotonic() - t0
            srv.stdout_path = srv.stdout_path.with_name(srv.stdout_path.stem + "-restarted.log")
            srv.start()  # the supervisor: restart on exit, same command, same port
            healthy = await _until_health(session, srv.base, 200, t0)
            async with session.post(url, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}) as resp:
                served = resp.status == 200
    finally:
        srv.stop()
    result = {"streams": streams, "streams_ended_with_error": ended_in_error, "unhealthy_after": unhealthy,
              "exit_code": code, "exit_after": exited, "recovered_after": healthy, "served_after_restart": served}
    result["ok"] = (ended_in_error == streams and code == 1 and exited < GRACE + 5 and served)
    print(f"[recovery] /health 503 after {unhealthy:.3f} s, exit {code} after {exited:.2f} s, "
          f"healthy again after {healthy:.2f} s", flush=True)
    return result


async def _until_health(session: aiohttp.ClientSession, base: str, status: int, t0: float, bound: float = 60.0) -> float:
    while time.monotonic() - t0 < bound:
        try:
            async with session.get(base + "/health") as resp:
                if resp.status == status:
                    return time.monotonic() - t0
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.02)
    return float("inf")


# -- the table -----------------------------------------------------------------------------------


def table(r: dict[str, Any]) -> tuple[list[tuple[str, str, str, bool | None]], bool]:
    """Rows of (what, measured, bound, ok) and whether every bound held."""
    rows: list[tuple[str, str, str, bool | None]] = []
    soak, storms, fuzz = r.get("soak"), r.get("storms", []), r.get("fuzz")
    rec, eng = r.get("recovery"), r.get("engine_death")
    if soak:
        rows.append(("load held (soak, fake engine)",
                     f"{soak['concurrency']} clients, up to {soak['peak_active_streams']:.0f} streams at once, "
                     f"{soak['requests_per_s']} req/s for {soak['wall_s'] / 60:.1f} min", "-", None))
    faults = []
    if soak:
        ok = {**soak["warmup"]["ok"]}
        for k, v in soak["main"]["ok"].items():
            ok[k] = ok.get(k, 0) + v
        faults.append(", ".join(f"{k.replace('_', ' ')} {ok.get(k, 0)}" for k in ("engine_error", "disconnect", "slow_reader", "bad_input")))
    storm_total = sum(s["passed"] + s["failed"] for s in storms)
    if storms:
        faults.append(f"storm scenarios {sum(s['passed'] for s in storms)}/{storm_total}")
    deaths = [x for x in (rec, eng) if x]
    if deaths:
        faults.append(f"engine deaths {sum(bool(x['ok']) for x in deaths)}/{len(deaths)}")
    storms_ok = all(s["ok"] for s in storms)
    rows.append(("faults survived", "; ".join(faults) or "-", "all", storms_ok and all(x["ok"] for x in deaths)))
    inputs = []
    if fuzz:
        inputs.append(f"fuzz {fuzz.get('inputs_tried') or 'n/a'} ({fuzz['passed']}/{fuzz['passed'] + fuzz['failed']} fuzz tests passed)")
    elif "fuzz_skipped" in r:
        inputs.append(f"fuzz not run ({r['fuzz_skipped']})")
    if soak:
        inputs.append(f"bad input in the soak {soak['warmup']['sent'].get('bad_input', 0) + soak['main']['sent'].get('bad_input', 0)}")
    rows.append(("inputs tried", "; ".join(inputs) or "-", "-", None if not fuzz else fuzz["ok"]))
    if soak:
        lost = sum(soak["warmup"]["lost"].values()) + sum(soak["main"]["lost"].values())
        sent = sum(soak["warmup"]["sent"].values()) + sum(soak["main"]["sent"].values())
        rows.append(("requests lost", f"{lost} of {sent}", "0", lost == 0 and soak["server_alive"]))
        bad5 = soak["warmup"]["bad_input_5xx"] + soak["main"]["bad_input_5xx"]
        rows.append(("5xx for bad input", f"{bad5}" + (" (+ fuzz: see its failures)" if fuzz and not fuzz["ok"] else ""), "0", bad5 == 0))
        b, a = soak["idle_before"], soak["idle_after"]
        rows.append(("RSS growth over the soak", f"{soak['rss_growth']:+.1%} ({b['rss_bytes'] / 2**20:.1f} -> {a['rss_bytes'] / 2**20:.1f} MiB)",
                     "< 5%", soak["rss_growth"] < GROWTH_BOUND))
        rows.append(("fd growth over the soak", f"{soak['fd_growth']:+.1%} ({b['fds']} -> {a['fds']})", "< 5%", soak["fd_growth"] < GROWTH_BOUND))
    if rec:
        rows.append(("fault -> recovery (fake engine, supervised)",
                     f"503 after {rec['unhealthy_after']:.2f} s, exit {rec['exit_code']} after {rec['exit_after']:.1f} s, "
                     f"healthy again after {rec['recovered_after']:.1f} s", f"exit < {GRACE + 5:g} s", rec["ok"]))
    if eng:
        if eng.get("exit_after") is not None:
            measured = (f"503 after {eng['unhealthy_after']:.2f} s, exit 1 after {eng['exit_after']:.1f} s; "
                        f"+ cold start {eng['start_s']:.0f} s = {eng['exit_after'] + eng['start_s']:.0f} s")
        else:
            measured = "the test failed: see its log"
        rows.append(("fault -> recovery (vLLM, engine core kill -9)", measured, f"exit < {GRACE + 15:g} s", eng["ok"]))
    return rows, all(ok is not False for *_, ok in rows)


def render(rows: list[tuple[str, str, str, bool | None]]) -> str:
    lines = ["| what | measured | bound | ok |", "|---|---|---|---|"]
    for what, measured, bound, ok in rows:
        lines.append(f"| {what} | {measured} | {bound} | {'' if ok is None else 'yes' if ok else '**NO**'} |")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, stamp: str) -> dict[str, Any]:
    skip = set(args.skip.split(",")) if args.skip else set()
    r: dict[str, Any] = {"started": stamp, "soak_minutes": args.soak_minutes}
    if "storms" not in skip:
        r["storms"] = [run_pytest("storms-serve", STORMS_SERVE, stamp), run_pytest("storms-gateway", ["tests/gateway", "-m", "storm"], stamp)]
    if "fuzz" not in skip:
        if (ROOT / "tests" / "fuzz").is_dir():
            extra = ["--hypothesis-show-statistics"] if _has("hypothesis") else []
            r["fuzz"] = run_pytest("fuzz", ["tests/fuzz", *extra], stamp, {"STREAMPROXY_FUZZ": "long"})
        else:
            r["fuzz_skipped"] = "tests/fuzz not found"
    if "soak" not in skip:
        r["soak"] = await soak_phase(args.soak_minutes, args.concurrency, stamp)
    if "recovery" not in skip:
        r["recovery"] = await recovery_phase(stamp)
    if "engine" not in skip and not args.no_engine:
        res = run_pytest("engine-death", ["tests/engine/test_engine_death.py", "-m", "engine"], stamp)
        name = "test_engine_core_killed"
        r["engine_death"] = {"ok": res["ok"] and res["passed"] == 1, "pytest": res,
                             **{k: _property(res, name, k) for k in ("unhealthy_after", "exit_after", "start_s")}}
    return r


def _has(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--soak-minutes", type=float, default=float(os.environ.get("SOAK_MINUTES") or 30))
    ap.add_argument("--concurrency", type=int, default=48, help="soak clients at once")
    ap.add_argument("--no-engine", action="store_true", help="skip the real vLLM engine's death test")
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: storms,fuzz,soak,recovery,engine")
    args = ap.parse_args()
    stop_on_signals()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    import uvloop

    t0 = time.monotonic()
    results = uvloop.run(run(args, stamp))
    results["total_s"] = round(time.monotonic() - t0, 1)
    rows, ok = table(results)
    results["table"] = [dict(zip(("what", "measured", "bound", "ok"), row)) for row in rows]
    results["ok"] = ok
    text = render(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    md = RESULTS / f"reliability-{stamp}.md"
    md.write_text(f"# Reliability run {stamp}\n\n{text}\n\nSoak {args.soak_minutes:g} min; total {results['total_s']:.0f} s; "
                  f"details in {md.with_suffix('.json').name}, logs in logs/reliability-{stamp}-*.\n")
    md.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    print("\n" + text + "\n")
    print(f"{'all bounds held' if ok else 'SOME BOUNDS FAILED'}; written to {md} and {md.with_suffix('.json')}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
