"""How much memory one sandbox can hold: /dev/shm, and several processes at once.

Fills /dev/shm with 100 MB files (at most 2 GB), then starts 4 processes that each touch 300 MB
and hold it, under ``memory_mb=512``; prints what the sandbox held. Run it from a checkout:
``python scripts/sandbox_limits_probe.py --backend bwrap``.
"""

from __future__ import annotations

import argparse

from turngym.tools.sandbox import SandboxConfig, make_sandbox

SHM = ("for i in $(seq 1 20); do dd if=/dev/zero of=/dev/shm/f$i bs=1M count=100 status=none 2>/dev/null || break; done; "
       "du -sm /dev/shm | cut -f1; rm -f /dev/shm/f*")
HOLD = ("for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(300 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); "
        "print(\"held\", flush=True); time.sleep(4)' & done; wait")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    args = p.parse_args()
    cfg = SandboxConfig(memory_mb=512, timeout_s=60)
    with make_sandbox(args.backend, cfg) as sb:
        shm = sb.exec(SHM).stdout.strip()
        hold = sb.exec(HOLD)
        held = hold.stdout.count("held")
        how = "cgroup (Docker)" if args.backend == "docker" else getattr(sb, "memory_enforcement", "RLIMIT_AS per process")
        print(f"{args.backend}: /dev/shm held {shm} MB; {held}/4 processes held 300 MB each "
              f"(~{held * 300} MB) under memory_mb=512; total memory capped by: {how}")


if __name__ == "__main__":
    main()
