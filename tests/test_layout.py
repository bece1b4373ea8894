"""The house rules of docs/layout.md, checked on the source: imports run one way down the rooms, and no
modules import each other in a circle.

Every ``import`` in every module under ``turngym/`` counts, including the ones inside functions
(a lazy import is still a dependency). ``from pkg import sub`` where ``sub`` is a module counts as a
dependency on ``pkg.sub``; the implicit import of a parent package's ``__init__`` does not.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "turngym"

# docs/layout.md's rooms, lowest first. A module may import its own room and any room below it.
ROOMS = [("types", "config", "clock"), ("data", "tools"), ("envs",), ("integrations",), ("agents",), ("rollout",),
         ("rewards",), ("trainers",), ("bench",), ("train",), ("protocol",), ("cli",)]
RANK = {room: i for i, group in enumerate(ROOMS) for room in group}


def module_files() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the turngym modules it imports (resolved to the deepest module named)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[mod].update(a.name for a in node.names if a.name.startswith("turngym"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("turngym"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & mods.keys()
                if len(subs) < len(node.names):  # some names are attributes of the module itself
                    graph[mod].add(node.module)
                graph[mod].update(subs)
    return graph


def room_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else None  # the package root (turngym/__init__) is the public face


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    bad = []
    for mod, deps in graph.items():
        src = room_of(mod)
        for dep in deps:
            dst = room_of(dep)
            if src is None or dst is None:
                continue
            assert src in RANK and dst in RANK, f"{mod} or {dep} is in no room of docs/layout.md"
            if RANK[dst] > RANK[src]:
                bad.append((mod, dep))
    return sorted(bad)


def cycles(graph: dict[str, set[str]], mods: set[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(mods):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, set()) & mods)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, set()) & mods))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_and_room_order_on_a_made_up_graph():
    graph = {"turngym.envs.a": {"turngym.envs.b"}, "turngym.envs.b": {"turngym.envs.a", "turngym.agents.c"},
             "turngym.agents.c": set(), "turngym.rollout.d": {"turngym.trainers.e"}, "turngym.trainers.e": set()}
    assert cycles(graph, set(graph)) == [["turngym.envs.a", "turngym.envs.b"]]
    assert upward_imports(graph) == [("turngym.envs.b", "turngym.agents.c"), ("turngym.rollout.d", "turngym.trainers.e")]


def test_no_import_runs_up_the_rooms():
    mods = module_files()
    assert upward_imports(import_graph(mods)) == []


def test_no_modules_import_each_other_in_a_circle():
    mods = module_files()
    assert cycles(import_graph(mods), set(mods)) == []


# Rooms above rollout/ play episodes only through its Collector: none builds an env or plays one itself.
ABOVE_ROLLOUT = {room for group in ROOMS[RANK["rollout"] + 1:] for room in group}
ENV_BUILDERS = {"make_env_factory", "rollout", "async_rollout", "AsyncCollector", "EnvPools", "open_handles",
                "make_handle", "LocalEnv", "SubprocessEnv", "branch_search", "tree_rollout", "make", "make_revisit_limited"}


def env_builders(path: Path) -> list[str]:
    """What a module uses to build or play envs itself: env-building names imported from turngym,
    ``gymnasium`` imports, and ``*.make(...)`` calls (``gym.make``, ``turngym.make``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("turngym"):
            found += [f"imports {a.name} from {node.module}" for a in node.names if a.name in ENV_BUILDERS]
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name.split(".")[0] == "gymnasium"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gymnasium":
            found.append(f"imports from {node.module}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "make":
            found.append(f"calls {ast.unparse(node.func)}(...) at line {node.lineno}")
    return found


def test_env_builders_are_spotted_on_a_made_up_module(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import gymnasium as gym\nfrom turngym.rollout import rollout, Collector\nenv = gym.make('x')\n")
    assert env_builders(src) == ["imports gymnasium", "imports rollout from turngym.rollout", "calls gym.make(...) at line 3"]


def test_no_module_above_rollout_builds_envs_for_collection():
    bad = {mod: found for mod, path in module_files().items()
           if room_of(mod) in ABOVE_ROLLOUT and (found := env_builders(path))}
    assert bad == {}
