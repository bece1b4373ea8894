"""``SWEEnv``: fix a bug in a small Python repository inside a sandbox; hidden tests grade it.

Each episode gets a fresh sandbox (a warm container on Docker) holding the repo at its buggy
state, without git history and without the hidden tests. The agent works through ``bash``,
``view_file``, ``edit_file`` and ``run_tests`` (visible tests only) and ends with ``submit``.
Grading (``grading.py``) then kills whatever the agent left running, reads only the allow-listed
source files out of its sandbox, closes it, and runs the hidden cases on those files in a second,
fresh sandbox where no agent process ever ran. The agent's code returns values there; this
process compares them with the expected ones, which never enter a sandbox. The outcome is 1 when
every hidden case returns the expected values.

Signals for G-RA / metrics in ``info``: ``file_modified`` (this step changed the repo),
``visible_tests_passed`` (on steps that ran the tests: the fraction of the cases the agent was
shown, the statement's example and the visible tests', that its source files pass, judged by the
grader as at submit; nothing the agent's code prints moves it), ``modified`` and ``submitted``
(episode so far), ``won``.

Whatever the sandbox answers, a step returns: a tool whose sandbox call fails gives an error
observation, and a failure to read the sandbox's state after the tools ran (the repo digest)
ends the episode, truncated, with ``info["truncated_reason"]``, and closes the sandbox (the next
reset starts a fresh one). The digest walks at most ``MAX_REPO_ENTRIES`` files and directories:
a repo with more gets an error observation, not a step of minutes.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.swe import grading
from turngym.envs.swe.task import SWETask, apply_edit
from turngym.tools.base import Tool
from turngym.tools.formats import MAX_CALLS_PER_ACTION
from turngym.tools.sandbox import Sandbox, SandboxConfig, SandboxError, SandboxProvider
from turngym.types import Message, ToolCall

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository (the current directory, {workdir}). "
    "Inspect the code, edit files, and run the visible tests with the tools. There is no network. "
    "When the bug is fixed, call submit: hidden tests then grade your fix and the episode ends."
)
MAX_REPO_ENTRIES = 10_000  # files and directories the repo digest walks (a task's repo has tens)
DIGEST_TIMEOUT_S = 20.0
TOO_MANY_FILES = "too-many-files"  # the digest of a repo past MAX_REPO_ENTRIES
# The repo digest, in the sandbox: first a count that stops at $1 + 1 entries, then the hash of
# every file (caches left out), the list cut at $1 entries however it grew in between. Only one
# line leaves the sandbox.
_PRUNE = r"\( -type d \( -path ./.pytest_cache -o -name __pycache__ \) \) -prune -o"
_DIGEST = (f'n=$(find . {_PRUNE} -print | head -n $(($1 + 1)) | wc -l); [ "$n" -le "$1" ] || {{ echo {TOO_MANY_FILES}; exit 0; }}; '
           f'find . {_PRUNE} -type f -print0 | head -z -n "$1" | sort -z | xargs -0 -r sha1sum | sha1sum | cut -c1-40')
_MUTATIONS = {  # random single-token edits for the random-admissible baseline
    "op": ["+", "-", "*", "//", "%", "<", "<=", ">", ">=", "==", "!="],
    "num": ["0", "1", "2", "-1"],
    "word": ["and", "or", "not", "min", "max", "True", "False"],
}
_TOKEN = re.compile(r"//|<=|>=|==|!=|[-+*%<>]|\b\d+\b|\b(?:and|or|not|min|max|True|False)\b")
MAX_VIEW_LINES = 400  # lines one view_file shows
MAX_LINE_BYTES = 1000  # bytes of one line view_file shows
MAX_EDIT_BYTES = 2**20  # edit_file reads the file into this process: larger files are edited with bash
# view_file inside the sandbox: the line count and only the lines shown leave it, each cut short.
_VIEW = ('f=$1; a=$2; b=$3; if [ -d "$f" ]; then echo dir; find "$f" -maxdepth 2 -not -path "*/__pycache__*" '
         '| head -n 300; exit 0; fi; [ -f "$f" ] || { echo "no such file: $f" >&2; exit 2; }; '
         'n=$(wc -l < "$f"); [ -n "$(tail -c 1 "$f")" ] && n=$((n+1)); echo "file $n"; '
         '[ "$b" -ge "$a" ] && sed -n "${a},${b}p;${b}q" "$f" | cut -b "1-$4" | head -c "$5"; true')


class SWEEnv(TextEnv):
    """Fix a bug in a small Python repo in a sandbox; graded by hidden tests after submit.

    Args:
        suite: ``synthetic`` (bundled, generated) or ``quixbugs`` (needs the data).
        split: ``train`` / ``test`` (disjoint); QuixBugs also has ``all``.
        n_tasks: Tasks in the split (synthetic: generated, default 45 train / 15 test; QuixBugs:
            the first N programs of the split).
        data_dir: Local QuixBugs copy (default: ``$TURNGYM_DATA`` or the download cache).
        sandbox: Backend: ``auto`` (Docker, else bubblewrap), ``docker``, ``bwrap`` or ``local``
            (unsafe, unit tests only).
        sandbox_config: Sandbox limits (default: ``SandboxConfig(timeout_s=command_timeout_s)``).
        pool_size: Warm Docker containers kept ready for resets.
        command_timeout_s: Limit for one ``bash`` command.
        test_timeout_s: Limit for one visible test (pytest-timeout), and CPU seconds for one hidden case.
        grade_timeout_s: Limit for a whole test run (visible tests or grading).
        **kw: ``TextEnv`` arguments (``tool_format``, ``scripted_hints``, ...).

    Raises:
        ValueError: Unknown suite or split.
        turngym.data.DataNotFound: QuixBugs data missing.
        SandboxError: (on reset) no sandbox backend can run here.
    """

    def __init__(
        self,
        suite: str = "synthetic",
        split: str = "train",
        n_tasks: int | None = None,
        data_dir: str | None = None,
        sandbox: str = "auto",
        sandbox_config: SandboxConfig | None = None,
        pool_size: int = 1,
        command_timeout_s: float = 30.0,
        test_timeout_s: float = 10.0,
        grade_timeout_s: float = 120.0,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.suite, self.split = suite, split
        self._tasks = _load_suite(suite, split, n_tasks, data_dir)
        self.task_ids = list(self._tasks)
        self.command_timeout_s = command_timeout_s
        self.test_timeout_s, self.grade_timeout_s = test_timeout_s, grade_timeout_s
        # The sandbox bounds every call; this only catches a wedged engine: the most calls one
        # step may make, each at its longest (run_tests: the visible tests, then the grader's
        # run of the shown cases), with the host's grace per call.
        self.step_deadline_s = MAX_CALLS_PER_ACTION * (max(command_timeout_s, 2 * grade_timeout_s) + 30.0) + 120.0
        config = sandbox_config or SandboxConfig(timeout_s=command_timeout_s)
        self._provider = SandboxProvider(sandbox, config, pool_size)
        self._sb: Sandbox | None = None
        self._task: SWETask | None = None
        self._reset_episode_state()

    # ----- episode ---------------------------------------------------------------------------
    def _reset_episode_state(self) -> None:
        self._digest = self._orig_digest = ""
        self._submitted = self._solved = self._modified = False
        self._grade_report = ""
        self._gold_done: set[int] = set()
        self._step_tests: float | None = None

    def _reset_task(self, task_id: str) -> list[Message]:
        task = self._tasks.get(task_id)
        if task is None:
            raise KeyError(f"unknown task {task_id!r} in SWE {self.suite}/{self.split}")
        if callable(task):  # built on first use
            task = self._tasks[task_id] = task()
        self._close_sandbox()
        self._task = task
        self._reset_episode_state()
        self._sb = self._provider.new()
        self._sb.put_files(task.files)
        self._digest = self._orig_digest = _files_digest(task.files)  # what _repo_digest would say, without an exec
        tree = "\n".join(sorted(task.files))
        return [
            Message("system", SYSTEM_PROMPT.format(workdir=self._sb.workdir)),
            Message("user", f"{task.statement}\n\nRepository files:\n{tree}"),
        ]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        try:
            return self._read_outcome(parsed)
        except Exception as e:  # noqa: BLE001 -- sandbox data never raises out of a step
            reason = f"the sandbox's state could not be read ({type(e).__name__}: {str(e)[:200]}); it was closed"
            self._close_sandbox()
            info = {"file_modified": False, "modified": self._modified, "submitted": self._submitted,
                    "visible_tests_passed": None, "won": self._solved}
            self._step_tests = None
            return StepOutcome(messages=[Message("user", f"Error: {reason}. The episode ends here.")], info=info,
                               truncated_reason=reason)

    def _read_outcome(self, parsed) -> StepOutcome:
        touched = any(c.name in ("bash", "edit_file") for c in parsed.calls)
        file_modified = False
        msgs = []
        if touched and self._sb is not None and not self._sb.closed:
            digest = self._repo_digest()
            if digest == TOO_MANY_FILES:
                msgs.append(Message("user", f"Error: the repository holds more than {MAX_REPO_ENTRIES:,} files and "
                                            "directories; remove what you added (caches aside, a task's repo has tens)."))
            file_modified = digest != self._digest
            self._digest = digest
            self._modified = digest != self._orig_digest
        info = {
            "file_modified": file_modified, "modified": self._modified, "submitted": self._submitted,
            "visible_tests_passed": self._step_tests, "won": self._solved,
        }
        self._step_tests = None
        if self._submitted:
            msgs.append(Message("user", self._grade_report))
        reward = float(self._solved) if self._submitted else 0.0
        return StepOutcome(reward=reward, terminated=self._submitted, messages=msgs, info=info)

    def outcome(self) -> float:
        return float(self._solved)

    def state_key(self) -> str:
        return f"{self.task_id}:{self._digest[:16]}:{int(self._submitted)}"

    def task_type(self, task_id: str) -> str:
        task = self._tasks.get(task_id)
        if callable(task):
            task = self._tasks[task_id] = task()
        return task.task_type if task is not None else "default"

    def close(self) -> None:
        self._close_sandbox()
        self._provider.close()
        super().close()

    def _close_sandbox(self) -> None:
        if self._sb is not None:
            try:
                self._sb.close()
            except SandboxError:
                pass
            self._sb = None

    # ----- tools -----------------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        def bash(command: str) -> str:
            """Run a bash command in the repository root (no network). Returns the exit code and output.

            Args:
                command: the command line, e.g. "grep -rn foo ." or "python3 -c 'print(1)'"
            """
            return self._box().exec(["bash", "-c", command], timeout=self.command_timeout_s).observation(
                self.command_timeout_s)

        def view_file(path: str, start_line: int = 1, end_line: int = 0) -> str:
            """Show a file with line numbers, at most 400 lines at a time (or list a directory).

            Args:
                path: file path relative to the repository root
                start_line: first line to show (1-based)
                end_line: last line to show; 0 means the end of the file
            """
            return self._view(path, start_line, end_line)

        def edit_file(path: str, old_str: str, new_str: str) -> str:
            """Replace the one exact occurrence of old_str in a file with new_str.

            Args:
                path: file path relative to the repository root
                old_str: the exact text to replace (must occur exactly once; include enough context)
                new_str: the replacement text
            """
            return self._edit(path, old_str, new_str)

        def run_tests() -> str:
            """Run the visible tests and show pytest's report."""
            return self._run_visible_tests()

        def submit() -> str:
            """Finish: hidden tests grade your changes and the episode ends."""
            return self._submit()

        return [Tool.from_function(f, timeout_s=None, max_output_chars=8000)
                for f in (bash, view_file, edit_file, run_tests, submit)]

    def _box(self) -> Sandbox:
        if self._sb is None or self._sb.closed:
            raise SandboxError("no sandbox: the episode has not started or the sandbox failed")
        if self._submitted:
            raise SandboxError("the fix was already submitted; the episode is over")
        return self._sb

    def _path(self, path: str) -> str:
        box = self._box()
        full = box.resolve(path)
        if not (full + "/").startswith(box.workdir.rstrip("/") + "/"):
            raise ValueError(f"{path!r} is outside the repository ({box.workdir})")
        return full

    def _view(self, path: str, start_line: int, end_line: int) -> str:
        full = self._path(path)
        first = max(1, int(start_line))
        want = 0 if end_line <= 0 else int(end_line)
        last = first + MAX_VIEW_LINES - 1 if want <= 0 else min(want, first + MAX_VIEW_LINES - 1)
        res = self._box().exec(["sh", "-c", _VIEW, "sh", full, str(first), str(last), str(MAX_LINE_BYTES),
                                str(MAX_VIEW_LINES * (MAX_LINE_BYTES + 1))], timeout=self.command_timeout_s,
                               max_output=MAX_VIEW_LINES * (MAX_LINE_BYTES + 1) + 64)
        head, _, body = res.stdout.partition("\n")
        if res.exit_code != 0 or not head:
            raise FileNotFoundError(res.stderr.strip() or res.observation())
        if head == "dir":
            return body
        n = int(head.split()[1])
        if first > max(1, n):
            return f"Error: {path} has {n} lines; start_line {start_line} is past the end."
        shown, end = min(last, n), (n if want <= 0 else min(want, n))
        lines = body.split("\n")[: shown - first + 1]
        text = "\n".join(f"{first + i:>5}  {ln}" for i, ln in enumerate(lines))
        more = f"; lines {shown + 1}-{end} next, with start_line={shown + 1}" if shown < end else ""
        return f"{path} (lines {first}-{shown} of {n}{more})\n{text}"

    def _edit(self, path: str, old: str, new: str) -> str:
        full = self._path(path)
        try:
            text = self._box().read_file(full, max_bytes=MAX_EDIT_BYTES)
        except SandboxError as e:
            if "larger than" not in str(e):
                raise
            raise ValueError(f"{path} is larger than {MAX_EDIT_BYTES:,} bytes; edit it with bash") from None
        if old == new:
            return "Error: old_str and new_str are identical; nothing to change."
        updated, why = apply_edit(text, old, new)
        if updated is None:
            raise ValueError(f"{path}: {why}")
        self._box().write_file(full, updated)
        rel = full[len(self._box().workdir) + 1:]
        for k, e in enumerate(self._task.gold_edits):
            if (e.path, e.old, e.new) == (rel, old, new):
                self._gold_done.add(k)
        line = text[: text.index(old)].count("\n") + 1
        return f"Edited {path}: replaced {len(old.splitlines())} line(s) at line {line} with {len(new.splitlines())}."

    def _pytest(self, extra: list[str]) -> list[str]:
        return ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "timeout",
                f"--timeout={self.test_timeout_s:g}", *extra]

    def _run_visible_tests(self) -> str:
        box, task = self._box(), self._task
        res = box.exec(self._pytest(["-rf", *task.visible_tests]), timeout=self.grade_timeout_s)
        # pytest's report is for the agent to read; its code can print or patch any of it (an
        # atexit "99 passed", a conftest hook). The signal comes from the grader instead.
        try:
            files = grading.collect_sources(box, task.source_files, kill=False)
        except (grading.SubmitRefused, SandboxError, OSError, tarfile.TarError):
            files = None  # a link or an oversized file: nothing that would pass a submit
        self._step_tests = 0.0 if files is None else grading.shown_cases_passed(
            self._provider.new, task.hidden_cases, files, self.test_timeout_s, self.grade_timeout_s)
        return res.observation(self.grade_timeout_s)

    def _submit(self) -> str:
        box, task = self._box(), self._task
        try:
            files = grading.collect_sources(box, task.source_files)
        except grading.SubmitRefused as e:  # the episode goes on: the agent can put it right
            raise ValueError(f"not submitted: {e}") from None
        except Exception as e:  # noqa: BLE001 -- whatever the sandbox answered, the submit is graded as failed
            files, why = None, f"grading failed: cannot read your files ({type(e).__name__}: {str(e)[:200]})"
        self._submitted = True
        self._close_sandbox()  # nothing the agent started outlives this: grading happens elsewhere
        if files is not None:
            self._solved, why = grading.grade(self._provider.new, task.hidden_cases, files, self.test_timeout_s,
                                              self.grade_timeout_s)
        self._grade_report = f"Submitted. Hidden tests: {why}"
        return "Submitted for grading."

    def _repo_digest(self) -> str:
        """Hash of every file in the repo (caches excluded): detects any change, by any tool. It is
        computed in the sandbox (one line comes back, however many files there are), or
        ``TOO_MANY_FILES`` past ``MAX_REPO_ENTRIES`` files and directories.

        Raises:
            SandboxError: The sandbox answered anything else.
        """
        res = self._sb.exec(["sh", "-c", _DIGEST, "sh", str(MAX_REPO_ENTRIES)], timeout=DIGEST_TIMEOUT_S, max_output=4096)
        digest = res.stdout.strip()
        if res.exit_code == 0 and (digest == TOO_MANY_FILES or re.fullmatch(r"[0-9a-f]{40}", digest)):
            return digest
        raise SandboxError(f"cannot hash the repo: {res.observation(DIGEST_TIMEOUT_S)[:300]}")

    # ----- scripted hints --------------------------------------------------------------------
    def oracle_action(self) -> str | None:
        if self._task is None or self._submitted:
            return None
        for k, e in enumerate(self._task.gold_edits):
            if k not in self._gold_done:
                args = {"path": e.path, "old_str": e.old, "new_str": e.new}
                return self.format.render_call(ToolCall("oracle", "edit_file", args))
        return self.format.render_call(ToolCall("oracle", "submit", {}))

    def admissible_actions(self) -> list[str] | None:
        if self._task is None or self._submitted or self._sb is None or self._sb.closed:
            return None
        calls = [ToolCall("a", "run_tests", {}), ToolCall("a", "submit", {}),
                 ToolCall("a", "bash", {"command": "ls -R"})]
        try:
            sources = self._sb.read_files([p for p in self._task.source_files if p.endswith(".py")],
                                          max_bytes=MAX_EDIT_BYTES)
        except Exception:  # noqa: BLE001 -- a hint, never a reason for a step to raise
            sources = {}
        for path, text in sources.items():
            calls.append(ToolCall("a", "view_file", {"path": path}))
            calls += _random_edits(path, text, self.np_random, 4)
        return [self.format.render_call(c) for c in calls]


