"""The docs are read in an hour: all of them together under 25,000 words, and the
performance page under 3,000 (the latest comparison and how to reproduce it; older runs
stay as JSON in bench/results/)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def words(path: Path) -> int:
    return len(path.read_text().split())


def test_the_docs_together_stay_under_25000_words() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    counts = {page.name: words(page) for page in pages}
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    assert total < 25_000, f"{total} words in README.md and docs/ (largest: {largest})"


def test_the_performance_page_stays_under_3000_words() -> None:
    assert words(ROOT / "docs" / "PERFORMANCE.md") < 3_000
