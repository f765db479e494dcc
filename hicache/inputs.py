"""Bounded readers for what a user hands us: config YAML, ``config.json`` and trace lines.

Why a module of its own: the parsers we use trust their input. PyYAML expands aliases
into shared objects (an "alias bomb" of 9 anchors is a billion-element list as soon as
anything walks or prints it), recurses per nesting level, and ``int()`` refuses more than
4,300 digits with a bare ``ValueError``; ``json`` raises ``RecursionError`` on deep input.
Each of those ended in a traceback, or in minutes of work and a ``MemoryError``, where the
command line promises one line naming the field and exit status 2 (README, "bad input").

The limits below are far above any real config (a DeepSeek-V4 ``config.json`` is a few KiB,
nests 3 levels deep and its largest integer has 6 digits) and low enough that refusing
takes milliseconds. Every refusal is a :class:`ConfigError` naming the field (a dotted
path such as ``cache.device_bytes``) or the file.

* :func:`read_text`   a file's UTF-8 text, at most :data:`MAX_FILE_BYTES`;
* :func:`load_yaml`   YAML checked event by event *before* it is built (depth, expanded
  size with aliases counted in full, integer length), then every mapping key is text;
* :func:`load_json`   a JSON document with the same limits (``config.json``);
* :func:`json_line`   one JSON line of a trace: the fast parse, with the parser's crashes
  on hostile lines turned into one ConfigError naming the line (and the field if it can).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from hicache.errors import ConfigError

MAX_FILE_BYTES = 4 * 1024 * 1024    # a config or config.json file
MAX_DEPTH = 32                      # nesting of mappings and lists
MAX_NODES = 100_000                 # values in a document, every alias counted as its full copy
MAX_INT_DIGITS = 100                # decimal digits of one integer
MAX_LINE_BYTES = 16 * 1024 * 1024   # one line of a trace (a 1M-token request is ~1 MiB)

_DECIMAL = re.compile(r"[-+]?[0-9][0-9_]*")


def read_text(path: Path, field: str) -> str:
    """A file's text; too large, not UTF-8 or unreadable is a ConfigError naming ``field``."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(field, str(path), f"is {size:,} bytes; a config file is at most {MAX_FILE_BYTES:,}")
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)    # the file may have grown since stat
    except OSError as exc:
        raise ConfigError(field, str(path), f"cannot be read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(field, str(path), f"is over {MAX_FILE_BYTES:,} bytes; a config file is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, str(path), f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                                            f"at offset {exc.start})") from None


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


# -- YAML ---------------------------------------------------------------------------------

class _Frame:
    """One open mapping or sequence of the event pass: where it is and what it holds so far."""

    __slots__ = ("path", "is_map", "anchor", "nodes", "index", "key", "want_key")

    def __init__(self, path: str, is_map: bool, anchor: str | None):
        self.path, self.is_map, self.anchor = path, is_map, anchor
        self.nodes, self.index, self.key, self.want_key = 1, 0, "?", True

    def child(self) -> str:
        """The path of the value this event fills (a key's own path for a key)."""
        return _join(self.path, self.key if self.is_map else self.index)

    def advance(self, scalar_key: str | None) -> None:
        if self.is_map:
            if self.want_key:
                self.key = scalar_key if scalar_key is not None else "?"
            self.want_key = not self.want_key
        else:
            self.index += 1


def _check_yaml_events(text: str, field: str) -> None:
    """Walk the YAML event stream (no objects built) and stop at the first limit passed.

    Aliases are counted as the size of what they stand for, so 9 nested anchors of 10
    aliases each (10^9 values) stop after a few hundred events; nesting stops at depth
    :data:`MAX_DEPTH` before the composer's recursion could run out."""
    import yaml

    sizes: dict[str, int] = {}
    stack: list[_Frame] = []
    total = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            where = stack[-1].child() if stack else ""
            if len(stack) >= MAX_DEPTH:
                raise ConfigError(where or field, "...", f"nests deeper than {MAX_DEPTH} levels")
            stack.append(_Frame(where, isinstance(ev, yaml.MappingStartEvent), ev.anchor))
            total += 1
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            done = stack.pop()
            if done.anchor is not None:
                sizes[done.anchor] = done.nodes
            if stack:
                stack[-1].nodes += done.nodes
                stack[-1].advance(None)
        elif isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent)):
            where = stack[-1].child() if stack else field
            if isinstance(ev, yaml.AliasEvent):
                n = sizes.get(ev.anchor or "", 1)
                key = None
            else:
                n, key = 1, ev.value
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                if ev.style is None and len(ev.value) > MAX_INT_DIGITS and _DECIMAL.fullmatch(ev.value):
                    raise ConfigError(where, f"<{len(ev.value)} digits>",
                                      f"is an integer longer than {MAX_INT_DIGITS} digits")
            total += n
            if stack:
                stack[-1].nodes += n
                stack[-1].advance(key)
        if total > MAX_NODES:
            where = stack[-1].child() if stack else field
            raise ConfigError(where, "...", f"expands to more than {MAX_NODES:,} values "
                                            "(YAML aliases count as full copies)")


