"""``turngym data list | download NAME | add NAME PATH | path NAME``.

The lead's ``turngym/cli.py`` calls ``add_arguments(subparser)`` and then ``main(args)``; running
``python -m turngym.data.cli`` works on its own too.
"""

from __future__ import annotations

import argparse
import sys

from turngym.data.registry import DATASETS, DataNotFound, dataset_path, get_dataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``data`` sub-commands to ``parser``."""
    parser.add_argument("--data-dir", default=None, help="a local copy laid out like ../shared/data (overrides $TURNGYM_DATA)")
    sub = parser.add_subparsers(dest="data_cmd", metavar="{list,download,add,path}")
    sub.add_parser("list", help="datasets, their status and where they come from")
    dl = sub.add_parser("download", help="download a dataset into the cache (SHA-256 checked, resumable)")
    dl.add_argument("name", help="dataset name (see `turngym data list`)")
    dl.add_argument("--force", action="store_true", help="download again even if already complete")
    add = sub.add_parser("add", help="unpack a local archive of a dataset (or copy a folder) into the cache, "
                                     "e.g. ALFWorld's train_json_2.1.1.tar.xz")
    add.add_argument("name", help="dataset name (see `turngym data list`)")
    add.add_argument("path", help="a zip or tar archive (.tar.xz, .tar.gz, ...) or a folder laid out as the dataset")
    add.add_argument("--into", default=None, help="a data folder to add to (INTO/NAME, e.g. $TURNGYM_DATA) "
                                                  "instead of the download cache")
    p = sub.add_parser("path", help="print the folder a dataset is read from")
    p.add_argument("name")


def main(args: argparse.Namespace) -> int:
    """Run a ``data`` sub-command; returns the process exit code."""
    cmd = getattr(args, "data_cmd", None) or "list"
    data_dir = getattr(args, "data_dir", None)
    if cmd == "list":
        for name in sorted(DATASETS):
            ds = DATASETS[name]
            try:
                where = str(dataset_path(name, data_dir))
            except DataNotFound:
                where = "not available (turngym data download %s)" % name
            print(f"{name:10s} {ds.description}\n{'':10s} licence: {ds.license}; source: {ds.homepage}\n{'':10s} at: {where}")
        return 0
    try:
        get_dataset(args.name)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if cmd == "path":
        try:
            print(dataset_path(args.name, data_dir))
            return 0
        except DataNotFound as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if cmd == "add":
        from turngym.data.local import add_local

        try:
            print(add_local(args.name, args.path, into=args.into))
            return 0
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if cmd == "download":
        from turngym.data.downloader import ChecksumError, DownloadError, download

        try:
            print(download(args.name, force=args.force))
            return 0
        except (ChecksumError, DownloadError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    print(f"error: unknown data command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="turngym data")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
