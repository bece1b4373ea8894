#!/usr/bin/env bash
# Set up the sandbox backends for the test suite: Docker engine, bubblewrap, and the locally
# built sandbox image (debootstrap -> docker import -> docker build; no registry needed).
#
# Called by .ci/run. Never fails the run: when something cannot be set up (no root, no apt,
# the Debian mirror down twice) it says so and exits 0, and the Docker / bwrap tests skip with
# their reason.
#
# Env: PYTHON (default: python, else python3), DOCKERD_LOG (default /tmp/dockerd.log).
set -u
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/dockerd.log}
say() { echo "[setup_sandbox] $*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    say "not root and no passwordless sudo: cannot install or start the sandbox; sandbox tests will skip"
    exit 0
  fi
fi

need=""
command -v dockerd >/dev/null || need="$need docker.io"
command -v bwrap >/dev/null || need="$need bubblewrap"
command -v debootstrap >/dev/null || need="$need debootstrap"
if [ -n "$need" ]; then
  say "installing:$need"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need; } >/tmp/setup_sandbox_apt.log 2>&1; then
    say "apt-get install failed (see /tmp/setup_sandbox_apt.log); sandbox tests that need it will skip"
  fi
fi

docker_up() { docker info >/dev/null 2>&1; }
start_dockerd() {  # $1 = storage driver
  say "starting dockerd (storage driver $1), log: $DOCKERD_LOG"
  $SUDO sh -c "nohup dockerd --storage-driver=$1 >'$DOCKERD_LOG' 2>&1 & echo \$! > /tmp/setup_sandbox_dockerd.pid"
  for _ in $(seq 60); do docker_up && return 0; sleep 1; done
  return 1
}
if command -v dockerd >/dev/null && ! docker_up; then
  if ! start_dockerd overlay2; then
    say "dockerd did not come up with overlay2; last log lines:"; tail -5 "$DOCKERD_LOG"
    $SUDO kill "$(cat /tmp/setup_sandbox_dockerd.pid)" 2>/dev/null; sleep 2  # only the dockerd we started
    start_dockerd vfs || say "dockerd did not start; Docker tests will skip (bwrap tests still run)"
  fi
fi
docker_up && say "Docker engine: $(docker info --format '{{.ServerVersion}} ({{.Driver}})' 2>/dev/null)"

# The image builder retries the Debian mirror once itself.
args=""
docker_up || args="--no-docker"
if $SUDO env "PATH=$PATH" "$PYTHON" -m turngym.tools.sandbox.image $args; then
  say "sandbox image ready"
else
  say "the sandbox rootfs/image could not be built (Debian mirror unreachable after a retry?);"
  say "Docker and bwrap sandbox tests will skip with the reason"
fi
exit 0
