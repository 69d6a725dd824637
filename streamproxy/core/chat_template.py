"""Chat templates given on the command line or in a request, and how message content reaches them.

`load` reads `--chat-template` as vLLM does: a file if one opens at that path,
else the template itself when it has a Jinja character (`{`, `}` or a
newline), else an error (a path that does not exist). `content_format` says
whether a template gets a message's content as one string ("string") or as
OpenAI's list of parts ("openai"): `--chat-template-content-format`, or with
"auto" read from the template the way vLLM reads it: a template with a
`{% for ... in message.content %}` loop (over a message of a loop over
`messages`) takes parts. Sans-IO apart from reading the file at start.
"""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2 import nodes

CONTENT_FORMATS = ("auto", "string", "openai")
_JINJA_CHARS = "{}\n"


def load(value: str) -> str:
    """The template text of `--chat-template VALUE` (ValueError: a path that cannot be read)."""
    try:
        with open(value) as f:
            return f.read()
    except OSError as exc:
        if not any(c in value for c in _JINJA_CHARS):
            raise ValueError(f"{value!r} looks like a file path, but it cannot be read: {exc.strerror}") from None
    return value


def content_format(given: str, template: str | None) -> str:
    """"string" or "openai": `given` unless it is "auto", else what `template` reads."""
    if given != "auto":
        return given
    return "string" if template is None else detect(template)


@lru_cache(maxsize=32)
def detect(template: str) -> str:
    """"openai" when the template loops over a message's content, else "string" (also for one
    that does not parse)."""
    try:
        root = jinja2.Environment().parse(template)
    except jinja2.TemplateError:
        return "string"
    message_names = {
        loop.target.name for loop in root.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _reads(loop.iter, "messages")
    }
    for loop in root.find_all(nodes.For):
        if any(_reads(loop.iter, name, "content") for name in message_names):
            return "openai"
    return "string"


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """`node` is `name` (or `name.key` / `name['key']`), possibly sliced or filtered."""
    if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
        return _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return isinstance(node, nodes.Name) and node.name == name
    if isinstance(node, nodes.Getitem):
        return _reads(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Getattr):
        return _reads(node.node, name) and node.attr == key
    return False
