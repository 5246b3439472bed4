"""The core imports with torch alone; the dependency direction holds."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_core_imports_without_optional_dependencies():
    code = (
        "import sys, base_sglang, base_sglang.core\n"
        "bad = [m for m in ('fastapi', 'sglang', 'triton', 'transformers', 'uvicorn', 'pydantic')"
        " if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"base_sglang.core pulled in: {out.stdout}"


def test_mapped_packages_import_under_base_sglang():
    import base_sglang.calibration
    import base_sglang.kernels
    import base_sglang.server

    for mod in (base_sglang.kernels, base_sglang.server, base_sglang.calibration):
        assert mod.__name__.startswith("base_sglang.")


MAPPED = {"kernels": "base_sglang.kernels", "server": "base_sglang.server",
          "calibration": "base_sglang.calibration"}


def _imports(path: str) -> set[str]:
    """The base_sglang modules a tracked source file imports (relative imports resolved)."""
    import ast
    from pathlib import Path

    parts = list(Path(path).with_suffix("").parts)
    if parts[0] in MAPPED:
        parts = MAPPED[parts[0]].split(".") + parts[1:]
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    out = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            out.add(".".join(base + ([node.module] if node.module else [])))
    return {m for m in out if m.startswith("base_sglang")}


def _within(module: str, banned: str) -> bool:
    return module == banned or module.startswith(banned + ".")


RULES = {  # tracked file prefix -> base_sglang modules it must not import
    "base_sglang/core/": ("base_sglang.hf", "base_sglang.engine", "base_sglang.plugin",
                          "base_sglang.server", "base_sglang.kernels", "base_sglang.protocol"),
    "base_sglang/protocol.py": ("base_sglang.core", "base_sglang.hf", "base_sglang.engine",
                                "base_sglang.plugin", "base_sglang.kernels"),
    "base_sglang/hf/": ("base_sglang.engine", "base_sglang.plugin", "base_sglang.server"),
    "base_sglang/engine/": ("base_sglang.server", "base_sglang.plugin", "base_sglang.calibration"),
    "base_sglang/plugin/": ("base_sglang.engine", "base_sglang.server", "base_sglang.hf"),
    "server/backends/sglang.py": ("base_sglang.engine",),
    "server/routes/": ("base_sglang.engine",),
    "server/generation.py": ("base_sglang.engine",),
    "calibration/": ("base_sglang.engine", "base_sglang.server"),
}


def test_dependency_direction():
    """core <- hf <- engine; protocol stands alone; neither server backend imports the other;
    the runtime never imports server, calibration or research."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True, check=True,
                           cwd=ROOT).stdout.split()
    # the resolver sees relative and mapped-package imports (positive controls)
    assert {"base_sglang.protocol", "base_sglang.hf"} <= _imports("base_sglang/engine/llm_engine.py")
    assert "base_sglang.engine" in _imports("server/backends/native.py")
    bad = [f"{f} imports {m}" for f in files for prefix, banned in RULES.items()
           if f.startswith(prefix) for m in _imports(f) if any(_within(m, b) for b in banned)]
    assert bad == []
