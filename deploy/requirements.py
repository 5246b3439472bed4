#!/usr/bin/env python3
"""Print the requirements of base-sglang (core plus the given extras) from pyproject.toml.

The Dockerfile installs these in a layer of their own, before the source is copied, so a
source edit does not reinstall the dependencies. Self-references such as
`base-sglang[server]` inside an extra are expanded recursively.

    python3 deploy/requirements.py [--pyproject PATH] [--skip-installed] EXTRA...

--skip-installed drops the requirements whose distribution is already installed (the GPU image:
SGLang's own pins win over ours) and reports on stderr where the two disagree.
"""

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib

PROJECT = "base-sglang"
_SELF_REF = re.compile(r"^\s*base[-_.]sglang\s*\[([^\]]+)\]\s*$", re.IGNORECASE)


def resolve(project: dict, extras: list[str]) -> list[str]:
    """Core dependencies plus every extra (recursively), in first-seen order, no duplicates."""
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            known = ", ".join(sorted(optional)) or "none"
            raise SystemExit(f"unknown extra {extra!r} of {PROJECT} (known: {known})")
        seen.add(extra)
        for req in optional[extra]:
            match = _SELF_REF.match(req)
            if match:
                todo.extend(name.strip() for name in match.group(1).split(","))
            elif req not in out:
                out.append(req)
    return out


def _split(req: str) -> tuple[str, str]:
    """(distribution name, version specifier) of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)", req)
    return match.group(1), match.group(2).strip()


def _satisfied(version: str, spec: str) -> bool:
    if not spec:
        return True
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # no `packaging`: report every versioned requirement
        return False
    return SpecifierSet(spec).contains(version, prereleases=True)


def skip_installed(reqs: list[str]) -> tuple[list[str], list[str]]:
    """(requirements of distributions not installed, notes where an installed one disagrees)."""
    keep, notes = [], []
    for req in reqs:
        name, spec = _split(req)
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            keep.append(req)
            continue
        if not _satisfied(version, spec):
            notes.append(f"{name}: keeping the installed {version} (base-sglang asks {spec})")
    return keep, notes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="extras to include, e.g. server or sglang")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--skip-installed", action="store_true",
                        help="leave out distributions that are already installed")
    args = parser.parse_args(argv)
    project = tomllib.loads(args.pyproject.read_text())["project"]
    reqs = resolve(project, args.extras)
    if args.skip_installed:
        reqs, notes = skip_installed(reqs)
        for note in notes:
            print(f"requirements.py: {note}", file=sys.stderr)
    print("\n".join(reqs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
