"""The code's layout rules (docs/DESIGN.md §1.2) that import-linter does not check: no import
cycles anywhere, modules of at most 500 lines, a small top level, and every "DESIGN §N"
citation resolving to a section of docs/DESIGN.md."""

from __future__ import annotations

import re
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("volume_stream", "directory_table", "connectors")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    graph = grimp.build_graph(*PACKAGES)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert _cycles(edges) == []


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_are_at_most_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "volume_stream").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_top_level_of_volume_stream_is_small():
    top = sorted(p.name for p in (ROOT / "volume_stream").glob("*.py"))
    assert len(top) <= 12, top


def test_every_design_citation_resolves():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", design, re.M))
    cited: dict[str, set[str]] = {}
    for package in (*PACKAGES, "tests", "benchmarks", "examples"):
        for path in (ROOT / package).rglob("*.py"):
            for ref in re.findall(r"DESIGN ((?:§[\d.]+[–,\s-]*)+)", path.read_text()):
                for number in re.findall(r"§(\d+(?:\.\d+)?)", ref):
                    cited.setdefault(number, set()).add(str(path.relative_to(ROOT)))
    assert cited, "no citation found: the pattern is wrong"
    missing = {n: sorted(files) for n, files in cited.items() if n not in sections}
    assert missing == {}
