"""Local copies into the download cache: ``turngym data add NAME PATH``.

A user who already has a dataset's archive (the official file fetched by hand, or a packed split
such as ALFWorld's ``train_json_2.1.1.tar.xz``) or an unpacked folder adds it to the folder
``turngym data download`` fills, where every loader finds it. Several adds merge: ALFWorld's
training split from one archive and ``valid_seen`` from a folder end up side by side.

An archive whose SHA-256 is the published digest of one of the dataset's files is reported as that
official file; any other archive is unpacked as it is (its digest is printed). Extraction refuses
members that would land outside the folder (``downloader.extract``).
"""

from __future__ import annotations

import shutil
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

from turngym.data.downloader import extract, sha256_file
from turngym.data.registry import COMPLETE_STAMP, download_dir, get_dataset


def add_local(name: str, path: str | Path, *, into: str | Path | None = None,
              log: Callable[[str], None] | None = None) -> Path:
    """Unpack an archive, or copy a folder, into dataset ``name``'s folder, and mark it complete
    once it holds the dataset (its markers).

    Args:
        name: A registered dataset.
        path: A zip or tar archive (``.tar.xz``, ``.tar.gz``, ...) or a folder laid out as the
            dataset (for ALFWorld: holding ``json_2.1.1/``).
        into: A data folder to add to (``INTO/NAME``, e.g. the folder ``TURNGYM_DATA`` names);
            default: the download cache (``download_dir(name)``).
        log: Where progress lines go (default: stderr).

    Returns:
        The dataset's folder.

    Raises:
        KeyError: unknown dataset.
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is neither an archive nor a folder, or an archive member is unsafe.
    """
    log = log or (lambda s: print(s, file=sys.stderr))
    ds = get_dataset(name)
    src = Path(path).expanduser()
    if not src.exists():
        raise FileNotFoundError(f"{src} does not exist")
    folder = Path(into).expanduser() / name if into is not None else download_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        log(f"{name}: copying {src} into {folder}")
        shutil.copytree(src, folder, dirs_exist_ok=True)
    elif zipfile.is_zipfile(src) or tarfile.is_tarfile(src):
        digest = sha256_file(src)
        official = next((f for f in ds.files if f.sha256 and f.sha256.lower() == digest), None)
        what = f"the official {official.filename} ({official.url})" if official else "a local archive"
        log(f"{name}: unpacking {src} into {folder}: {what}, sha256={digest}")
        extract(src, folder)
    else:
        raise ValueError(f"{src} is neither a zip or tar archive nor a folder")
    if ds.prepare is not None:
        ds.prepare(folder)
    if ds.is_present(folder):
        (folder / COMPLETE_STAMP).write_text("ok\n")
    else:
        log(f"{name}: {folder} does not hold {' or '.join(ds.markers)} yet; add the rest of the dataset")
    return folder
