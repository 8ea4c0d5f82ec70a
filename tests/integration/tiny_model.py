"""A randomly initialised tiny language model, written as a GGUF file without the
internet or any package: the lab assistant's tests prove the path (a member asks through
the hub, llama.cpp answers), not the answers.

A llama-architecture model (2 layers, 64 wide, 4 heads) with a byte-level vocabulary of
262 tokens and a ChatML chat template, all weights float32: 0.4 MiB. The layout is
GGUF version 3 as llama.cpp's gguf-py writes it (docs: ggml's docs/gguf.md): header,
key-value metadata, tensor infos, then each tensor's data aligned to 32 bytes.

It never ends an answer itself, so that an answer's length is the lab's cap: every
token's embedding holds 1.0 in its first dimension, which the small random layers barely
move, and the output row of each control token (</s>, <|im_end|> ...) weighs that
dimension at -8: a logit near -60 against the others' few tenths. (With plain random
weights CI once saw <|im_end|> drawn as the fourth of four tokens.)
"""

from __future__ import annotations

import random
import struct
from array import array
from pathlib import Path

ALIGN = 32
U32, I32, F32, STRING, ARRAY = 4, 5, 6, 8, 9  # GGUF value types
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        elem, items = value
        return struct.pack("<IQ", elem, len(items)) + b"".join(_value(elem, v) for v in items)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f"}[kind], value)


def write_tiny_model(path: Path, seed: int = 0) -> Path:
    embd, heads, layers, ff, ctx = 64, 4, 2, 128, 4096
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>",
              *(f"<0x{b:02X}>" for b in range(256)), "\u2581"]
    types = [2, 3, 3, 3, 3, *([6] * 256), 1]  # unknown, control..., byte..., normal
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "gpulab-tiny-random"),
        ("llama.context_length", U32, ctx), ("llama.embedding_length", U32, embd),
        ("llama.block_count", U32, layers), ("llama.feed_forward_length", U32, ff),
        ("llama.attention.head_count", U32, heads),
        ("llama.attention.head_count_kv", U32, heads),
        ("llama.rope.dimension_count", U32, embd // heads),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("general.file_type", U32, 0),  # all float32
        ("tokenizer.ggml.model", STRING, "llama"), ("tokenizer.ggml.pre", STRING, "default"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, [0.0] * len(tokens))),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 4),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.chat_template", STRING, CHAT_TEMPLATE),
    ]
    rng = random.Random(seed)
    tensors: list[tuple[str, tuple[int, ...], array]] = []

    def weights(name: str, *shape: int) -> None:  # shape as numpy says it (rows, columns)
        n = 1
        for d in shape:
            n *= d
        tensors.append((name, shape, array("f", (rng.gauss(0, 0.02) for _ in range(n)))))

    def ones(name: str, n: int) -> None:
        tensors.append((name, (n,), array("f", [1.0] * n)))

    weights("token_embd.weight", len(tokens), embd)
    _, _, embeddings = tensors[-1]
    for t in range(len(tokens)):
        embeddings[t * embd] = 1.0  # the first dimension: the same for every token
    ones("output_norm.weight", embd)
    weights("output.weight", len(tokens), embd)
    _, _, output = tensors[-1]
    for t in range(len(tokens)):
        output[t * embd] = -8.0 if types[t] in (2, 3) else 0.0  # unknown, control
    for i in range(layers):
        ones(f"blk.{i}.attn_norm.weight", embd)
        ones(f"blk.{i}.ffn_norm.weight", embd)
        for k in ("q", "k", "v", "output"):
            weights(f"blk.{i}.attn_{k}.weight", embd, embd)
        weights(f"blk.{i}.ffn_gate.weight", ff, embd)
        weights(f"blk.{i}.ffn_up.weight", ff, embd)
        weights(f"blk.{i}.ffn_down.weight", embd, ff)

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, kind, value in metadata:
        out += _string(key) + struct.pack("<I", kind) + _value(kind, value)
    offset = 0
    for name, shape, data in tensors:
        # ggml lists dimensions innermost first: numpy's shape reversed
        out += _string(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        out += struct.pack("<IQ", 0, offset)  # type F32, offset in the data section
        offset += -(-len(data) * 4 // ALIGN) * ALIGN
    out += b"\0" * (-len(out) % ALIGN)
    for _, _, data in tensors:
        raw = data.tobytes()
        out += raw + b"\0" * (-len(raw) % ALIGN)
    path.write_bytes(bytes(out))
    return path


if __name__ == "__main__":
    import sys

    print(write_tiny_model(Path(sys.argv[1])))
