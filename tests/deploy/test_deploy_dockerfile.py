"""The Dockerfile: hadolint-clean; stages and default target; the GPU base image is the official
SGLang image of the version pyproject.toml pins; non-root, health-checked, volumes; and every
command, file and path the images use exists: console scripts and the plugin entry point in
pyproject.toml, the modules behind them, the base-serve flags (and what goes on to SGLang), the
COPY sources in the build context, the router version the router tests ran against."""

import ast
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from deploy_helpers import (
    COMPOSE,
    DOCKERFILE,
    DOCKERIGNORE,
    ENV_EXAMPLE,
    ROOT,
    dockerfile_stages,
    dockerignore_patterns,
    env_of,
    in_build_context,
    interpolate,
    read_env_file,
)

RUNTIME_STAGES = ("cpu", "router", "gpu")


@pytest.fixture(scope="module")
def parsed():
    return dockerfile_stages(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def stages(parsed):
    return {s.name: s for s in parsed[1]}


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def option(words: list, flag: str) -> str:
    return words[words.index(flag) + 1]


def test_hadolint_reports_nothing(hadolint_bin):
    out = subprocess.run([hadolint_bin, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


def test_hadolint_can_fail(hadolint_bin, tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.12-slim\nRUN pip install requests\n")  # unpinned, cache kept
    out = subprocess.run([hadolint_bin, "--no-color", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0 and "DL3013" in out.stdout and "DL3042" in out.stdout


def test_stages_and_default_target(parsed):
    _, stages = parsed
    assert [s.name for s in stages] == ["wheel", "cpu", "router", "gpu"]  # last = default target
    assert stages[-1].base == "${SGLANG_IMAGE}"
    assert stages[0].base == stages[1].base == stages[2].base == "python:${PYTHON_VERSION}-slim"


def test_gpu_base_is_the_official_image_of_the_pinned_sglang(parsed, stages, pyproject):
    args, _ = parsed
    pins = [r for r in pyproject["project"]["optional-dependencies"]["sglang"] if r.startswith("sglang==")]
    assert pins == [f"sglang=={args['SGLANG_VERSION']}"]
    assert args["SGLANG_IMAGE"] == f"lmsysorg/sglang:v{args['SGLANG_VERSION']}-cu130"
    # the build refuses a base image whose sglang is not the pinned one
    checks = [i.args for i in stages["gpu"].all("RUN") if "m.version('sglang')" in i.args]
    assert len(checks) == 1 and "${SGLANG_VERSION}" in checks[0]
    assert "ARG SGLANG_VERSION" in [f"ARG {i.args}" for i in stages["gpu"].all("ARG")]


@pytest.mark.parametrize("name", RUNTIME_STAGES, ids=lambda n: f"stage_{n}")
def test_runtime_stage_is_non_root_and_health_checked(name, stages, parsed):
    stage, args = stages[name], parsed[0]
    user = stage.last("USER").args
    uid = args["BASE_UID"] if user == "${BASE_UID}" else user
    assert uid.isdigit() and int(uid) > 0
    health = stage.last("HEALTHCHECK")
    assert health.words[0] == "CMD" and health.words[1] == "base-healthcheck"
    assert {"interval", "timeout", "start-period", "retries"} <= set(health.flags)
    installed = [i.words for i in stage.all("COPY")]
    assert ["deploy/healthcheck.py", "/usr/local/bin/base-healthcheck"] in installed


@pytest.mark.parametrize("name", ("cpu", "gpu"), ids=lambda n: f"stage_{n}")
def test_server_stage_volumes_and_caches(name, stages):
    stage = stages[name]
    assert stage.last("VOLUME").words == ["/data/huggingface", "/data/predictors"]
    assert env_of(stage)["HF_HOME"] == "/data/huggingface"
    assert stage.last("EXPOSE").words == ["8000"]


def test_entrypoints(stages):
    gpu = stages["gpu"].last("ENTRYPOINT").words
    assert gpu == ["base-serve", "--backend", "sglang", "--host", "0.0.0.0", "--port", "8000"]
    assert stages["gpu"].last("CMD").words == ["--help"]
    cpu = stages["cpu"].last("ENTRYPOINT").words
    assert cpu == ["base-serve", "--host", "0.0.0.0", "--port", "8000"]  # native backend, embedded model
    assert stages["cpu"].last("CMD").words == []
    router = stages["router"].last("ENTRYPOINT").words
    assert router == ["smg", "launch", "--host", "0.0.0.0", "--port", "30000"]


def test_console_script_and_plugin_entry_point_exist(stages, pyproject):
    scripts = pyproject["project"]["scripts"]
    assert scripts["base-serve"] == "base_sglang.server.__main__:main"
    plugins = pyproject["project"]["entry-points"]["sglang.srt.plugins"]
    # SGLANG_PLUGINS whitelists entry-point names: the image enables exactly ours
    assert list(plugins) == [env_of(stages["gpu"])["SGLANG_PLUGINS"]]
    for target in (scripts["base-serve"], *plugins.values()):
        module, func = target.split(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"{module} not found"
        tree = ast.parse(Path(spec.origin).read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Name)}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        assert func in names, f"{target}: {module} defines no {func}"
    # and the installed metadata carries them (what `pip install` of the wheel registers)
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert installed.get("base") == plugins["base"]


def test_base_serve_parses_what_the_images_and_compose_pass(stages, monkeypatch):
    from base_sglang.server.__main__ import build_parser
    from base_sglang.server.settings import Settings

    args, extra = build_parser(Settings()).parse_known_args(stages["cpu"].last("ENTRYPOINT").words[1:])
    assert extra == [] and args.backend == "native" and (args.host, args.port) == ("0.0.0.0", 8000)
    gpu_entry = stages["gpu"].last("ENTRYPOINT").words[1:]
    compose = interpolate(yaml.safe_load(COMPOSE.read_text()), read_env_file(ENV_EXAMPLE))
    for name, tp in (("replica-0", "1"), ("replica-tp2-0", "2")):
        service = compose["services"][name]
        for key, value in service["environment"].items():  # as the container sees them
            monkeypatch.setenv(key, value)
        args, extra = build_parser(Settings()).parse_known_args(gpu_entry + service["command"])
        env = service["environment"]
        assert args.backend == "sglang" and (args.host, args.port) == ("0.0.0.0", 8000)
        assert (args.model, args.predictor, args.api_key) == (
            env["BASE_MODEL"], env["BASE_PREDICTOR"], env["BASE_API_KEY"])
        assert (str(args.default_budget), str(args.min_budget), str(args.max_budget)) == (
            env["BASE_DEFAULT_BUDGET"], env["BASE_MIN_BUDGET"], env["BASE_MAX_BUDGET"])
        assert args.max_running_requests == int(env["BASE_MAX_RUNNING_REQUESTS"])
        # what base-serve does not know goes on to SGLang: exactly these flags, with their values
        assert extra == ["--tp-size", tp, "--moe-runner-backend", "triton", "--mem-fraction-static", "0.85"]


def test_sglang_passthrough_flags_exist_in_the_pinned_sglang():
    spec = importlib.util.find_spec("sglang")
    if spec is None or importlib.metadata.version("sglang") != "0.5.23":
        pytest.skip("sglang 0.5.23 not installed")
    fields = Path(spec.origin).parent / "srt" / "arg_groups" / "fields"
    source = "\n".join(p.read_text() for p in fields.glob("*.py"))
    for flag in ("--tp-size", "--moe-runner-backend", "--mem-fraction-static"):
        field = flag[2:].replace("-", "_")
        assert re.search(rf"^\s+{field}: A\[", source, re.MULTILINE), f"sglang has no {flag}"


def test_copy_sources_exist_and_reach_the_build_context(stages):
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    sources = {w.rstrip("/") for s in stages.values() for i in s.all("COPY") if "from" not in i.flags
               for w in i.words[:-1]}
    assert {"pyproject.toml", "README.md", "base_sglang", "deploy/healthcheck.py"} <= sources
    for src in sorted(sources):
        assert (ROOT / src).exists(), f"COPY source {src} is missing"
        files = [f for f in tracked if f == src or f.startswith(src + "/")]
        assert files, f"COPY source {src} is not tracked by git"
        for f in files:
            assert in_build_context(f, patterns), f"{f} (COPY {src}) is excluded by .dockerignore"
    # and the context holds nothing else of size: no corpus, no .git
    assert not in_build_context(".corpus/clean/a.jsonl", patterns)
    assert not in_build_context(".git/HEAD", patterns)
    assert not in_build_context("deploy/.env", patterns)  # the API key stays out of images
    assert not in_build_context("base_sglang/__pycache__/x.pyc", patterns)


def test_every_package_directory_is_copied(stages, pyproject):
    copied = {w.rstrip("/") for i in stages["wheel"].all("COPY") for w in i.words[:-1]}
    package_dirs = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    assert package_dirs <= copied


def test_router_version_is_the_tested_one(parsed):
    try:
        installed = importlib.metadata.version("smg")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("smg not installed (the router tests skip too)")
    assert parsed[0]["SMG_VERSION"] == installed


def test_the_build_context_builds_a_complete_wheel(tmp_path, pyproject):
    """What the `wheel` stage does, on exactly the files .dockerignore lets into the context."""
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    context = tmp_path / "context"
    for f in files:
        if in_build_context(f, patterns) and (ROOT / f).is_file():
            (context / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, context / f)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "--wheel-dir", str(tmp_path / "dist"), str(context)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("base_sglang-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "base-serve = base_sglang.server.__main__:main" in entry_points
    assert "[sglang.srt.plugins]\nbase = base_sglang.plugin:register" in entry_points
    for package in pyproject["tool"]["setuptools"]["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in names, f"{package} missing from the wheel"
    # package data (the embedded model, when the repository has it) travels in the wheel
    shipped = [f for f in files if f.startswith("base_sglang/models/") and (ROOT / f).is_file()]
    assert all(f in names for f in shipped)
