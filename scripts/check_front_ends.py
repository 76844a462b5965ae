#!/usr/bin/env python3
"""The front ends assemble nothing the library's engine and run own.

The programs (examples/), the server (server/) and the Python module (python/) decode
through xfmr::Engine (infer/engine.hpp) and train through the library's
run: none of them names WeightCopies, Generator, ContinuousBatcher, AdamW
or Trainer in its code (comments and strings aside). KNOWN lists the
places that still do, as debts: the check fails on a new one, and on a
listed one that is gone (take it off the list), so the list only shrinks.

    scripts/check_front_ends.py ROOT    (the repository; exit 1 on a failure)
"""
import pathlib
import re
import sys

NAMES = ("WeightCopies", "Generator", "ContinuousBatcher", "AdamW", "Trainer")
FOLDERS = ("examples", "server", "python")

# (file, name): a front end that builds it itself still. None does: a new
# one fails the check.
KNOWN: set = set()

COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'', re.S)


def uses(path):
    code = COMMENT_OR_STRING.sub(" ", path.read_text(encoding="utf-8"))
    return {n for n in NAMES if re.search(r"\b" + n + r"\b", code)}


def main(root):
    root = pathlib.Path(root)
    found = set()
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".cpp", ".hpp", ".h", ".cc"):
                rel = path.relative_to(root).as_posix()
                found |= {(rel, n) for n in uses(path)}
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    for rel, n in new:
        print(f"{rel}: builds a {n} itself; go through the library's Engine or training run")
    for rel, n in gone:
        print(f"{rel}: no longer names {n}: take it off KNOWN in {pathlib.Path(__file__).name}")
    debts = sorted(found & KNOWN)
    print(f"{len(debts)} known debts: " + ", ".join(f"{r} {n}" for r, n in debts))
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
