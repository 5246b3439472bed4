"""The core imports with torch alone; the dependency direction holds."""

import subprocess
import sys


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
