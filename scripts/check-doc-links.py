#!/usr/bin/env python3
"""Check that every relative link in README.md and docs/src/*.md resolves:
the file exists and, for `#anchor`, a heading with that id is in it.
`mdbook build` does not check links, so CI runs this beside it.

    python3 scripts/check-doc-links.py      # exit 1 and one line per broken link
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(path):
    """The lines of a Markdown file outside fenced code blocks."""
    inside = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, line


def slug(heading):
    # The ids GitHub and mdBook give headings: lowercase, spaces to
    # hyphens, everything but letters, digits, `-` and `_` dropped.
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading).strip().lower()
    return "".join(c for c in text.replace(" ", "-") if c.isalnum() or c in "-_")


def anchors(path):
    seen = {}
    out = set()
    for _, line in prose(path):
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            k = seen.get(s, 0)
            out.add(s if k == 0 else f"{s}-{k}")
            seen[s] = k + 1
    return out


def main():
    files = [ROOT / "README.md", *sorted((ROOT / "docs" / "src").glob("*.md"))]
    bad = []
    for f in files:
        for n, line in prose(f):
            # Inline code is not a link.
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"[a-z]+:", target):
                    continue  # an absolute URL
                path, _, frag = target.partition("#")
                dest = (f.parent / path).resolve() if path else f
                where = f"{f.relative_to(ROOT)}:{n}: {target}"
                if not dest.is_relative_to(ROOT):
                    continue  # beside the repository (../shared/SPEC.md): not ours to check
                if not dest.exists():
                    bad.append(f"{where}: no such file")
                elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                    bad.append(f"{where}: no heading #{frag}")
    for b in bad:
        print(b)
    print(f"{len(files)} files checked, {len(bad)} broken links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
