"""The datasets turngym ships loaders for, with their official sources.

A SHA-256 is filled in only where the published file's digest is confirmed (ALFWorld's text
games: the same digest and size recorded by independent downloads of the release asset); a
made-up digest would be worse than none. Every other file is pinned on first download (see
``turngym.data.registry``). Fill ``sha256=`` in once a digest is confirmed.

Local copies follow the layout of ``../shared/data`` (one folder per dataset name); the loaders
also read the official layouts these downloads produce.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from turngym.data.registry import Dataset, RemoteFile, register_dataset

LMRL_COMMIT = "bdf9b3f34617ceba88e0c1774e9ac665c4155468"
LMRL_RAW = f"https://raw.githubusercontent.com/abdulhaim/LMRL-Gym/{LMRL_COMMIT}"
QUIXBUGS_COMMIT = "e8643b6484ccca89b275de34d184ee8198085272"


def lmrl_prepare(folder: Path) -> None:
    """Turn LMRL-Gym's twenty-questions module into ``twenty_questions_objects.json``.

    The object list lives in that module as the literal ``DEFAULT_OBJECT_DICT``; it is read
    with ``ast.literal_eval`` (a literal parser: nothing in the file is executed).
    """
    src = folder / "_twenty_questions_data.py"
    if not src.exists():
        return
    tree = ast.parse(src.read_text(encoding="utf-8"))
    objects = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEFAULT_OBJECT_DICT" for t in node.targets):
            objects = ast.literal_eval(node.value)
    if not isinstance(objects, dict):
        raise ValueError(f"DEFAULT_OBJECT_DICT not found in {src}; the upstream file changed")
    (folder / "twenty_questions_objects.json").write_text(json.dumps(objects, indent=1))
    src.unlink()


def flatten_single_subdir(folder: Path) -> None:
    """GitHub archives unpack into ``repo-<sha>/``; move that folder's contents up one level."""
    subdirs = [p for p in folder.iterdir() if p.is_dir()]
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    if len(subdirs) != 1 or files:
        return
    inner = subdirs[0]
    for p in inner.iterdir():
        shutil.move(str(p), str(folder / p.name))
    inner.rmdir()


register_dataset(Dataset(
    name="spider",
    description="Spider 1.0 text-to-SQL (official zip: SQLite databases + dev.json)",
    files=(RemoteFile(
        "https://drive.usercontent.google.com/download?id=1TqleXec_OykOYFREKKtschzY29dUcVAQ&export=download&confirm=t",
        "spider.zip", extract=True),),
    markers=("questions.csv", "dev.json", "spider/dev.json", "spider_data/dev.json"),
    license="CC BY-SA 4.0",
    homepage="https://yale-lily.github.io/spider",
))

register_dataset(Dataset(
    name="hotpotqa",
    description="HotpotQA dev set, distractor setting (10 paragraphs per question)",
    files=(RemoteFile("http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
                      "hotpot_dev_distractor_v1.json"),),
    markers=("dev_distractor_100.jsonl", "hotpot_dev_distractor_v1.json"),
    license="CC BY-SA 4.0 (attribution must travel with copies)",
    homepage="https://hotpotqa.github.io/",
))

register_dataset(Dataset(
    name="lmrl",
    description="LMRL-Gym word lists: Wordle answers/guesses, cities, twenty-questions objects",
    files=(
        # wordle_official.txt sits next to wordle_official_guess.txt upstream; its path is
        # inferred from that file and from LMRL-Gym's loaders, not checked against the repo here.
        RemoteFile(f"{LMRL_RAW}/llm_rl_scripts/wordle/vocab/wordle_official.txt", "wordle_official.txt"),
        RemoteFile(f"{LMRL_RAW}/llm_rl_scripts/wordle/vocab/wordle_official_guess.txt", "wordle_official_guess.txt"),
        RemoteFile(f"{LMRL_RAW}/llm_rl_scripts/guess_city/env/global_cities.txt", "global_cities.txt"),
        RemoteFile(f"{LMRL_RAW}/llm_rl_scripts/twenty_questions/env/data.py", "_twenty_questions_data.py"),
        RemoteFile(f"{LMRL_RAW}/LICENSE", "LICENSE"),
    ),
    markers=("wordle_official.txt", "global_cities.txt", "twenty_questions_objects.json"),
    license="MIT",
    homepage="https://github.com/abdulhaim/LMRL-Gym",
    prepare=lmrl_prepare,
))

# ALFWorld's text games, every split (train: 3,553 games; valid_seen: 140; valid_unseen: 134), as
# json_2.1.1/<split>/<task>/<trial>/game.tw-pddl; the release asset is 36,507,267 bytes.
ALFWORLD_SHA256 = "5df77ea759f2211a4106082839ddbbb790f1ba4e7d097ed732cf453f72aa36cf"

register_dataset(Dataset(
    name="alfworld",
    description="ALFWorld TextWorld games (json_2.1.1 with tw-pddl files)",
    files=(RemoteFile("https://github.com/alfworld/alfworld/releases/download/0.4.2/json_2.1.3_tw-pddl.zip",
                      "json_2.1.3_tw-pddl.zip", sha256=ALFWORLD_SHA256, extract=True),),
    markers=("json_2.1.1",),
    license="MIT",
    homepage="https://github.com/alfworld/alfworld",
))

register_dataset(Dataset(
    name="quixbugs",
    description="QuixBugs: 40 one-line-bug programs with tests (Python part used)",
    files=(RemoteFile(f"https://github.com/jkoppel/QuixBugs/archive/{QUIXBUGS_COMMIT}.zip",
                      "quixbugs.zip", extract=True),),
    markers=("python_programs",),
    license="MIT",
    homepage="https://github.com/jkoppel/QuixBugs",
    prepare=flatten_single_subdir,
))
