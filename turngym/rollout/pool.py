"""Env handles kept open across rollouts, so that an env's start-up is paid once per run.

A TextWorld env's first reset starts its game engine (about 1 s of CPU here); its later resets
load another game in about 20 ms. ``rollout`` opens ``num_envs`` handles and closes them when it
returns, so a trainer that collects 32 episodes an iteration paid 32 engine starts (about 30 s)
every iteration, and every evaluation paid them again. Pass one ``EnvPools`` to every ``rollout``
of a run instead; each distinct env factory gets its own pool of handles.

    with EnvPools() as pools:
        for it in range(iterations):
            trajs = rollout(policy, make_env, specs, pools=pools)
"""

from __future__ import annotations

from typing import Any

from turngym.rollout.episode import close_handles, open_handles
from turngym.rollout.handles import EnvFactory, EnvHandle, handle_kind


def factory_key(make_env: EnvFactory) -> str:
    """Two factories that build the same env share a key (``functools.partial`` compares by its
    function and arguments, which ``repr`` spells out; anything else by identity)."""
    func = getattr(make_env, "func", None)
    if func is None:
        return f"id:{id(make_env)}"
    name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"
    return f"{name}{make_env.args!r}{sorted(make_env.keywords.items())!r}"


class EnvPools:
    """Open env handles by (handle kind, env factory, timeout), grown on demand, closed by ``close``."""

    def __init__(self) -> None:
        self._pools: dict[tuple, list[EnvHandle]] = {}

    def handles(self, workers: bool | str, make_env: EnvFactory, n: int, timeout_s: float) -> tuple[tuple, list[EnvHandle]]:
        """The first ``n`` handles of this factory's pool (opening the missing ones), and the pool's key."""
        key = (handle_kind(workers), factory_key(make_env), timeout_s)
        pool = self._pools.setdefault(key, [])
        if len(pool) < n:
            pool += open_handles(workers, make_env, n - len(pool), timeout_s)
        return key, pool[:n]

    def discard(self, key: tuple) -> None:
        """Close one pool (a rollout stopped part-way: its handles may hold a call in flight)."""
        close_handles(self._pools.pop(key, []))

    def close(self) -> None:
        for key in list(self._pools):
            self.discard(key)

    def __len__(self) -> int:
        return sum(len(p) for p in self._pools.values())

    def __enter__(self) -> EnvPools:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
