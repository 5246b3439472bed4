"""Parsers the deploy tests share: Compose's .env files and variable interpolation, Dockerfile
instructions and stages, and .dockerignore matching. Plain and small, after the specifications
(compose-spec "Interpolation", Dockerfile reference, .dockerignore reference)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "deploy" / "compose.yml"
ENV_EXAMPLE = ROOT / "deploy" / ".env.example"


# ---- Compose: .env files and ${VAR} interpolation ------------------------------------------------

def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and # comments skipped (values here are never quoted)."""
    env = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{path.name}:{n}: not KEY=VALUE: {line!r}")
        env[key] = value
    return env


class InterpolationError(ValueError):
    pass


_VAR = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


def variable_names(text: str) -> set[str]:
    names = set()
    for m in _VAR.finditer(text):
        if m.group("named"):
            names.add(m.group("named"))
        elif m.group("braced") is not None:
            names.add(_BRACED.fullmatch(m.group("braced")).group("name"))
    return names


def interpolate(value, env: dict[str, str]):
    """Substitute ${VAR}, $VAR, ${VAR:-d}, ${VAR-d}, ${VAR:?e}, ${VAR?e}, ${VAR:+a}, ${VAR+a}, $$
    in every string of a loaded YAML document, as Compose does before validating it."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match) -> str:
        if m.group("escaped"):
            return "$"
        if m.group("named"):
            return env.get(m.group("named"), "")
        braced = _BRACED.fullmatch(m.group("braced"))
        if braced is None:
            raise InterpolationError(f"invalid interpolation format: ${{{m.group('braced')}}}")
        name, op, arg = braced.group("name", "op", "arg")
        is_set = name in env
        is_full = is_set and env[name] != ""
        present = is_full if op and op.startswith(":") else is_set
        if op in (":-", "-"):
            return env[name] if present else arg
        if op in (":?", "?"):
            if not present:
                raise InterpolationError(f"required variable {name} is missing a value: {arg}")
            return env[name]
        if op in (":+", "+"):
            return arg if present else ""
        return env.get(name, "")

    return _VAR.sub(substitute, value)


# ---- Dockerfile ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper case, e.g. "COPY"
    args: str  # the rest of the (joined) line
    line: int

    @property
    def flags(self) -> dict[str, str]:
        out = {}
        for tok in self.args.split():
            if not tok.startswith("--"):
                break
            key, _, val = tok[2:].partition("=")
            out[key] = val
        return out

    @property
    def words(self) -> list[str]:
        """Arguments without leading --flags, exec (JSON) form decoded when present."""
        rest = self.args
        while rest.startswith("--"):
            rest = rest.split(None, 1)[1] if " " in rest else ""
        if rest.startswith("["):
            return json.loads(rest)
        head, _, tail = rest.partition(" ")
        if head == "CMD" and tail.lstrip().startswith("["):  # HEALTHCHECK ... CMD ["exec", "form"]
            return ["CMD", *json.loads(tail)]
        return rest.split()


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def last(self, cmd: str) -> Instruction | None:
        found = self.all(cmd)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> list[Instruction]:
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # comment lines inside a continued instruction
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        cmd, _, args = buf.partition(" ")
        out.append(Instruction(cmd.upper(), args.strip(), start))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def dockerfile_stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages in order)."""
    global_args, stages = {}, []
    for ins in parse_dockerfile(text):
        if ins.cmd == "FROM":
            words = ins.words
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, words[0]))
        elif not stages:
            if ins.cmd == "ARG":
                key, _, val = ins.args.partition("=")
                global_args[key] = val
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


def env_of(stage: Stage) -> dict[str, str]:
    env = {}
    for ins in stage.all("ENV"):
        for key, val in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", ins.args):
            env[key] = val
    return env


# ---- .dockerignore ---------------------------------------------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out, i = out + "/?", i + 1
            continue
        c = pattern[i]
        out += "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern]]:
    """(is_exception, regex) per pattern, in file order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:] if negated else line
        pattern = pattern.strip().strip("/")
        out.append((negated, _pattern_regex(pattern)))
    return out


def in_build_context(path: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether a repository-relative path reaches the build context: the last pattern that matches
    the path or one of its parent directories decides (as Docker's pattern matcher does)."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negated, regex in patterns:
        if any(regex.match(c) for c in candidates):
            included = negated
    return included
