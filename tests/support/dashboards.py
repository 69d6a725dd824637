"""The Grafana dashboards in configs/grafana/ and the series they query.

`queries(dashboard)` gives every PromQL expression a dashboard runs: each
panel target's `expr` (rows' nested panels too) and each query variable's
`label_values(...)`. `parse(expr)` is a small PromQL lexer, enough for what
dashboards write: it skips strings, numbers, durations and subqueries in
`[...]` and Grafana's `$variables`; an identifier followed by `(` is a
function or aggregation (it must be one PromQL knows), `by`/`without`/`on`/
`ignoring`/`group_left`/`group_right` lists are label names, and any other
identifier is a series name, with the label names its `{...}` matcher uses.

`exposed(text)` turns a /metrics exposition into sample names -> labels: a
family's `# TYPE` line is there whether or not it has samples yet (a
counter's names its `_total` sample), and its type says which samples a
query may name (a counter's `_total`, a
histogram's `_bucket`/`_sum`/`_count` and `le`). Labels come from the
registered collectors (the test runs in the server's process) and from the
samples in the text (a server in another process: the engine test).

`vllm_families()` reads vLLM's `vllm:*` families from the installed
`vllm/v1/metrics/loggers.py` source, statically: instantiating its
`PrometheusStatLogger` needs a whole `VllmConfig` (a model config, a
model's files) and imports torch, where the source names every family as a
literal `name="vllm:..."` passed to `_gauge_cls`/`_counter_cls`/
`_histogram_cls`. Only families made unconditionally in `__init__` count (no
`if` around them: an environment variable or a feature that is off leaves
the others out of /metrics).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

DASHBOARDS = Path(__file__).resolve().parents[2] / "configs" / "grafana"
# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = frozenset({"instance", "job"})

FUNCTIONS = frozenset({
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "day_of_month", "day_of_week", "delta", "deriv", "exp", "floor", "histogram_quantile",
    "histogram_count", "histogram_sum", "histogram_fraction", "holt_winters", "hour", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time", "min_over_time", "minute",
    "month", "predict_linear", "present_over_time", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn",
    "sort", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector",
    "year",
    # aggregations
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
})
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)")
_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|[a-zA-Z0-9_]+)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`)\s*,?')


@dataclass
class Parsed:
    """What one expression names."""

    series: list[tuple[str, frozenset[str]]] = field(default_factory=list)  # (series, labels its matcher uses)
    functions: list[str] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)  # labels in by/without/on/ignoring/group_* lists


def _matcher(expr: str, i: int) -> tuple[frozenset[str], int]:
    """`{a="x", b=~"y"}` from expr[i] == "{": its label names and the index past it."""
    i += 1
    names: list[str] = []
    while True:
        while i < len(expr) and expr[i] in " ,\n\t":
            i += 1
        if expr[i] == "}":
            return frozenset(names), i + 1
        m = _MATCHER.match(expr, i)
        if m is None:
            raise ValueError(f"bad label matcher at {i}: {expr!r}")
        names.append(m.group(1))
        i = m.end()


def parse(expr: str) -> Parsed:
    out = Parsed()
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c.isspace() or c in "(),+-*/%^<>=!":
            i += 1
        elif c == "[":  # a range or subquery: durations and Grafana's $__rate_interval
            i = expr.index("]", i) + 1
        elif c == "$":
            m = _VARIABLE.match(expr, i)
            if m is None:
                raise ValueError(f"bad variable at {i}: {expr!r}")
            i = m.end()
        elif c in "\"'`":
            m = _STRING.match(expr, i)
            if m is None:
                raise ValueError(f"unterminated string at {i}: {expr!r}")
            i = m.end()
        elif c == "{":  # a selector without a name
            nameless, i = _matcher(expr, i)
            out.series.append(("", nameless))
        elif c.isdigit() or (c == "." and expr[i + 1 : i + 2].isdigit()):
            m = _NUMBER.match(expr, i)
            assert m is not None
            i = m.end()
        else:
            m = _IDENT.match(expr, i)
            if m is None:
                raise ValueError(f"unexpected {c!r} at {i}: {expr!r}")
            word, i = m.group(0), m.end()
            j = i
            while j < n and expr[j].isspace():
                j += 1
            if word in LABEL_LISTS:
                if j < n and expr[j] == "(":
                    close = expr.index(")", j)
                    out.grouping.update(x.strip() for x in expr[j + 1 : close].split(",") if x.strip())
                    i = close + 1
            elif word.lower() in KEYWORDS:
                if word == "offset":  # its duration: `offset 5m`, `offset -1h30m`
                    m = re.compile(r"\s*-?[0-9a-z]+").match(expr, i)
                    i = m.end() if m else i
            elif j < n and expr[j] == "(":
                out.functions.append(word)
            elif word in FUNCTIONS and j < n and expr[j : j + 2] in ("by", "wi"):
                out.functions.append(word)  # `sum by (x) (...)`
            else:
                labels: frozenset[str] = frozenset()
                if j < n and expr[j] == "{":
                    labels, i = _matcher(expr, j)
                out.series.append((word, labels))
    return out


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / name).read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$", re.S)


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (its series selector; the label it
    lists is given back as a grouping `by (label)` so the same check applies)."""
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.match(query)
        assert m is not None, f"variable {var['name']}: only label_values(selector, label) is checked: {query!r}"
        out.append((f"variable {var['name']}", f"sum by ({m.group(2)}) ({m.group(1)})"))
    return out


