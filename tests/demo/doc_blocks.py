"""Run a page's code blocks as printed, in order, as a user would from an empty directory.

A fenced block tagged ``sh`` runs in bash (``set -e``), and the environment it leaves (a ``. mesh/x.env``)
is the environment of the blocks after it; a block tagged ``python`` runs in one interpreter that lives
for the whole page, so that names carry from block to block as in a REPL, in the environment of the
``sh`` blocks before it. Untagged blocks are syntax references (placeholders such as ``--path P``) and
are not run; a ``python from examples/x.py`` block shows lines of an example, which must stand in that
file as printed (:func:`missing_from_source`; the example itself runs). Three kinds of shell line are
not run here, each checked instead:

* ``python3 -m venv`` and ``. .venv/bin/activate``: the page runs in the test's own environment;
* ``pip install ...``: tests/packaging/test_extras_install.py installs each such line in a fresh venv;
* ``countersign demo --keep-running --workdir mesh``, "in a second terminal": the caller started exactly
  that command (:func:`start_kept_mesh`) in the page's directory before the page runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.S | re.M)
KEPT_MESH = "countersign demo --keep-running --workdir mesh"
NOT_RUN_HERE = ("python3 -m venv", ". .venv/bin/activate", "pip install ")

# One interpreter for a page: reads {"code", "env"} lines, runs each in one namespace with its stdout
# captured, answers {"out", "error"}; {"eval": expr} answers repr-free JSON of the expression.
DRIVER = r"""
import contextlib, io, json, os, sys, traceback
namespace = {"__name__": "__main__"}
answers = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    out = io.StringIO()
    error = None
    value = None
    try:
        with contextlib.redirect_stdout(out):
            if "eval" in request:
                value = eval(request["eval"], namespace)
            else:
                os.environ.clear()
                os.environ.update(request["env"])
                exec(compile(request["code"], request["name"], "exec"), namespace)
    except BaseException:
        error = traceback.format_exc()
    answers.write(json.dumps({"out": out.getvalue(), "error": error, "value": value}) + "\n")
    answers.flush()
"""


@dataclass(frozen=True)
class Block:
    language: str
    info: str  # the rest of the fence line (e.g. "from examples/x.py")
    code: str
    section: str


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its language and the ``##`` section it stands in."""
    found = []
    section = ""
    text = page.read_text()
    position = 0
    for match in BLOCK.finditer(text):
        for heading in re.findall(r"^## (.+)$", text[position : match.start()], re.M):
            section = heading
        position = match.end()
        found.append(Block(match.group(1), match.group(2).strip(), match.group(3), section))
    return found


def missing_from_source(block: Block, repo: Path) -> list[str]:
    """The lines of an excerpt block (``python from examples/x.py``) not in that file as printed."""
    source = (repo / block.info.removeprefix("from ").strip()).read_text().splitlines()
    return [line for line in block.code.splitlines() if line.strip() and line not in source]


def command_of(line: str) -> str:
    """A shell line without its trailing comment."""
    return line.split("  #", 1)[0].split(" # ", 1)[0].strip()


@dataclass
class PageRun:
    """The page's directory, the environment its ``sh`` blocks built, and its one interpreter."""

    cwd: Path
    env: dict[str, str]
    name: str
    outputs: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._python = subprocess.Popen(
            [sys.executable, "-c", DRIVER], cwd=self.cwd, env=self.env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def _ask(self, request: Mapping[str, object]) -> dict[str, object]:
        assert self._python.stdin is not None
        assert self._python.stdout is not None
        self._python.stdin.write(json.dumps(request) + "\n")
        self._python.stdin.flush()
        answer = self._python.stdout.readline()
        assert answer, "the page's interpreter died"
        return dict(json.loads(answer))

    def run(self, block: Block) -> str:
        """Run one block; its printed output. Raises AssertionError with the block's error."""
        if block.info.startswith("from "):  # lines of an example: see excerpt_source
            return ""
        if block.language == "python":
            answer = self._ask({"code": block.code, "env": self.env, "name": f"{self.name} ({block.section})"})
            assert answer["error"] is None, f"{self.name}, {block.section}:\n{block.code}\n{answer['error']}"
            out = str(answer["out"])
        elif block.language == "sh":
            out = self._shell(block)
        else:
            return ""
        self.outputs.append(out)
        return out

    def _shell(self, block: Block) -> str:
        lines = []
        for line in block.code.splitlines():
            command = command_of(line)
            if command == KEPT_MESH or command.startswith(NOT_RUN_HERE):
                self.skipped.append(command)
            elif command:
                lines.append(line)
        script = "set -e\n" + "\n".join(lines) + '\nenv -0 > "$COUNTERSIGN_DOC_ENV"\n'
        dump = self.cwd / ".doc-env"
        done = subprocess.run(
            ["bash", "-c", script], cwd=self.cwd, env={**self.env, "COUNTERSIGN_DOC_ENV": str(dump)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{self.name}, {block.section}:\n{block.code}\n{done.stdout}{done.stderr}"
        env = dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
        env.pop("COUNTERSIGN_DOC_ENV", None)
        dump.unlink()
        self.env = env
        return done.stdout

    def value(self, expression: str) -> object:
        """The JSON value of ``expression`` in the page's namespace."""
        answer = self._ask({"eval": expression})
        assert answer["error"] is None, answer["error"]
        return answer["value"]

    def close(self) -> None:
        assert self._python.stdin is not None
        self._python.stdin.close()
        self._python.wait(timeout=30)


def run_page(page: Path, cwd: Path, env: Mapping[str, str], *, only: set[str] | None = None) -> PageRun:
    """Run every ``sh`` and ``python`` block of ``page`` (of the sections in ``only``, if given)."""
    run = PageRun(cwd, dict(env), page.name)
    try:
        for block in blocks(page):
            if only is None or block.section in only:
                run.run(block)
    except BaseException:
        run.close()
        raise
    return run


@dataclass
class KeptMesh:
    """``countersign demo --keep-running --workdir mesh`` running in ``cwd``; ``mesh.json`` read back."""

    cwd: Path
    process: subprocess.Popen[str]
    description: dict[str, object]

    @property
    def root(self) -> Path:
        return self.cwd / "mesh"


@contextmanager
def start_kept_mesh(cwd: Path, timeout_s: float = 240) -> Iterator[KeptMesh]:
    """Run :data:`KEPT_MESH` in ``cwd`` (as the user does in a second terminal) until its settings are
    written, yield it, then stop it with SIGTERM and check it stopped cleanly."""
    argv = [sys.executable, "-m", "countersign_cli", *shlex.split(KEPT_MESH)[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSIGN_")}
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    described = cwd / "mesh" / "mesh.json"
    try:
        deadline = time.monotonic() + timeout_s
        while not described.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the kept mesh never wrote mesh.json"
            time.sleep(0.2)
        time.sleep(0.2)  # written by one write_text: let it finish
        yield KeptMesh(cwd, process, json.loads(described.read_text()))
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, out + err
        assert "Traceback" not in err, err
