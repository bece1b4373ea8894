"""The docs stay scannable and whole: the results page's claims table keeps short cells, every file of
docs/results/ is named by a doc, and every relative link between the docs resolves."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_CELL = 220  # characters of markdown; the table aims at about 200 so that a reader can scan it


def doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


def table_cells(section: str) -> list[str]:
    """Every cell of the markdown tables in ``section`` (separator rows skipped; ``\\|`` stays in a cell)."""
    cells = []
    for line in section.splitlines():
        line = line.strip()
        if not line.startswith("|") or re.fullmatch(r"\|[\s:|-]+", line):
            continue
        cells += [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
    return cells


def claims_section(text: str) -> str:
    """The results page's "Current claims" section, up to the next ``## `` heading."""
    return text.split("\n## Current claims", 1)[1].split("\n## ", 1)[0]


def expand_braces(token: str) -> list[str]:
    """``a.{json,md}`` -> ``[a.json, a.md]`` (nested and repeated groups too)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [name for alt in m.group(1).split(",")
            for name in expand_braces(token[:m.start()] + alt.strip() + token[m.end():])]


def named_files(text: str) -> tuple[set[str], list[str]]:
    """The file names ``text`` mentions (paths cut to their last part, brace groups expanded), and the
    globs among them that are specific enough to name a result (``name_2026-12-02_seed2.*``)."""
    names = set()
    for token in re.findall(r"[\w.\-/{},*$]+", text):
        for name in expand_braces(token.strip(",.")):
            names.add(name.rsplit("/", 1)[-1])
    globs = [n for n in names if n.endswith(".*") and "*" not in n[:-2] and len(n) >= 14]
    return names, globs


def anchors(path: Path) -> set[str]:
    """A markdown file's link targets: explicit ``<a id>`` anchors and GitHub's heading slugs."""
    text = path.read_text()
    found = set(re.findall(r'<a id="([^"]+)">', text))
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return found


def test_claims_table_cells_are_short():
    cells = table_cells(claims_section((DOCS / "experiments.md").read_text()))
    assert len(cells) > 20, "the claims table was not found under '## Current claims'"
    long = [c for c in cells if len(c) > MAX_CELL]
    assert not long, f"{len(long)} claims-table cells over {MAX_CELL} characters, e.g. {long[0][:120]!r}..."


def test_table_helpers():
    assert table_cells("| a | b \\| c |\n|---|---|\n| `x` | y |") == ["a", "b \\| c", "`x`", "y"]
    assert expand_braces("docs/results/r.{json,md,png}") == ["docs/results/r.json", "docs/results/r.md",
                                                               "docs/results/r.png"]
    names, globs = named_files("`docs/results/protocol_2026-12-02_seed2.*`, r_2026.{json,md}, *.md, **bold**")
    assert {"r_2026.json", "r_2026.md"} <= names and globs == ["protocol_2026-12-02_seed2.*"]


def test_every_result_file_is_named_by_a_doc():
    names, globs = named_files("\n".join(p.read_text() for p in doc_files()))
    orphans = [p.name for p in sorted((DOCS / "results").iterdir())
               if p.name not in names and not any(fnmatch.fnmatch(p.name, g) for g in globs)]
    assert not orphans, f"docs/results/ files no doc names (name them in their entry, or remove them): {orphans}"


def test_links_between_docs_resolve():
    broken = []
    for doc in doc_files():
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code blocks hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.name}: {target} (no such anchor)")
    assert not broken, "\n".join(broken)
