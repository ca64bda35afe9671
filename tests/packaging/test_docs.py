"""The documents a newcomer reads: README stays a short user's guide, and every relative link resolves (in the
results summaries too)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 12 * 1024
# the results summaries too: they link each other, their raw files and the docs
DOCUMENTS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "benchmarks" / "results").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target): inline Markdown links


def relative_targets(text: str) -> list[str]:
    """Link targets that name a file of this repository (no scheme, no pure anchor), without their anchor."""
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_readme_is_a_short_guide():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move measurements and narratives to docs/"
    )


def test_the_readme_keeps_the_command_ci_runs():
    # .ci/run runs "the README's test command": the two must stay the same command.
    assert "bash deploy/dev.sh test" in (ROOT / "README.md").read_text()
    assert "deploy/dev.sh test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    missing = [t for t in relative_targets(doc.read_text()) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to paths that do not exist: {missing}"


def test_the_link_reader_sees_links():
    text = "[a](docs/x.md) [b](https://e.org/y) [c](#part) [d](../z.md#sec) words (plain) [e] (f)"
    assert relative_targets(text) == ["docs/x.md", "../z.md"]