def _files_digest(files: dict[str, str]) -> str:
    """``_repo_digest`` of a repo holding exactly ``files`` (same lines: ``<sha1>  ./<path>``, sorted)."""
    lines = sorted((f"./{p}", hashlib.sha1(t.encode()).hexdigest()) for p, t in files.items())
    return hashlib.sha1("".join(f"{h}  {p}\n" for p, h in lines).encode()).hexdigest()


def _random_edits(path: str, text: str, rng, n: int) -> list[ToolCall]:
    """Up to ``n`` random single-token mutations of unique lines of ``text``."""
    lines = [ln for ln in text.splitlines(keepends=True) if _TOKEN.search(ln) and text.count(ln) == 1]
    calls = []
    for _ in range(n):
        if not lines:
            break
        line = lines[int(rng.integers(len(lines)))]
        toks = list(_TOKEN.finditer(line))
        m = toks[int(rng.integers(len(toks)))]
        kind = "num" if m.group().lstrip("-").isdigit() else "word" if m.group().isalpha() else "op"
        choices = [t for t in _MUTATIONS[kind] if t != m.group()]
        new = choices[int(rng.integers(len(choices)))]
        mutated = line[: m.start()] + new + line[m.end():]
        calls.append(ToolCall("a", "edit_file", {"path": path, "old_str": line, "new_str": mutated}))
    return calls


def _load_suite(suite: str, split: str, n_tasks: int | None, data_dir: str | None) -> dict[str, Any]:
    """Task id -> the task, or a zero-argument builder (synthetic tasks are built on first use)."""
    import functools

    if suite == "synthetic":
        from turngym.envs.swe.synthetic import synthetic_task, synthetic_task_ids

        return {t: functools.partial(synthetic_task, t) for t in synthetic_task_ids(split, n_tasks)}
    if suite == "quixbugs":  # built now: a program that cannot be built leaves the list with a warning
        from turngym.envs.swe.quixbugs import quixbugs_root, quixbugs_tasks

        return dict(quixbugs_tasks(quixbugs_root(data_dir), split, n_tasks))
    raise ValueError(f"unknown SWE suite {suite!r}; choose synthetic or quixbugs")
