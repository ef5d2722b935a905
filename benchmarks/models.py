"""Model files of realistic shapes, made on the machine: Llama-shaped GGUF files with random F16 weights.

Speed does not depend on what the weights are, only on their shape and type, and nothing may be downloaded
at run time; so the 0.5B and 1.5B models users run are made here (issue 44): the layer count, widths, heads
and KV heads of a well-known open model of that size (see :data:`SHAPES` for the source of each), written as
the ``llama`` architecture, with SmolLM2's real tokenizer copied from the bundled GGUF (so the vocabulary is
SmolLM2's 49152 tokens, not the source model's: the output head is smaller than the source's, the body is
the same) and random weights (normal, std 0.02; norms 1.0) drawn from ``numpy`` seeded per tensor. The same
size and seed give the same bytes. Tensors are written one at a time (GGUF writer in streaming mode), so making
the 1.5B file (~2.8 GB) holds one tensor in memory, not the model.

``--hf`` also writes the matching Hugging Face folder (``AutoModelForCausalLM.from_config`` and
``save_pretrained``, float16 safetensors, SmolLM2's tokenizer): the very same weights (the Q and K rows in
transformers' order, which the GGUF permutes for llama.cpp's rope), so ``autotune run --model FOLDER --gguf
FILE`` has both backends run the same model.

**Speed only.** Quality figures (perplexity, KL divergence of a quant against the source) are not meaningful
on random weights, and a quality guard would choose weight types by noise. A made file says so in its
metadata: ``autotune.speed_only = true`` and ``general.description``. autotune reads the key
(:attr:`tuner.config.model.ModelInfo.speed_only`): a run on a made model turns the quality guards off by itself
and says so in one line, and its recommendation marks quality figures as not meaningful. A benchmark on a made
model names the weight types it compares (``benchmarks/grid.py --model FILE --quants Q8_0,Q6_K,Q4_K_M,Q4_0,F16``)
instead of letting a guard choose. These models never stand in for real ones in quality tests.

Usage: ``python benchmarks/models.py --size 0.5b --out /tmp/made-models [--hf] [--seed 0]``; the last line
printed is the GGUF file's path (with ``--hf``, the folder's path is the line before it). A second call
with the same arguments finds the file by its name (shape and seed) and reuses it.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/models.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tuner.config.model import SPEED_ONLY_KEY, bundled_model_path  # noqa: E402
from tuner.errors import AutotuneError  # noqa: E402

MAKER_VERSION = 1  # part of every file name: a change to what is written makes new files, never reuses old ones
INIT_STD = 0.02  # transformers' initializer_range for Llama
DEFAULT_OUT = Path(os.environ.get("AUTOTUNE_MADE_MODELS", Path(tempfile.gettempdir()) / "made-models"))


@dataclass(frozen=True)
class Shape:
    """A model's shape (head width is ``n_embd / n_head``, as in the sources below)."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    context_length: int
    rope_theta: float
    source: str

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.n_embd // self.n_head

    def tag(self, vocab: int) -> str:
        """The shape as a file-name part."""
        return (f"L{self.n_layer}-E{self.n_embd}-F{self.n_ff}-H{self.n_head}-KV{self.n_head_kv}"
                f"-V{vocab}-C{self.context_length}")


SHAPES = {
    # A few layers and small widths: made in seconds, what the tests tune.
    "tiny": Shape(4, 256, 768, 4, 2, 4096, 1e5, "none: a small shape for tests"),
    # Qwen/Qwen2.5-0.5B config.json: 24 layers, hidden 896, intermediate 4864, 14 heads, 2 KV heads, head 64,
    # rope_theta 1e6, 32768 positions, tied embeddings (its q/k/v biases are left out: llama has none).
    "0.5b": Shape(24, 896, 4864, 14, 2, 32768, 1e6, "Qwen2.5-0.5B (body; SmolLM2 vocabulary)"),
    # Qwen/Qwen2.5-1.5B config.json: 28 layers, hidden 1536, intermediate 8960, 12 heads, 2 KV heads, head 128,
    # rope_theta 1e6, 32768 positions, tied embeddings (biases left out as above).
    "1.5b": Shape(28, 1536, 8960, 12, 2, 32768, 1e6, "Qwen2.5-1.5B (body; SmolLM2 vocabulary)"),
}


def shape_of(size: str) -> Shape:
    """The shape named ``size`` (one of :data:`SHAPES`); AutotuneError for another name."""
    if size not in SHAPES:
        raise AutotuneError(f"unknown model size {size!r}: use one of {', '.join(SHAPES)}")
    return SHAPES[size]


