#!/usr/bin/env python3
"""Print the requirements of base-sglang (core plus the given extras) from pyproject.toml.

The Dockerfile installs these in a layer of their own, before the source is copied, so a
source edit does not reinstall the dependencies. Self-references such as
`base-sglang[server]` inside an extra are expanded recursively.

    python3 deploy/requirements.py [--pyproject PATH] EXTRA...
"""

import argparse
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="extras to include, e.g. server or sglang")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    project = tomllib.loads(args.pyproject.read_text())["project"]
    print("\n".join(resolve(project, args.extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
