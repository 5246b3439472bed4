"""The offline SGLang bundle's helpers (benchmarks/gpu): exact pins, the prune/strip rules on a
small site tree with a real compiled shared object, and the pip-less registration of this
checkout (symlinked package layout + dist-info entry point) seen by a fresh interpreter."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import bundle_prune  # noqa: E402
import bundle_register  # noqa: E402


def test_requirements_are_exact_pins_of_distinct_packages():
    names = []
    for line in (GPU / "bundle-requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version and " " not in version, line
            names.append(name.lower().replace("_", "-"))
    assert len(names) == len(set(names))
    # what sglang 0.5.17 pins, and what the device's transformers 5.17 breaks
    pins = dict(line.split("==") for line in (GPU / "bundle-requirements.txt").read_text().split()
                if "==" in line)
    assert pins["sglang"] == "0.5.17" and pins["sglang-kernel"] == "0.4.5"
    assert pins["transformers"] == "5.12.1" and pins["tokenizers"] == "0.22.2"
    assert pins["xgrammar"] == "0.2.1" and pins["flashinfer-python"] == "0.6.15.post1"


def _compile_so(path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a shared object")
    src = path.with_suffix(".c")
    src.write_text("int answer(void) { return 42; }\n")
    subprocess.run([cc, "-g", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    src.unlink()


def test_prune_removes_the_rules_and_strips_symbols(tmp_path):
    if shutil.which("strip") is None or shutil.which("readelf") is None:
        pytest.skip("binutils (strip, readelf) not installed")
    site = tmp_path / "site"
    for rel in ("sglang/__init__.py", "sglang/test/test_utils.py", "sglang/multimodal_gen/x.py",
                "sglang/srt/__pycache__/a.pyc", "pkg/tests/test_a.py", "pkg/__init__.pyi",
                "pkg/__init__.py", "sgl_kernel/sm100/common_ops.abi3.so",
                "xgrammar/lib/libxgrammar.a"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    lib = site / "pkg" / "libanswer.so"
    _compile_so(lib)
    dist = site / "pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (dist / "RECORD").write_text("pkg/__init__.py,,\npkg/libanswer.so,,\n")
    before = lib.stat().st_size
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("pkg/__init__.py", "")
    info = tmp_path / "BUNDLE_INFO.json"
    assert bundle_prune.main([str(site), "--wheels", str(wheels), "--info", str(info),
                              "--python", "3.12"]) == 0
    left = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert left == ["pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD", "pkg/__init__.py",
                    "pkg/libanswer.so", "sglang/__init__.py"]
    assert lib.stat().st_size < before  # debug info and the static symbol table are gone
    import ctypes

    assert ctypes.CDLL(str(lib)).answer() == 42  # the dynamic symbol survives
    meta = json.loads(info.read_text())
    assert meta["distributions"] == {"pkg": "1.0"} and meta["python"] == "3.12"
    assert [s["path"] for s in meta["stripped"]] == ["pkg/libanswer.so"]
    assert "sgl_kernel/sm100" in {r["path"] for r in meta["removed"]}


@pytest.mark.parametrize("cwd", ["elsewhere", "repo"])
def test_registration_makes_the_plugin_discoverable_without_pip(tmp_path, cwd):
    """From any directory, including the checkout itself (where `python -m` finds
    REPO/base_sglang, which has no kernels/ inside, before anything on PYTHONPATH)."""
    (tmp_path / "site").mkdir()
    assert bundle_register.main([str(ROOT), str(tmp_path)]) == 0
    probe = """
import importlib.metadata as md, json, site, sys
import sitecustomize  # what site.py imports at startup (-S below skips site.py)
# the interpreter's packages (torch, ...) without their .pth hooks: no editable install of this
# project can answer for base_sglang
sys.path.extend(site.getsitepackages())
import base_sglang, base_sglang.kernels, base_sglang.server, base_sglang.server.routes
from base_sglang.plugin import register
eps = [(e.name, e.value, e.dist.name) for e in md.entry_points(group="sglang.srt.plugins")]
print(json.dumps({"eps": eps, "base": base_sglang.__file__,
                  "kernels": list(base_sglang.kernels.__path__),
                  "routes": base_sglang.server.routes.__file__,
                  "scripts": sorted(e.name for e in md.entry_points(group="console_scripts")
                                    if e.dist.name == "base-sglang")}))
"""
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{tmp_path / 'project'}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-S", "-c", probe], env=env, capture_output=True,
                         text=True, cwd=ROOT if cwd == "repo" else tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert ["base", "base_sglang.plugin:register", "base-sglang"] in got["eps"]
    assert Path(got["base"]).resolve() == ROOT / "base_sglang" / "__init__.py"
    assert [Path(p).resolve() for p in got["kernels"]] == [ROOT / "kernels"]
    assert Path(got["routes"]).resolve() == ROOT / "server" / "routes" / "__init__.py"
    assert got["scripts"] == ["base-calibrate", "base-eval", "base-serve"]
    script = (tmp_path / "bin" / "base-serve").read_text()
    assert "from base_sglang.server.__main__ import main" in script


def test_registration_chains_to_a_shadowed_sitecustomize(tmp_path):
    (tmp_path / "site").mkdir()
    bundle_register.main([str(ROOT), str(tmp_path)])
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = {"PYTHONPATH": f"{tmp_path / 'project'}:{other}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('CHAINED'))"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "yes", out.stderr
