"""Make this checkout importable and its SGLang plugin discoverable without pip (install_bundle.sh).

    python3 benchmarks/gpu/bundle_register.py REPO DEST

What `pip install --no-deps -e REPO` would do, for a node without network or build tools:
- DEST/project/base_sglang/ holds symlinks that rebuild the installed package layout from
  pyproject.toml's [tool.setuptools] package-dir (base_sglang.kernels -> REPO/kernels, ...), so
  `import base_sglang.kernels` works with DEST/project on PYTHONPATH, and edits in REPO show;
- DEST/site/base-sglang-VERSION.dist-info/ carries METADATA and entry_points.txt (the
  `sglang.srt.plugins` entry point `base = base_sglang.plugin:register`), which
  importlib.metadata (and so sglang's load_plugins()) finds on PYTHONPATH;
- DEST/bin/ gets the console scripts of [project.scripts] (base-serve, ...).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import tomllib


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


def link_packages(repo: Path, project_dir: Path, package_dir: dict, packages: list) -> list[str]:
    """Symlink farm: every top-level package dir, then each remapped sub-package inside it."""
    if project_dir.exists():
        shutil.rmtree(project_dir)
    project_dir.mkdir(parents=True)
    mapping = dict(package_dir) or {p.split(".")[0]: p.split(".")[0] for p in packages}
    made = []
    for pkg, src in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        src_dir = (repo / src).resolve()
        if not (src_dir / "__init__.py").is_file():
            raise SystemExit(f"package-dir {pkg!r} -> {src!r}: {src_dir} is not a package")
        target = project_dir.joinpath(*pkg.split("."))
        if "." not in pkg:  # a real folder whose entries link into the repo: sub-packages fit in
            target.mkdir(parents=True)
            for child in sorted(src_dir.iterdir()):
                if child.name != "__pycache__":
                    (target / child.name).symlink_to(child)
        else:
            if target.is_symlink() or target.exists():
                raise SystemExit(f"package-dir {pkg!r}: {target} already exists in {src_dir.parent}")
            target.symlink_to(src_dir)
        made.append(f"{pkg} -> {src_dir}")
    for pkg in packages:  # every declared package must now import from the farm
        if not (project_dir.joinpath(*pkg.split(".")) / "__init__.py").is_file():
            raise SystemExit(f"package {pkg!r} of pyproject.toml is not in the generated layout")
    return made


def write_dist_info(site: Path, meta: dict) -> Path:
    dist = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    for old in site.glob(f"{meta['name'].replace('-', '_')}-*.dist-info"):
        shutil.rmtree(old)
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
    made = []
    for name, value in scripts.items():
        module, _, func = value.partition(":")
        path = bin_dir / name
        path.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\n"
                        f"sys.exit({func}())\n")
        path.chmod(0o755)
        made.append(name)
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    repo, dest = args.repo.resolve(), args.dest.resolve()
    if not (dest / "site").is_dir():
        raise SystemExit(f"{dest}/site does not exist: unpack the bundle first")
    meta = read_project(repo)
    links = link_packages(repo, dest / "project", meta["package_dir"], meta["packages"])
    dist = write_dist_info(dest / "site", meta)
    scripts = write_scripts(dest / "bin", meta["scripts"], sys.executable)
    print(f"registered {meta['name']} {meta['version']} from {repo}: {'; '.join(links)}")
    print(f"  {dist.name}: entry points {sorted(meta['entry_points'])}; scripts {scripts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
