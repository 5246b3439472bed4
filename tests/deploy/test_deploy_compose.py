"""deploy/compose.yml: valid against the Compose Specification schema, raw and once interpolated
with deploy/.env.example for every topology profile; each profile starts replicas on disjoint GPUs
and the one router that lists exactly them; required variables stop Compose with their name; the
file agrees with the Dockerfile (stages, ports, volumes, health probe)."""

import os
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml
from deploy_helpers import (
    COMPOSE,
    DOCKERFILE,
    ENV_EXAMPLE,
    InterpolationError,
    dockerfile_stages,
    interpolate,
    read_env_file,
    variable_names,
)

# profile -> (number of replicas, tensor parallel size)
PROFILES = {"1gpu": (1, 1), "2gpu": (2, 1), "4gpu": (4, 1), "8gpu": (8, 1),
            "tp2x2": (2, 2), "tp2x4": (4, 2)}
REQUIRED = ["BASE_MODEL", "BASE_PREDICTOR_FILE", "BASE_PREDICTOR_DIR", "BASE_HF_CACHE",
            "BASE_DEFAULT_BUDGET", "BASE_MIN_BUDGET", "BASE_MAX_BUDGET", "BASE_API_KEY",
            "BASE_GRAFANA_ADMIN_PASSWORD"]
MONITORING = {"prometheus": "http://127.0.0.1:9090/-/ready", "grafana": "http://127.0.0.1:3000/api/health"}


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the x-* anchors and << merges


@pytest.fixture(scope="module")
def env() -> dict:
    return read_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def stages():
    return {s.name: s for s in dockerfile_stages(DOCKERFILE.read_text())[1]}


def validate(doc: dict, schema: dict):
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def active(doc: dict, profile: str) -> dict:
    return {name: svc for name, svc in doc["services"].items()
            if not svc.get("profiles") or profile in svc["profiles"]}


def option(command: list, flag: str) -> str:
    return command[command.index(flag) + 1]


def test_raw_file_matches_the_compose_schema(raw, compose_schema):
    validate(raw, compose_schema)


def test_schema_check_can_fail(raw, compose_schema):
    broken = {**raw, "services": {**raw["services"]}}
    broken["services"]["replica-0"] = {**raw["services"]["replica-0"], "restart": ["always"]}
    with pytest.raises(AssertionError, match="restart"):
        validate(broken, compose_schema)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profile_starts_its_replicas_and_one_router(profile, raw, env, compose_schema):
    doc = interpolate(raw, {**env, "COMPOSE_PROFILES": profile})
    validate(doc, compose_schema)
    services = active(doc, profile)
    replicas = {n: s for n, s in services.items() if n.startswith("replica-")}
    routers = {n: s for n, s in services.items() if n.startswith("router-")}
    num_replicas, tp = PROFILES[profile]
    assert len(replicas) == num_replicas and list(routers) == [f"router-{profile}"]

    gpus = []
    for svc in replicas.values():
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1 and devices[0]["driver"] == "nvidia"
        assert devices[0]["capabilities"] == ["gpu"] and "count" not in devices[0]
        assert len(devices[0]["device_ids"]) == tp == int(option(svc["command"], "--tp-size"))
        gpus += devices[0]["device_ids"]
    assert sorted(gpus, key=int) == [str(i) for i in range(num_replicas * tp)]  # disjoint, dense

    host_ports = [p.rsplit(":", 2)[1] for s in replicas.values() for p in s["ports"]]
    assert len(set(host_ports)) == num_replicas

    router = routers[f"router-{profile}"]
    assert router["command"][0] == "--worker-urls"
    assert sorted(router["command"][1:]) == sorted(f"http://{n}:8000" for n in replicas)
    assert router["depends_on"] == {n: {"condition": "service_healthy"} for n in replicas}


@pytest.mark.parametrize("name", REQUIRED)
def test_required_variable_stops_compose_with_its_name(name, raw, env):
    with pytest.raises(InterpolationError, match=rf"\b{name}\b.*deploy/\.env"):
        interpolate(raw, {k: v for k, v in env.items() if k != name})
    with pytest.raises(InterpolationError, match=rf"\b{name}\b"):
        interpolate(raw, {**env, name: ""})


def test_env_example_documents_every_variable(env):
    used = variable_names(COMPOSE.read_text())
    assert used - set(env) == set(), "variables used by compose.yml but missing from .env.example"
    assert set(env) - used == {"COMPOSE_PROFILES"}, "variables in .env.example that compose ignores"
    assert env["COMPOSE_PROFILES"] in PROFILES
    lo, default, hi = (int(env[k]) for k in ("BASE_MIN_BUDGET", "BASE_DEFAULT_BUDGET", "BASE_MAX_BUDGET"))
    assert 1 <= lo <= default <= hi


