"""SWE: fix a bug in a small Python repository inside a sandbox; hidden tests grade the fix.

Registered ids (entry points are strings: importing this package loads nothing heavy):

- ``turngym/SWE-synthetic-v0``: the bundled synthetic suite (seeded injected bugs; no download).
- ``turngym/SWE-synthetic-v1``: the generated suite, 600 training and 144 held-out tasks from
  parametrised bug templates; held-out tasks use templates and packages no training task uses
  (``synthetic_v1.py``).
- ``turngym/SWE-quixbugs-v0``: QuixBugs programs (``turngym data download quixbugs`` or
  ``$TURNGYM_DATA/quixbugs``).

``make(id, sandbox="docker" | "bwrap" | "local")`` picks the sandbox backend (default ``auto``;
``local`` runs the agent's code as you, for tests only). How grading holds up against a policy
that searches for holes: ``docs/grading.md``.
"""

from turngym.envs.registry import register

register(
    "turngym/SWE-synthetic-v0",
    entry_point="turngym.envs.swe.env:SWEEnv",
    kwargs={"suite": "synthetic"},
    max_turns=30,
    description="Fix a seeded bug (off-by-one, wrong operator, swapped args) in a generated Python package",
)
register(
    "turngym/SWE-synthetic-v1",
    entry_point="turngym.envs.swe.synthetic_v1:SyntheticSWEEnv",
    max_turns=30,
    description="Fix a seeded bug in a generated Python package; held-out tasks use unseen bug templates and packages",
)
register(
    "turngym/SWE-quixbugs-v0",
    entry_point="turngym.envs.swe.env:SWEEnv",
    kwargs={"suite": "quixbugs"},
    max_turns=30,
    description="Fix a QuixBugs program's one-line bug; hidden pytest cases grade the fix",
)
