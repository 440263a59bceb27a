"""The manual as the tests read it: the README (the front page) and the pages of docs/, in one text
in which each docs page's headings are one level below the README's (a page's title reads as a README
section, `## Title`), so that a statement is found wherever the manual keeps it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOC_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)


def _demoted(text: str) -> str:
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and re.match(r"#{1,5} ", line) else line)
    return "\n".join(out)


MANUAL = "\n\n".join([README] + [_demoted(p.read_text()) for p in DOC_PAGES]) + "\n\n"


def section(title: str, text: str = MANUAL) -> str:
    """From `title` (a heading, `## Title`) to the next heading of its level or above."""
    start = text.index(title)
    body = text.index("\n", start)  # (the next heading after the title's line)
    level = len(title) - len(title.lstrip("#"))
    nxt = re.search(rf"^#{{1,{level}}} ", text[body:], re.M)
    return text[start:body + nxt.start() if nxt else None]