def _walk(data: Any, field: str) -> Iterator[tuple[str, Any, int]]:
    """(path, value, depth) of every value in ``data``, iteratively, depth-first."""
    todo: list[tuple[str, Any, int]] = [(field, data, 0)]
    while todo:
        path, value, depth = todo.pop()
        yield path, value, depth
        if isinstance(value, dict):
            todo.extend((_join(path, k) if isinstance(k, str) else path, v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((_join(path, i), v, depth + 1) for i, v in enumerate(value))


def check_shape(data: Any, field: str, *, root: str = "") -> None:
    """Refuse what the event pass cannot see: a mapping key that is not text (``1: x``, which
    later sorts badly beside the named keys), too deep, too many values, too long an int.

    ``root`` is the path prefix of the values (``""`` for a config's top level); ``field``
    names the document when the problem is the document itself."""
    for n, (path, value, depth) in enumerate(_walk(data, root)):
        if n > MAX_NODES:
            raise ConfigError(field, "...", f"holds more than {MAX_NODES:,} values")
        if depth > MAX_DEPTH:
            raise ConfigError(path or field, "...", f"nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise ConfigError(_join(path, str(key)), key, "is not a name: keys of a config mapping "
                                                                  "must be text")
        elif isinstance(value, int) and value.bit_length() > MAX_INT_DIGITS * 3.33:
            raise ConfigError(path or field, f"<about {int(value.bit_length() * 0.30103) + 1} digits>",
                              f"is an integer longer than {MAX_INT_DIGITS} digits")


def load_yaml(text: str, field: str) -> Any:
    """Parse config YAML within the limits above; bad YAML is a ConfigError with its line."""
    import yaml

    try:
        _check_yaml_events(text, field)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(field, "...", f"is not valid YAML{line}") from None
    check_shape(data, field)
    return data


# -- JSON ---------------------------------------------------------------------------------

class _LongInt:
    """Stands in for an integer too long to convert, so the walk can name where it sits."""

    def __init__(self, digits: int):
        self.digits = digits


def _find_long_int(text: str, where: str, root: str) -> ConfigError:
    """The one-line error for ``text`` whose integer ``int()`` refused: parsed again with
    long integers kept as :class:`_LongInt`, to name the field."""
    limit = sys.get_int_max_str_digits() or 4300

    def parse_int(s: str) -> Any:
        return _LongInt(len(s.lstrip("-"))) if len(s) > limit else int(s)

    try:
        data = json.loads(text, parse_int=parse_int)
        for path, value, _ in _walk(data, root):
            if isinstance(value, _LongInt):
                return ConfigError(path or where, f"<{value.digits} digits>",
                                   f"is an integer too long to read (over {limit} digits)", source=where)
    except (ValueError, RecursionError):
        pass
    return ConfigError(where, "...", f"holds an integer too long to read (over {limit} digits)")


def json_line(text: str, where: str, *, root: str = "") -> Any:
    """``json.loads(text)`` for one trace line or JSON file named ``where``.

    ``JSONDecodeError`` passes through (a trace counts lines that are not JSON, as the
    simulator does); nesting deeper than the parser's recursion and integers ``int()``
    refuses become one ConfigError. Valid lines cost nothing extra."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ConfigError(where, "...", "nests too deeply to parse") from None
    except ValueError:      # "Exceeds the limit (4300 digits) for integer string conversion"
        raise _find_long_int(text, where, root) from None


def load_json(text: str, field: str, source: str) -> Any:
    """A JSON document (``config.json``) within the limits above; ``field`` roots the paths
    of its values (``hf_config.num_hidden_layers``) and ``source`` names the file."""
    try:
        data = json_line(text, source, root=field)
    except json.JSONDecodeError as exc:
        raise ConfigError(field, source, f"is not valid JSON (line {exc.lineno})") from None
    except ConfigError as exc:
        if exc.field != source:
            raise
        raise ConfigError(field, source, exc.reason) from None   # the file itself: name the field
    check_shape(data, field, root=field)
    return data