@functools.lru_cache(maxsize=1)
def tokenizer_fields() -> tuple[tuple[tuple[str, object, object, object], ...], int]:
    """SmolLM2's tokenizer as GGUF key-values (key, value, type, array item type), and its vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(str(bundled_model_path()))
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            fields.append((key, field.contents(), field.types[0], sub))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return tuple(fields), vocab


def hf_tensors(shape: Shape, vocab: int, seed: int) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
    """The model's tensors in transformers' names, shapes (out, in) and dtypes, in the order they are written."""
    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    q, kv = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    yield "model.embed_tokens.weight", (vocab, shape.n_embd), f16
    for i in range(shape.n_layer):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (shape.n_embd,), f32
        yield p + "self_attn.q_proj.weight", (q, shape.n_embd), f16
        yield p + "self_attn.k_proj.weight", (kv, shape.n_embd), f16
        yield p + "self_attn.v_proj.weight", (kv, shape.n_embd), f16
        yield p + "self_attn.o_proj.weight", (shape.n_embd, q), f16
        yield p + "post_attention_layernorm.weight", (shape.n_embd,), f32
        yield p + "mlp.gate_proj.weight", (shape.n_ff, shape.n_embd), f16
        yield p + "mlp.up_proj.weight", (shape.n_ff, shape.n_embd), f16
        yield p + "mlp.down_proj.weight", (shape.n_embd, shape.n_ff), f16
    yield "model.norm.weight", (shape.n_embd,), f32


def values(index: int, dims: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
    """Tensor number ``index``'s values: ones for a norm (1-D), else normal with std :data:`INIT_STD`,
    drawn from its own seeded generator (so any tensor can be made alone, the same every time)."""
    if len(dims) == 1:
        return np.ones(dims, dtype=dtype)
    rng = np.random.default_rng([seed, index])
    out = rng.standard_normal(dims, dtype=np.float32)
    out *= INIT_STD
    return out.astype(dtype)


GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    """llama.cpp's name of a transformers tensor."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Q/K rows from transformers' rope order to llama.cpp's (what llama.cpp's convert_hf_to_gguf.py does)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def model_name(size: str, shape: Shape, vocab: int, seed: int) -> str:
    """The file stem: size, shape and seed, so a cached file is found again only for the same arguments."""
    return f"made-{size}-{shape.tag(vocab)}-f16-seed{seed}-v{MAKER_VERSION}"


def write_gguf(path: Path, size: str, seed: int) -> Path:
    """Write the GGUF file of ``size`` at ``path`` (through a temporary file beside it, renamed when whole)."""
    import gguf

    shape = shape_of(size)
    tok_fields, vocab = tokenizer_fields()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, "llama")
    try:
        writer.add_name(f"autotune made {size} ({shape.source})")
        writer.add_description(f"random weights (seed {seed}) in the shape of {shape.source}: for speed "
                               "measurements only, its quality figures mean nothing")
        writer.add_bool(SPEED_ONLY_KEY, True)
        writer.add_uint32("autotune.seed", seed)
        writer.add_string("autotune.shape_source", shape.source)
        writer.add_block_count(shape.n_layer)
        writer.add_context_length(shape.context_length)
        writer.add_embedding_length(shape.n_embd)
        writer.add_feed_forward_length(shape.n_ff)
        writer.add_head_count(shape.n_head)
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_rope_freq_base(shape.rope_theta)
        writer.add_rope_dimension_count(shape.head_dim)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_vocab_size(vocab)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        for key, value, vtype, sub in tok_fields:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        specs = list(hf_tensors(shape, vocab, seed))
        for name, dims, dtype in specs:
            writer.add_tensor_info(gguf_name(name), dims, dtype, int(np.prod(dims)) * dtype.itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, (name, dims, dtype) in enumerate(specs):
            w = values(index, dims, dtype, seed)
            if name.endswith("q_proj.weight"):
                w = rope_permute(w, shape.n_head)
            elif name.endswith("k_proj.weight"):
                w = rope_permute(w, shape.n_head_kv)
            writer.write_tensor_data(w)
            del w
        writer.close()
        tmp.replace(path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return path


def write_hf(folder: Path, size: str, seed: int) -> Path:
    """Write the Hugging Face folder of ``size`` (same weights as its GGUF file) at ``folder``, whole or not at all."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    shape = shape_of(size)
    _, vocab = tokenizer_fields()
    bundled = bundled_model_path()
    tokenizer = AutoTokenizer.from_pretrained(bundled.parent, gguf_file=bundled.name)
    config = LlamaConfig(vocab_size=vocab, hidden_size=shape.n_embd, intermediate_size=shape.n_ff,
                         num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
                         num_key_value_heads=shape.n_head_kv, head_dim=shape.head_dim,
                         max_position_embeddings=shape.context_length, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    params = dict(model.named_parameters())
    for index, (name, dims, dtype) in enumerate(hf_tensors(shape, vocab, seed)):
        w = torch.from_numpy(values(index, dims, dtype, seed)).to(torch.float16)
        module, _, leaf = name.rpartition(".")
        model.get_submodule(module).register_parameter(leaf, torch.nn.Parameter(w, requires_grad=False))
        params.pop(name)
    model.tie_weights()
    model.lm_head.weight = model.model.embed_tokens.weight
    left = [n for n in params if n != "lm_head.weight"]
    if left:
        raise RuntimeError(f"tensors not made: {left}")
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.replace(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def make_model(size: str, out_dir: str | os.PathLike = DEFAULT_OUT, hf: bool = False, seed: int = 0) -> Path:
    """The GGUF file of the model of ``size`` ("tiny", "0.5b", "1.5b") in ``out_dir``, made unless already there.

    With ``hf`` its Hugging Face folder is made too, beside it (:func:`hf_folder_of` gives its path). The
    same size and seed always give the same file; AutotuneError for an unknown size.
    """
    shape = shape_of(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _, vocab = tokenizer_fields()
    path = out / f"{model_name(size, shape, vocab, seed)}.gguf"
    if not path.is_file():
        write_gguf(path, size, seed)
    if hf:
        folder = hf_folder_of(path)
        if not (folder / "config.json").is_file():
            write_hf(folder, size, seed)
    return path


def hf_folder_of(gguf_path: str | os.PathLike) -> Path:
    """The Hugging Face folder made beside a made GGUF file (``--hf``)."""
    p = Path(gguf_path)
    return p.with_name(p.stem + "-hf")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=list(SHAPES), required=True, help="which shape")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the files (default: %(default)s)")
    p.add_argument("--hf", action="store_true", help="also write the Hugging Face folder of the same weights")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights (default: %(default)s)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    try:
        path = make_model(args.size, args.out, hf=args.hf, seed=args.seed)
    except AutotuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.size}: {path.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - start:.1f} s "
          f"({shape_of(args.size).source})", file=sys.stderr)
    if args.hf:
        print(hf_folder_of(path))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
