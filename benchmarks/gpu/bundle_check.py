"""Check an installed SGLang bundle before anything runs on it (install_bundle.sh calls this).

    python3 benchmarks/gpu/bundle_check.py [--cpu] [--so SITE] [--skip-xgrammar]

1. prints the versions that matter (python, torch, triton, sglang, sgl_kernel, transformers,
   tokenizers, flashinfer, xgrammar) and where transformers comes from;
2. imports the chain a run needs: sglang's engine, launch_server, bench_one_batch, bench_serving,
   the HTTP server, scheduler, tokenizer/detokenizer managers, model runner, CUDA-graph runner,
   TopK, the Triton MoE runner, Qwen3-MoE, the Triton attention backend, the xgrammar grammar
   backend, the OpenAI protocol and function-call parsers. A missing module fails loudly, naming
   the module and the file that imported it;
3. compiles an EBNF grammar with xgrammar and has a matcher accept a token, to check that the
   real library (its stripped bindings) works; with --tokenizer DIR also SGLang's xgrammar grammar
   backend: a JSON-schema grammar over that tokenizer masks logits (on CUDA with SGLang's bitmask
   kernel) and its matcher accepts a token;
4. with --plugin REPO: BASE's entry point `base` (group sglang.srt.plugins) is discoverable,
   base_sglang imports from REPO, and sglang's own load_plugins() runs `register()` and applies
   every hook of base_sglang.plugin.TARGETS (BASE stays off without BASE_PREDICTOR);
5. with --so SITE: loads every shared object under SITE (extension modules by import, libraries
   with ctypes), so a broken strip shows here; objects that need libtorch/CUDA are reported
   and skipped where torch is absent.
--cpu: a CPU-only check machine (no CUDA): sgl_kernel and flashinfer's CUDA-only modules are
skipped (SGLang does not import them without CUDA either).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import sys
import traceback
from pathlib import Path

CHAIN = (
    "sglang",
    "sglang.srt.server_args",
    "sglang.srt.plugins",
    "sglang.srt.plugins.hook_registry",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.openai.protocol",
    "sglang.srt.entrypoints.openai.serving_chat",
    "sglang.srt.entrypoints.openai.serving_completions",
    "sglang.srt.function_call.function_call_parser",
    "sglang.launch_server",
    # 0.5.17's deprecated paths (what `python -m` uses there) or the modules behind them
    ("sglang.bench_one_batch", "sglang.benchmark.one_batch"),
    ("sglang.bench_serving", "sglang.benchmark.serving"),
    ("sglang.bench_offline_throughput", "sglang.benchmark.offline_throughput"),
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.io_struct",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.layers.moe.topk",
    "sglang.srt.layers.moe.fused_moe_triton",
    "sglang.srt.layers.moe.moe_runner.triton",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.models.qwen3_moe",
    "sglang.srt.models.olmoe",
    "sglang.srt.models.mixtral",
    "sglang.srt.constrained.xgrammar_backend",
    "sglang.srt.sampling.sampling_batch_info",
    # base-serve --backend sglang: its settings and HTTP layer (server/settings.py, server/app.py)
    "pydantic_settings",
    "uvicorn",
)
CUDA_ONLY = ("sgl_kernel", "flashinfer.fused_moe", "flashinfer.gemm", "flashinfer.fp4_quantization")
VERSIONS = ("torch", "triton", "sglang", "sgl_kernel", "transformers", "tokenizers", "flashinfer",
            "xgrammar", "apache_tvm_ffi", "torchao", "pydantic", "fastapi", "openai", "numpy")
DISTS = {"sgl_kernel": "sglang-kernel", "flashinfer": "flashinfer-python",
         "apache_tvm_ffi": "apache-tvm-ffi"}


class CheckFailed(RuntimeError):
    pass


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        origin = next((f for f in reversed(frames) if "importlib" not in f.filename), None)
        where = f" (imported at {origin.filename}:{origin.lineno})" if origin else ""
        raise CheckFailed(f"import {name}: MISSING MODULE {exc.name!r}{where}") from exc
    except Exception as exc:  # an import that fails for another reason is just as fatal
        raise CheckFailed(f"import {name}: {type(exc).__name__}: {exc}\n"
                          + "".join(traceback.format_exception(exc)[-6:])) from exc


def versions() -> None:
    print(f"python        {sys.version.split()[0]} ({sys.executable})")
    for name in VERSIONS:
        try:
            version = md.version(DISTS.get(name, name))
        except md.PackageNotFoundError:
            version = "not installed"
        print(f"{name:<13} {version}")
    tf = _import("transformers")
    print(f"transformers from {Path(tf.__file__).parent}")


def _import_first(names: tuple[str, ...]):
    """The first of several paths of one module (a path that is itself absent is skipped)."""
    for name in names[:-1]:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None and \
                importlib.util.find_spec(name) is not None:
            return _import(name)
    return _import(names[-1])


def chain(cpu: bool) -> None:
    """Import every module of the chain; report all that fail (one device call shows them all)."""
    names = CHAIN if cpu else CUDA_ONLY + CHAIN
    failed = []
    for name in names:
        try:
            _import_first(name) if isinstance(name, tuple) else _import(name)
        except CheckFailed as exc:
            print(f"  FAILED {exc}", file=sys.stderr)
            failed.append(str(exc).split("\n", 1)[0])
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(names)} modules of the import chain do not "
                          "import:\n  " + "\n  ".join(failed))
    print(f"import chain OK: {len(names)} modules" + (" (CPU: CUDA-only modules skipped)" if cpu
                                                       else ""))


def xgrammar_works() -> None:
    """A real grammar: compile `root ::= "yes" | "no"`, then a matcher accepts "no" token by token."""
    xgr = _import("xgrammar")
    vocab = ["<eos>", "y", "es", "n", "o", "x"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[0])
    compiled = xgr.GrammarCompiler(info).compile_grammar('root ::= "yes" | "no"')
    matcher = xgr.GrammarMatcher(compiled)
    if matcher.accept_token(5):  # "x" is not in the language
        raise CheckFailed("xgrammar: a matcher accepted a token outside the grammar")
    if not (matcher.accept_token(3) and matcher.accept_token(4) and matcher.accept_token(0)):
        raise CheckFailed("xgrammar: a matcher refused 'n' 'o' <eos> of the grammar yes|no")
    if not matcher.is_terminated():
        raise CheckFailed("xgrammar: the matcher did not terminate after <eos>")
    for name in ("StructuralTag", "GrammarCompiler", "GrammarMatcher", "CompiledGrammar",
                 "TokenizerInfo", "allocate_token_bitmask", "apply_token_bitmask_inplace"):
        if not hasattr(xgr, name):
            raise CheckFailed(f"xgrammar: no attribute {name}")
    print(f"xgrammar {md.version('xgrammar')}: grammar compiled, matcher accepted 'n' 'o' <eos>")


def plugin(repo: Path) -> None:
    eps = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "base"]
    if not eps:
        raise CheckFailed("no entry point 'base' in group sglang.srt.plugins: BASE is not "
                          "registered (install_bundle.sh runs bundle_register.py)")
    if [ep.value for ep in eps] != ["base_sglang.plugin:register"]:
        raise CheckFailed(f"entry point 'base' points at {[ep.value for ep in eps]}")
    base = _import("base_sglang")
    for sub in ("base_sglang.core", "base_sglang.plugin", "base_sglang.kernels",
                "base_sglang.server", "base_sglang.calibration"):
        _import(sub)
    where = Path(base.__file__).resolve()
    if not where.is_relative_to(repo.resolve()):
        raise CheckFailed(f"base_sglang imports from {where}, not from the checkout {repo}")
    from sglang.srt.plugins import hook_registry, load_plugins

    from base_sglang.plugin import TARGETS

    load_plugins()
    registry = hook_registry.HookRegistry
    missing = [t for t, _, _ in TARGETS if t not in registry._hooks or t not in registry._patched]
    if missing:
        raise CheckFailed("load_plugins() did not apply BASE's hooks on: " + ", ".join(missing)
                          + " (sglang logs why above)")
    print(f"plugin: entry point base -> {eps[0].value} ({eps[0].dist.name} "
          f"{eps[0].dist.version}), base_sglang from {where.parent}; load_plugins() applied "
          f"{len(TARGETS)} hooks")


def _load_one(site: Path, path: Path) -> None:
    """Import an extension module by its dotted name; dlopen anything else, and any .so whose
    import fails (no PyInit_*: libraries that packages load with ctypes/cffi, e.g.
    pycryptodomex's; or a package __init__ that needs torch): the loader then checks the file."""
    import ctypes

    rel = path.relative_to(site)
    stem = path.name.split(".", 1)[0]
    dotted = ".".join((*rel.parts[:-1], stem))
    if path.name.endswith(".so") and all(p.isidentifier() for p in dotted.split(".")):
        try:
            importlib.import_module(dotted)
            return
        except ImportError:  # not an extension module, or its package needs what is absent here
            pass
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def grammar_backend(tokenizer_dir: Path, cpu: bool) -> None:
    """SGLang's own xgrammar backend: a JSON-schema grammar over a real tokenizer masks the logits
    (on CUDA through sglang's Triton bitmask kernel) and its matcher accepts the first token."""
    import torch
    from transformers import AutoTokenizer

    backend_mod = _import("sglang.srt.constrained.xgrammar_backend")
    xgr = _import("xgrammar")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = len(tok)
    backend = backend_mod.XGrammarGrammarBackend(tok, vocab_size=vocab,
                                                 model_eos_token_ids=[tok.eos_token_id])
    grammar = backend.dispatch_json('{"type": "object", "properties": {"a": {"type": "integer"}},'
                                    ' "required": ["a"]}')
    if type(grammar).__name__ != "XGrammarGrammar":
        raise CheckFailed(f"xgrammar backend: no grammar compiled ({grammar!r})")
    if cpu:  # sglang pins the mask and applies it on accelerators only; xgrammar's CPU path
        mask = xgr.allocate_token_bitmask(1, vocab)
        grammar.fill_vocab_mask(mask, 0)
        logits = torch.zeros(1, vocab)
        xgr.apply_token_bitmask_inplace(logits, mask)
    else:
        mask = grammar.allocate_vocab_mask(vocab, 1, "cuda")
        grammar.fill_vocab_mask(mask, 0)
        logits = torch.zeros(1, vocab, device="cuda")
        grammar.apply_vocab_mask(logits, grammar.move_vocab_mask(mask, "cuda"))
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    brace = tok.encode("{", add_special_tokens=False)[0]
    letter = tok.encode("x", add_special_tokens=False)[0]
    if brace not in allowed or letter in allowed or len(allowed) >= vocab:
        raise CheckFailed(f"xgrammar backend: the JSON mask allows {len(allowed)} of {vocab} "
                          f"tokens ('{{' allowed: {brace in allowed}, 'x': {letter in allowed})")
    grammar.accept_token(brace)
    print(f"sglang xgrammar backend: JSON grammar over a {vocab}-token tokenizer allows "
          f"{len(allowed)} first tokens ('{{' yes, 'x' no) on {'CPU' if cpu else 'CUDA'}; "
          f"matcher accepted '{{'")


# Shared objects a run never loads, with the reason (checked: nothing imports them).
NOT_LOADED = {
    "torch_memory_saver_hook_mode_":
        "torch_memory_saver's hook libraries, linked against CUDA 12's libcudart (the device has "
        "CUDA 13); loaded only with --enable-memory-saver, which these runs do not use",
}


def shared_objects(site: Path) -> None:
    """Load every shared object of SITE; those that need libtorch/CUDA where absent are listed."""
    cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch  # libtorch first, as in a real process: extensions link against it

        cuda = torch.cuda.is_available()
    needs = ("libtorch", "libc10", "torch", "libcuda", "libcudart", "libnvrtc", "libcublas")
    loaded, skipped = 0, []
    sys.path.insert(0, str(site))
    for path in sorted(site.rglob("*.so*")):
        if not path.is_file() or path.is_symlink() or ".dist-info" in path.parts[0]:
            continue
        reason = next((why for prefix, why in NOT_LOADED.items() if path.name.startswith(prefix)),
                      None)
        if reason is not None:
            skipped.append(f"{path.relative_to(site)} ({reason})")
            continue
        try:
            _load_one(site, path)
            loaded += 1
        except Exception as exc:  # a loader error: missing dependency or a broken file
            text = f"{type(exc).__name__}: {exc}"
            if any(n in text for n in needs) and not cuda:  # strict where CUDA is there
                skipped.append(str(path.relative_to(site)))
                continue
            raise CheckFailed(f"shared object {path.relative_to(site)} does not load: {text}") \
                from exc
    print(f"shared objects: {loaded} loaded; {len(skipped)} need libtorch/CUDA, not loadable here"
          + (": " + ", ".join(skipped) if skipped else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="CPU-only machine: skip CUDA-only modules")
    ap.add_argument("--so", type=Path, metavar="SITE", help="load every shared object under SITE")
    ap.add_argument("--plugin", type=Path, metavar="REPO",
                    help="check BASE's registration from this checkout and load_plugins()")
    ap.add_argument("--tokenizer", type=Path, metavar="DIR",
                    help="also run sglang's xgrammar backend with this tokenizer")
    ap.add_argument("--skip-xgrammar", action="store_true")
    ap.add_argument("--only-so", action="store_true", help="only the shared-object check")
    args = ap.parse_args(argv)
    try:
        if args.so is not None:
            shared_objects(args.so)
        if args.only_so:
            return 0
        versions()
        if not args.skip_xgrammar:
            xgrammar_works()
        chain(args.cpu)
        if args.tokenizer is not None and not args.skip_xgrammar:
            grammar_backend(args.tokenizer, args.cpu)
        if args.plugin is not None:
            plugin(args.plugin)
    except CheckFailed as exc:
        print(f"BUNDLE CHECK FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
