"""External task data: a registry of datasets, download with SHA-256 and resume, local copies.

    from turngym.data import dataset_path
    root = dataset_path("spider")          # $TURNGYM_DATA/spider, or the download cache
    turngym.data.download("hotpotqa")      # what `turngym data download hotpotqa` does

Nothing here imports more than the standard library and httpx (lazily, in ``download``).
"""

from turngym.data import catalog as _catalog  # noqa: F401  (registers the built-in datasets)
from turngym.data.registry import (
    DATASETS,
    ENV_CACHE,
    ENV_DATA,
    Dataset,
    DataNotFound,
    RemoteFile,
    cache_root,
    dataset_path,
    download_dir,
    get_dataset,
    register_dataset,
)
from turngym.data.warn import forget_warnings, warn_once


def download(name: str, **kwargs):
    """Download dataset ``name`` into the cache; see ``turngym.data.downloader.download``."""
    from turngym.data.downloader import download as _download

    return _download(name, **kwargs)


def list_datasets() -> dict[str, str]:
    """Registered dataset names with their one-line descriptions."""
    return {n: d.description for n, d in sorted(DATASETS.items())}


__all__ = [
    "DATASETS", "Dataset", "RemoteFile", "DataNotFound", "ENV_DATA", "ENV_CACHE",
    "cache_root", "dataset_path", "download", "download_dir", "get_dataset", "list_datasets",
    "register_dataset", "warn_once", "forget_warnings",
]
