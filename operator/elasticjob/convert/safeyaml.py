"""YAML in and out for `elasticjob convert`, bounded: the input is untrusted text, and the converter walks every
value it reads (the Master and Worker templates are compared field by field, then validated as a model).

- No anchors or aliases: PyYAML composes an alias as a second reference to the same node, so a 1 KB document of
  nested aliases ("billion laughs") reads at once and then expands exponentially in every walk. Kubernetes
  manifests written by kubectl, Helm or kustomize never carry them.
- At most MAX_CHARS characters and MAX_DEPTH levels of nesting: PyYAML's composer and the walks recurse.
"""

from __future__ import annotations

from typing import Any

import yaml

from elasticjob.convert.errors import InputError

MAX_CHARS = 1 << 20  # 1 MiB of ASCII: a PyTorchJob is a few KB; the pure-Python reader takes seconds at most
MAX_DEPTH = 64  # a PyTorchJob's deepest fields (its template's affinity terms' values) sit about 15 down


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type stubs here
    """SafeLoader that refuses anchors, aliases and deep nesting as it composes, before anything is built."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise InputError(f"line {event.start_mark.line + 1}: YAML {kind}{event.anchor} refused: anchors and "
                             "aliases can expand a small file exponentially; write the values out in full")
        if self._depth >= MAX_DEPTH:
            raise InputError(f"line {event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    """SafeDumper that writes a value used twice in full, so that what it writes reads back here."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def load_all(text: str) -> list[Any]:
    if len(text) > MAX_CHARS:
        raise InputError(f"the input is {len(text)} characters: at most {MAX_CHARS} (1 MiB) are read")
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as error:
        raise InputError(f"not YAML: {error}") from None


def dump_all(documents: list[dict[str, Any]]) -> str:
    return str(yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False))