# sample name -> the labels it carries
Series = dict[str, frozenset[str]]

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "unknown": ("",),
}


def samples(family: str, kind: str, labels: frozenset[str]) -> Series:
    out = {}
    for suffix in _SUFFIXES[kind]:
        out[family + suffix] = labels | {"le"} if suffix == "_bucket" else (labels | {"quantile"} if kind == "summary" and suffix == "" else labels)
    return out


def _labels_of(family: str) -> frozenset[str]:
    names = REGISTRY._names_to_collectors  # private, but this process's own registry: the labels of each family
    collector = names.get(family) or names.get(family + "_total")
    return frozenset(getattr(collector, "_labelnames", ()))


def exposed(text: str) -> Series:
    """Every sample name /metrics may carry, from its `# TYPE` lines, with its labels: those of this
    process's collector of that name, and those its samples in `text` carry (another process's /metrics)."""
    out: Series = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            if kind == "counter":  # the text format names a counter's family by its sample, `..._total`
                family = family.removesuffix("_total")
            out.update(samples(family, kind, _labels_of(family)))
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            out[sample.name] = out.get(sample.name, frozenset()) | frozenset(sample.labels)
    return out


_KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}


def vllm_loggers_path() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py"


def vllm_families(source: str | None = None) -> Series:
    """vLLM's families `PrometheusStatLogger.__init__` always registers, as sample names -> labels."""
    tree = ast.parse(source if source is not None else vllm_loggers_path().read_text())
    logger = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "PrometheusStatLogger")
    init = next(n for n in logger.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    base: list[str] = []
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["labelnames"]:
            base = ast.literal_eval(node.value)
    assert base, "no `labelnames = [...]` in PrometheusStatLogger.__init__"
    out: Series = {}

    def visit(node: ast.AST, conditional: bool) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _KINDS:
            kw = {k.arg: k.value for k in node.keywords}
            name = kw.get("name")
            if not conditional and isinstance(name, ast.Constant) and str(name.value).startswith("vllm:"):
                out.update(samples(str(name.value), _KINDS[node.func.attr], _vllm_labels(kw.get("labelnames"), base)))
        for child in ast.iter_child_nodes(node):
            visit(child, conditional or isinstance(node, (ast.If, ast.For, ast.While, ast.Try, ast.IfExp)))

    for statement in init.body:
        visit(statement, False)
    return out


def _vllm_labels(node: ast.expr | None, base: list[str]) -> frozenset[str]:
    if node is None:
        return frozenset()
    if isinstance(node, ast.Name) and node.id == "labelnames":
        return frozenset(base)
    if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Name) and node.left.id == "labelnames":
        return frozenset(base) | frozenset(ast.literal_eval(node.right))
    return frozenset(ast.literal_eval(node))


def problems(dashboard: dict[str, Any], series: Series) -> list[str]:
    """Every query's series that `series` lacks, labels its matchers or groupings name that its series lack,
    and unknown functions; empty when the dashboard only asks for what is there."""
    found = []
    for where, expr in queries(dashboard):
        parsed = parse(expr)
        if not parsed.series:
            found.append(f"{where}: no series in {expr!r}")
        labels: set[str] = set(TARGET_LABELS)
        for name, used in parsed.series:
            if name not in series:
                found.append(f"{where}: {name or '{...}'!r} is not exposed")
                continue
            labels |= series[name]
            if not used <= series[name] | TARGET_LABELS:
                found.append(f"{where}: {name} has no label {sorted(used - series[name] - TARGET_LABELS)}")
        for fn in parsed.functions:
            if fn not in FUNCTIONS:
                found.append(f"{where}: unknown function {fn!r}")
        if not parsed.grouping <= labels:
            found.append(f"{where}: groups by {sorted(parsed.grouping - labels)}, which no series it reads has")
    return found
