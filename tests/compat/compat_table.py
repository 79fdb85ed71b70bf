"""The table `make compat` and `make compat-k8s` print: aligned columns, or Markdown for docs."""

from __future__ import annotations


def table(header: list[str], lines: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header, *lines])
