#!/usr/bin/env bash
# Run a command as on a bare machine: no Docker engine, no bubblewrap, no Stockfish on PATH, and no
# task data (neither TURNGYM_DATA nor ../shared/data beside the checkout). What needs them must skip
# with its reason. Used by .ci/run before it installs any of them; on a machine that already has
# them (a developer's, or a CI image with Docker preinstalled) it hides them.
#
#   bash .ci/bare.sh python -m pytest -q
set -euo pipefail
bare=$(mktemp -d /tmp/turngym-bare.XXXXXX)
trap 'rm -rf "$bare"' EXIT
hidden="docker dockerd bwrap stockfish"
IFS=: read -ra dirs <<< "$PATH"
path=""
for i in "${!dirs[@]}"; do
  d=${dirs[$i]}
  has=""
  for name in $hidden; do [ -e "$d/$name" ] && has=1; done
  if [ -n "$has" ]; then  # this folder through symlinks, minus the engines (other folders, a venv's, stay as they are)
    mkdir -p "$bare/$i"
    for f in "$d"/*; do
      case " $hidden " in *" ${f##*/} "*) continue ;; esac
      ln -s "$f" "$bare/$i/${f##*/}"
    done
    d="$bare/$i"
  fi
  path="${path:+$path:}$d"
done
# A Docker socket that does not exist, and a data folder that does not exist: the conftest then
# does not fall back to ../shared/data either.
PATH="$path" DOCKER_HOST="unix://$bare/no-docker.sock" TURNGYM_DATA="$bare/no-data" "$@"
