"""Make this checkout importable and its SGLang plugin discoverable without pip (install_bundle.sh).

    python3 benchmarks/gpu/bundle_register.py REPO DEST

What `pip install --no-deps -e REPO` does, for a node without network or build tools:
- DEST/project/sitecustomize.py (Python imports it at startup from PYTHONPATH, in every process
  SGLang spawns too) appends a meta-path finder with pyproject.toml's [tool.setuptools]
  package-dir mapping (base_sglang -> REPO/base_sglang, base_sglang.kernels -> REPO/kernels, ...),
  like setuptools' editable finder: `import base_sglang.kernels` works from any directory,
  including REPO itself, where `python -m` puts REPO/base_sglang (without kernels/) first;
- DEST/site/base_sglang-VERSION.dist-info/ carries METADATA and entry_points.txt (the
  `sglang.srt.plugins` entry point `base = base_sglang.plugin:register`), which
  importlib.metadata (and so sglang's load_plugins()) finds on PYTHONPATH;
- DEST/bin/ gets the console scripts of [project.scripts] (base-serve, ...).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import tomllib

# DEST/project/sitecustomize.py: the finder, then whatever sitecustomize this one shadows
SITECUSTOMIZE = '''"""Written by benchmarks/gpu/bundle_register.py: base-sglang's package layout, without pip."""
import importlib.abc
import importlib.util
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "base_sglang_packages.json")) as _fh:
    _PACKAGES = json.load(_fh)  # dotted package name -> its folder


class _BaseSglangFinder(importlib.abc.MetaPathFinder):
    """Packages of pyproject.toml's package-dir mapping, from their folders in the checkout."""

    def find_spec(self, fullname, path=None, target=None):
        folder = _PACKAGES.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


if not any(isinstance(f, _BaseSglangFinder) for f in sys.meta_path):
    sys.meta_path.append(_BaseSglangFinder())

# chain to the sitecustomize this file hides (if the interpreter has one further down sys.path)
for _entry in sys.path:
    _path = os.path.join(_entry or os.getcwd(), "sitecustomize.py")
    if os.path.abspath(_entry or os.getcwd()) != _HERE and os.path.isfile(_path):
        _spec = importlib.util.spec_from_file_location("_chained_sitecustomize", _path)
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
'''


def read_project(repo: Path) -> dict:
    path = repo / "pyproject.toml"
    if not path.is_file():
        raise SystemExit(f"{repo}: no pyproject.toml (REPO must be the base-sglang checkout)")
    data = tomllib.loads(path.read_text())
    project, tools = data.get("project", {}), data.get("tool", {}).get("setuptools", {})
    for key in ("name", "version"):
        if key not in project:
            raise SystemExit(f"{path}: [project] has no {key!r}")
    return {"name": project["name"], "version": project["version"],
            "entry_points": project.get("entry-points", {}), "scripts": project.get("scripts", {}),
            "package_dir": tools.get("package-dir", {}), "packages": tools.get("packages", [])}


def package_folders(repo: Path, package_dir: dict, packages: list) -> dict[str, str]:
    """Every declared package -> its folder, resolved through package-dir like setuptools does."""
    folders = {}
    for pkg in packages:
        parts = pkg.split(".")
        for cut in range(len(parts), 0, -1):  # the longest mapped prefix wins
            prefix = ".".join(parts[:cut])
            if prefix in package_dir:
                folder = repo / package_dir[prefix] / Path(*parts[cut:])
                break
        else:
            folder = repo / Path(*parts)
        if not (folder / "__init__.py").is_file():
            raise SystemExit(f"package {pkg!r} of pyproject.toml: {folder} is not a package")
        folders[pkg] = str(folder.resolve())
    return folders


def write_dist_info(site: Path, meta: dict) -> Path:
    stem = meta["name"].replace("-", "_")
    for old in site.glob(f"{stem}-*.dist-info"):
        shutil.rmtree(old)
    dist = site / f"{stem}-{meta['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\n"
                                   f"Version: {meta['version']}\n")
    groups = dict(meta["entry_points"])
    if meta["scripts"]:
        groups["console_scripts"] = meta["scripts"]
    lines = []
    for group, entries in groups.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
        lines.append("")
    (dist / "entry_points.txt").write_text("\n".join(lines))
    (dist / "INSTALLER").write_text("base-sglang install_bundle.sh\n")
    return dist


def write_scripts(bin_dir: Path, scripts: dict, python: str) -> list[str]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, value in scripts.items():
        module, _, func = value.partition(":")
        path = bin_dir / name
        path.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\n"
                        f"sys.exit({func}())\n")
        path.chmod(0o755)
    return list(scripts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    repo, dest = args.repo.resolve(), args.dest.resolve()
    if not (dest / "site").is_dir():
        raise SystemExit(f"{dest}/site does not exist: unpack the bundle first")
    meta = read_project(repo)
    folders = package_folders(repo, meta["package_dir"], meta["packages"])
    project = dest / "project"
    if project.exists():
        shutil.rmtree(project)
    project.mkdir()
    (project / "base_sglang_packages.json").write_text(json.dumps(folders, indent=1) + "\n")
    (project / "sitecustomize.py").write_text(SITECUSTOMIZE)
    dist = write_dist_info(dest / "site", meta)
    scripts = write_scripts(dest / "bin", meta["scripts"], sys.executable)
    moved = [f"{k} -> {Path(v).relative_to(repo)}/" for k, v in folders.items()
             if Path(v) != repo.joinpath(*k.split("."))]
    print(f"registered {meta['name']} {meta['version']} from {repo}: {len(folders)} packages "
          f"({'; '.join(moved)})")
    print(f"  {dist.name}: entry points {sorted(meta['entry_points'])}; scripts {scripts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
