#!/usr/bin/env python3
"""The layers' order among include/xfmr's folders (docs/DESIGN.md, "The
layers"): a header includes headers of its own folder and of the folders
below it, never above. The compiled sources follow the same order: a file
of src/ or cuda/ sits at the level of the header it implements (the one of
its name, or SOURCE_LEVELS below) and includes nothing above it.

    check_include_order.py [INCLUDE_DIR]   (default: include/xfmr beside this script;
                                            src/ and cuda/ beside INCLUDE_DIR's include/)

Exits 1, naming each file, line and edge, when a header includes upward,
or when an edge listed in KNOWN_UPWARD is gone (take it off the list: the
list only shrinks). Exits 0 otherwise."""
import os
import re
import sys

# Bottom to top. presets.hpp (the shipped configurations, the families)
# sits with the models; xfmr.hpp, the umbrella, above everything.
ORDER = ["core", "backend", "layers", "blocks", "models", "text", "io", "infer", "train"]
TOP_LEVEL = {"presets.hpp": "models", "xfmr.hpp": None}

# The compiled sources without a header of their name: their level.
SOURCE_LEVELS = {
    "cpu_backend_float.cpp": "backend", "cpu_backend_double.cpp": "backend", "onednn.cpp": "backend",
    "utf8.cpp": "text", "gpt2_checkpoint.cpp": "io",
    # The compiled sources' own helpers: the files' writes, JSON's bounds.
    "file_writes.hpp": "core", "json_bounds.hpp": "core",
    # A family's models instantiated for a backend: the models' level.
    "language_models.cpp": "models",
    "classifier_models.cpp": "models", "translation_models.cpp": "models",
}

# Upward edges allowed for now, each to be removed by moving what it needs
# down: none is left; a new one fails the check.
KNOWN_UPWARD: set = set()


def level(path):
    """The folder's place in ORDER (None: above every folder)."""
    parts = path.split("/")
    if len(parts) == 1:
        if path not in TOP_LEVEL:
            sys.exit(f"check_include_order: {path}: a header outside the folders; give it a level in TOP_LEVEL")
        folder = TOP_LEVEL[path]
    else:
        folder = parts[0]
    if folder is None:
        return None
    if folder not in ORDER:
        sys.exit(f"check_include_order: {path}: folder {folder!r} is not in ORDER; give it its place")
    return ORDER.index(folder)


def source_level(root, path):
    """A compiled source's level: its header's (the header of its name), a
    kernel's (cuda/*.cu, src/kernels/: backend), or SOURCE_LEVELS'."""
    name = os.path.basename(path)
    stem, ext = os.path.splitext(name)
    if name in SOURCE_LEVELS:
        return ORDER.index(SOURCE_LEVELS[name])
    if ext in (".cu", ".cuh") or "/kernels/" in path:
        return ORDER.index("backend")
    for directory, _, files in os.walk(root):
        if stem + ".hpp" in files:
            return level(os.path.relpath(os.path.join(directory, stem + ".hpp"), root).replace(os.sep, "/"))
    sys.exit(f"check_include_order: {path}: no header of its name; give it a level in SOURCE_LEVELS")


def check_sources(root, include, problems):
    """src/ and cuda/ against their levels; the number of files read."""
    top = os.path.normpath(os.path.join(root, "..", ".."))
    count = 0
    for folder in ("src", "cuda"):
        for directory, _, files in os.walk(os.path.join(top, folder)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".cu", ".cuh", ".hpp")):
                    continue
                path = os.path.relpath(os.path.join(directory, name), top).replace(os.sep, "/")
                own = source_level(root, path)
                count += 1
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = include.match(line)
                        if not m:
                            continue
                        theirs = level(m.group(1))
                        if theirs is None or theirs > own:
                            problems.append(f"{path}:{number}: includes {m.group(1)}, above its level ({ORDER[own]})")
    return count


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "include", "xfmr")
    include = re.compile(r'\s*#\s*include\s+"xfmr/([^"]+)"')
    problems, seen, headers = [], set(), 0
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith((".hpp", ".h", ".cuh")):
                continue
            path = os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")
            headers += 1
            own = level(path)
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = include.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    theirs = level(target)
                    if own is None or (theirs is not None and theirs <= own):
                        continue
                    if (path, target) in KNOWN_UPWARD:
                        seen.add((path, target))
                        continue
                    problems.append(f"{path}:{number}: includes {target}, a layer above "
                                    f"({ORDER[own]} < {target.split('/')[0] if '/' in target else target})")
    sources = check_sources(root, include, problems)
    for path, target in sorted(KNOWN_UPWARD - seen):
        problems.append(f"{path}: no longer includes {target}: take the edge off KNOWN_UPWARD")
    if headers == 0:
        problems.append(f"no headers under {root}")
    for p in problems:
        print(p)
    print(f"check_include_order: {headers} headers, {sources} sources, {len(seen)} known upward edges, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