def test_policy_default_is_the_projects_default(raw, env):
    """Compose's fallback and the example agree with core.DEFAULT_POLICY (base-serve's default)."""
    from base_sglang.core import DEFAULT_POLICY

    unset = {k: v for k, v in env.items() if k != "BASE_POLICY"}
    replica = interpolate(raw, unset)["services"]["replica-0"]["environment"]
    assert replica["BASE_POLICY"] == DEFAULT_POLICY == env["BASE_POLICY"]
    assert interpolate(raw, {**env, "BASE_POLICY": "base"})["services"]["replica-0"][
        "environment"]["BASE_POLICY"] == "base"  # the paper's BASE stays selectable


def test_the_real_env_file_is_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/.env"], cwd=COMPOSE.parents[1])
    assert ignored.returncode == 0, "deploy/.env (API key) is not in .gitignore"


def test_every_service_restarts_and_has_a_healthcheck(raw):
    for name, svc in raw["services"].items():
        assert svc["restart"] == "unless-stopped", name
        test = svc["healthcheck"]["test"]
        if name in MONITORING:  # third-party images: their own readiness endpoint via wget
            assert test == ["CMD", "wget", "-q", "--spider", MONITORING[name]], name
            continue
        assert test[:2] == ["CMD", "base-healthcheck"], name
        if name.startswith("router-"):
            assert test[2:] == ["http://127.0.0.1:30000/readiness"]
        else:
            assert test[2:] == []  # the replica's /health on port 8000


def test_compose_agrees_with_the_dockerfile(raw, stages):
    replica, router = raw["services"]["replica-0"], raw["services"]["router-8gpu"]
    assert replica["build"]["target"] == "gpu" and router["build"]["target"] == "router"
    assert {replica["build"]["target"], router["build"]["target"]} <= set(stages)
    assert replica["build"]["context"] == ".." and (COMPOSE.parent / "..").resolve() == DOCKERFILE.parent
    # volumes: the compose mounts are the image's declared volumes
    declared = set(stages["gpu"].last("VOLUME").words)
    assert {v["target"] for v in replica["volumes"]} == declared
    predictor = next(v for v in replica["volumes"] if v["target"] == "/data/predictors")
    assert predictor["read_only"] is True
    assert replica["environment"]["BASE_PREDICTOR"].startswith("/data/predictors/")
    # ports: the replica listens where the image's entrypoint binds it, the router likewise
    gpu_entry = stages["gpu"].last("ENTRYPOINT").words
    assert replica["expose"] == [option(gpu_entry, "--port")]
    replica_ports = [p for n, s in raw["services"].items() if n.startswith("replica-") for p in s["ports"]]
    assert len(replica_ports) == 12 and all(p.endswith(":8000") for p in replica_ports)
    assert option(router["entrypoint"], "--port") == "30000"
    assert router["ports"][0].endswith(":30000")
    assert router["entrypoint"][:2] == stages["router"].last("ENTRYPOINT").words[:2] == ["smg", "launch"]
    # the replicas' health probe is the script the image installs
    copies = [i.words for i in stages["gpu"].all("COPY")]
    assert ["deploy/healthcheck.py", "/usr/local/bin/base-healthcheck"] in copies


def test_router_api_key_and_health_endpoint(raw):
    router = raw["services"]["router-8gpu"]["entrypoint"]
    assert re.fullmatch(r"\$\{BASE_API_KEY:\?.+\}", option(router, "--api-key"))
    assert option(router, "--health-check-endpoint") == "/health"
    replica_env = raw["services"]["replica-0"]["environment"]
    assert re.fullmatch(r"\$\{BASE_API_KEY:\?.+\}", replica_env["BASE_API_KEY"])


def compose_cli() -> list[str] | None:
    """A Compose v2 CLI: $DOCKER_COMPOSE, the docker plugin, or docker-compose v2 on PATH."""
    candidates = []
    if os.environ.get("DOCKER_COMPOSE"):
        candidates.append([os.environ["DOCKER_COMPOSE"]])
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        out = subprocess.run([*cli, "version", "--short"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2."):
            return cli
    return None


def test_docker_compose_config_accepts_every_profile(tmp_path):
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 CLI here (set DOCKER_COMPOSE=/path/to/docker-compose)")
    base = [*cli, "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE)]
    for profile in PROFILES:
        out = subprocess.run([*base, "--profile", profile, "config", "-q"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    env_file = tmp_path / "no-key.env"
    env_file.write_text("\n".join(line for line in ENV_EXAMPLE.read_text().splitlines()
                                  if not line.startswith("BASE_API_KEY=")))
    out = subprocess.run([*cli, "-f", str(COMPOSE), "--env-file", str(env_file), "config", "-q"],
                         capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                              if k != "BASE_API_KEY"})
    assert out.returncode != 0 and "BASE_API_KEY" in out.stderr
