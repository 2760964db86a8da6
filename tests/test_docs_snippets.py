"""Every ```python block of README.md and docs/*.md runs as written, on CPU, and the docs cite only files that exist.

Blocks of one file run in order in one fresh namespace (a later block may use an earlier block's names); each file
gets its own namespace and its own temporary working directory, so a snippet that writes files leaves nothing in
the checkout. ```bash blocks and unlabelled blocks are not run.

A block opts out only when it is a GPU or network example, marked by an HTML comment on the line right before
its fence::

    <!-- snippet: skip (needs CUDA) -->

The reason must name CUDA, a GPU, the network or a download, and such blocks stay few (checked below).
"""
from __future__ import annotations

import pathlib
import re
from typing import NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)")
_SKIP = re.compile(r"^\s*<!--\s*snippet:\s*skip\s*\((?P<reason>[^)]*)\)\s*-->\s*$")
_SKIP_REASONS = ("cuda", "gpu", "network", "download")
_MAX_SKIPPED = 4


class Block(NamedTuple):
    """One fenced code block of a markdown file.

    Attributes:
        path: the markdown file.
        line: 1-based line number of the opening fence.
        lang: the fence's language tag (``""`` when none).
        code: the block's text, de-indented by the fence's indentation.
        skip: the reason of a ``<!-- snippet: skip (...) -->`` marker right before the fence, or ``None``.
    """

    path: pathlib.Path
    line: int
    lang: str
    code: str
    skip: str | None


def code_blocks(path: pathlib.Path) -> list[Block]:
    """Every fenced code block of ``path``, in file order.

    Args:
        path: a markdown file.

    Returns:
        A list of :class:`Block`.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, start = len(opened["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _SKIP.match(previous)
        blocks.append(Block(path, start + 1, opened["lang"].lower(), "\n".join(body) + "\n",
                            marker["reason"].strip() if marker else None))
        i += 1
    return blocks


def python_blocks(path: pathlib.Path) -> list[Block]:
    """The ```python blocks of ``path``.

    Args:
        path: a markdown file.

    Returns:
        A list of :class:`Block` whose language is ``python``.
    """
    return [b for b in code_blocks(path) if b.lang == "python"]


FILES_WITH_PYTHON = [p for p in DOC_FILES if python_blocks(p)]


def test_docs_have_python_snippets():
    assert (ROOT / "README.md") in FILES_WITH_PYTHON
    assert len(FILES_WITH_PYTHON) >= 5, [p.name for p in FILES_WITH_PYTHON]


@pytest.mark.parametrize("path", FILES_WITH_PYTHON, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_snippets_run(path, tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"snippets_of_{path.stem}"}
    ran = 0
    for block in python_blocks(path):
        if block.skip is not None:
            continue
        where = f"{path.relative_to(ROOT)}:{block.line}"
        try:
            exec(compile(block.code, where, "exec"), namespace)  # noqa: S102 -- running the docs is the test
        except Exception as error:  # name the block: pytest's traceback shows only "<string>" lines otherwise
            raise AssertionError(f"the ```python block at {where} failed: {type(error).__name__}: {error}") from error
        ran += 1
    plt.close("all")
    assert ran >= 1, f"{path.name}: every python block is skipped"


def test_skipped_snippets_are_few_and_justified():
    skipped = [b for p in DOC_FILES for b in python_blocks(p) if b.skip is not None]
    for block in skipped:
        assert any(word in block.skip.lower() for word in _SKIP_REASONS), (
            f"{block.path.name}:{block.line}: a block may be skipped only as a GPU / network example; "
            f"say which in the marker, e.g. <!-- snippet: skip (needs CUDA) -->, or make it run on CPU"
        )
    assert len(skipped) <= _MAX_SKIPPED, [f"{b.path.name}:{b.line}" for b in skipped]


def test_skip_markers_sit_right_before_a_python_block():
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        markers = [i for i, line in enumerate(lines) if "snippet:" in line and "<!--" in line]
        marked = {b.line - 1 for b in python_blocks(path) if b.skip is not None}
        for i in markers:
            nxt = next((j for j in range(i + 1, len(lines)) if lines[j].strip()), None)
            assert _SKIP.match(lines[i]) and nxt in marked, (
                f"{path.name}:{i + 1}: a snippet marker must read <!-- snippet: skip (reason) --> and sit right "
                "before a ```python fence"
            )


# What the docs may not cite: files outside the repository.
_FOREIGN = ("../shared", "/work/", "/root/", "/home/", "DESIGN.md", "research/", "seeds/")
_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")
_REPO_PATH = re.compile(r"`((?:docs|examples|tests|specdec|notebooks)/[^`\s]*)`")


def _expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    return [x for alt in match[1].split(",")
            for x in _expand_braces(text[:match.start()] + alt + text[match.end():])]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_only_files_in_the_repository(path):
    text = path.read_text(encoding="utf-8")
    for needle in _FOREIGN:
        assert needle not in text, (
            f"{path.relative_to(ROOT)} cites {needle!r}, which is not in the repository: state the fact inline "
            "(with its paper) or point at a file in the repo"
        )
    for link in _LINK.findall(text):
        target = (path.parent / link.split("#")[0]).resolve()
        assert target.exists(), f"{path.relative_to(ROOT)} links to {link}, which does not exist"
    for cited in _REPO_PATH.findall(text):
        for one in _expand_braces(cited.split("::")[0].rstrip(".,;:")):
            assert (ROOT / one).exists(), f"{path.relative_to(ROOT)} cites `{one}`, which does not exist"
