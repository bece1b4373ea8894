"""Which external datasets turngym knows, where they come from, and where they live on disk.

A dataset is resolved, in order, from:

1. an explicit ``data_dir`` (``--data-dir`` on the CLI): ``data_dir/NAME`` or ``data_dir`` itself;
2. ``$TURNGYM_DATA/NAME`` (a local copy laid out like ``../shared/data``);
3. the download cache, ``$TURNGYM_CACHE/data/NAME`` (default ``~/.cache/turngym/data/NAME``),
   which ``turngym data download NAME`` fills.

Checksums. A ``RemoteFile`` carries a SHA-256 only where the project actually knows the digest
of the published file. Where it does not, the first download computes the digest and pins it in
``<cache>/data/pins.json`` (trust on first use): later downloads must match the pin, and the
command prints the digest so a user can compare it with one obtained elsewhere. No digest in
this file was guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ENV_DATA = "TURNGYM_DATA"
ENV_CACHE = "TURNGYM_CACHE"
COMPLETE_STAMP = ".turngym-complete"


class DataNotFound(FileNotFoundError):
    """A dataset is neither in a local copy nor in the download cache."""


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch.

    Args:
        url: Official public URL.
        filename: Name to save it under inside the dataset folder.
        sha256: Known digest of the published file, or None (pinned on first download).
        extract: Unpack this archive (zip / tar) into the dataset folder, then delete it.
    """

    url: str
    filename: str
    sha256: str | None = None
    extract: bool = False


@dataclass(frozen=True)
class Dataset:
    """A dataset turngym can download or read from a local copy.

    Args:
        name: Short name used on the CLI (``turngym data download NAME``).
        description: One line for ``turngym data list``.
        files: What to download.
        markers: Relative paths; a folder holding any one of them is a usable copy.
        license: Licence (with attribution duties) of the data.
        homepage: Where the data is described.
        prepare: Called with the dataset folder after download (e.g. to convert a file).
    """

    name: str
    description: str
    files: tuple[RemoteFile, ...]
    markers: tuple[str, ...]
    license: str = ""
    homepage: str = ""
    prepare: Callable[[Path], None] | None = field(default=None, compare=False)

    def is_present(self, folder: Path) -> bool:
        return folder.is_dir() and any((folder / m).exists() for m in self.markers)


DATASETS: dict[str, Dataset] = {}


def register_dataset(ds: Dataset) -> Dataset:
    """Add (or replace) a dataset in the registry; returns it."""
    DATASETS[ds.name] = ds
    return ds


def get_dataset(name: str) -> Dataset:
    """The registered dataset ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}") from None


def cache_root() -> Path:
    """``$TURNGYM_CACHE`` or ``~/.cache/turngym``."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "turngym"


def download_dir(name: str) -> Path:
    """Where ``download(name)`` puts the dataset."""
    return cache_root() / "data" / name


def candidate_dirs(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Folders that may hold ``name``, in resolution order."""
    out: list[Path] = []
    if data_dir is not None:
        d = Path(data_dir).expanduser()
        out += [d / name, d]
    env = os.environ.get(ENV_DATA)
    if env:
        out.append(Path(env).expanduser() / name)
    out.append(download_dir(name))
    return out


def dataset_path(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding dataset ``name``.

    Args:
        name: A registered dataset name (``spider``, ``hotpotqa``, ``lmrl``, ...).
        data_dir: A local copy to prefer (``data_dir/name`` or ``data_dir`` itself).

    Returns:
        The first folder in ``candidate_dirs`` that holds the dataset.

    Raises:
        KeyError: unknown dataset.
        DataNotFound: no copy anywhere; the message says how to get one.
    """
    ds = get_dataset(name)
    for d in candidate_dirs(name, data_dir):
        if d == download_dir(name) and not (d / COMPLETE_STAMP).exists():
            continue  # a half-finished download is not a dataset
        if ds.is_present(d):
            return d
    looked = ", ".join(str(d) for d in candidate_dirs(name, data_dir))
    raise DataNotFound(
        f"dataset {name!r} not found (looked in: {looked}). Run `turngym data download {name}`, "
        f"or point {ENV_DATA} (or --data-dir) at a local copy that has {name}/"
    )
