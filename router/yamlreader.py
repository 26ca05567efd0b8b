"""Reading a composed YAML node tree with positions: values converted, ``${VAR}`` interpolated, problems collected.

:mod:`router.config` walks ``clusters.yaml`` with it, so every problem carries the
file, line and column of the node it is about, and all of them are reported together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from .errors import ConfigProblem
from .uris import masked_uri

__all__ = ["YamlReader"]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class YamlReader:
    """Walks a composed YAML node tree, converting values and collecting problems."""

    def __init__(self, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.problems: list[ConfigProblem] = []
        self._constructor = yaml.SafeLoader("")

    def problem(self, node: yaml.Node | None, path: str, message: str) -> None:
        line, col = (node.start_mark.line + 1, node.start_mark.column + 1) if node is not None else (0, 0)
        self.problems.append(ConfigProblem(self.source, line, col, path, message))

    def mapping(self, node: yaml.Node, path: str, allowed: set[str] | None, *,
                secret: bool = False) -> dict[str, yaml.Node] | None:
        """The mapping at *node* by key (only *allowed* keys, unless None). With *secret*, a section that holds a
        secret (``erasure``): what was written in the wrong place is never shown, a value given instead of the
        mapping nor a key that is not allowed (either may be the secret itself), only its kind and position."""
        if not isinstance(node, yaml.MappingNode):
            shown = self._show(node)
            if secret:
                kind = self._kind(node)
                shown = f"{kind}, not shown: it goes under {path}.key" if kind == "a single value" else kind
            self.problem(node, path, f"must be a mapping (got {shown})")
            return None
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            sub = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str) or key_node.tag != "tag:yaml.org,2002:str":
                shown = self._kind(key_node) if secret else self._show(key_node)
                self.problem(key_node, path or "<top>", f"keys must be strings (got {shown})")
            elif key in out:
                self.problem(key_node, sub, "duplicate key")
            elif allowed is not None and key not in allowed:
                expected = f"(expected one of: {', '.join(sorted(allowed))})"
                if secret:
                    self.problem(key_node, path, f"an unknown key, not shown {expected}")
                else:
                    self.problem(key_node, sub, f"unknown key {expected}")
            else:
                out[key] = value_node
        return out

    def value(self, node: yaml.Node, path: str) -> Any:
        """A scalar's Python value, with ``${VAR}`` interpolated in strings."""
        if not isinstance(node, yaml.ScalarNode):
            self.problem(node, path, f"must be a single value (got {self._show(node)})")
            return None
        value = self._constructor.construct_object(node, deep=True)
        if isinstance(value, str):
            value = self._interpolate(node, path, value)
        return value

    def string(self, node: yaml.Node, path: str, *, pattern: re.Pattern[str] | None = None, hint: str = "") -> str | None:
        value = self.value(node, path)
        if value is None and not isinstance(node, yaml.ScalarNode):
            return None
        if not isinstance(value, str) or not value:
            self.problem(node, path, f"must be a non-empty string (got {value!r})")
            return None
        if pattern is not None and not pattern.match(value):
            self.problem(node, path, f"{hint} (got {value!r})")
            return None
        return value

    def integer(self, node: yaml.Node, path: str, *, minimum: int) -> int | None:
        value = self.value(node, path)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(node, yaml.ScalarNode):
                self.problem(node, path, f"must be an integer (got {value!r})")
            return None
        if value < minimum:
            self.problem(node, path, f"must be at least {minimum} (got {value!r})")
            return None
        return value

    def _interpolate(self, node: yaml.Node, path: str, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in self.env:
                return self.env[name]
            if default is not None:
                return default
            self.problem(node, path, f"environment variable {name} is not set (got {m.group(0)!r})")
            return ""

        return _ENV.sub(sub, text)

    @staticmethod
    def _kind(node: yaml.Node) -> str:
        """What *node* is, without its value."""
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return "nothing" if node.tag == "tag:yaml.org,2002:null" else "a single value"

    @staticmethod
    def _show(node: yaml.Node) -> str:
        """*node* as a problem shows it: a scalar's value (a URI's password masked), else its kind."""
        if not isinstance(node, yaml.ScalarNode):
            return YamlReader._kind(node)
        return repr(masked_uri(node.value) if isinstance(node.value, str) else node.value)
