"""Writes a tiny audio projector for TESTS ONLY: a Whisper-style audio encoder with random
weights (80 mel bins, width 64, one block) and a Qwen2-Audio (`qwen2a`) projection whose
output width matches a text model's embedding width (576 = SmolLM2-135M's).

What such a projector makes a model say means nothing; every mechanism around it is
real: llama.cpp's mtmd loads it, computes the log-mel spectrogram of the samples, runs
the encoder (two convolutions, attention, average pooling) and hands the text model 750
embedding tokens per 30 seconds of audio (Whisper's window: a shorter clip is padded to
it, a longer one takes one more window per 30 seconds). Deterministic (a fixed seed), so
tests rebuild it instead of shipping a binary file.

    python -m edge_testkit.models.make_test_audio_projector OUT.gguf [--width 576]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from edge_testkit.models.gguf_test_weights import EncoderWeights, write_out

MEL_BINS = 80
HIDDEN = 64
FEED_FORWARD = 128
HEADS = 4
BLOCKS = 1
POSITIONS = 1500  # one Whisper window after the stride-2 convolution: 3000 frames / 2
TOKENS_PER_WINDOW = POSITIONS // 2  # after the projector's average pooling
# Outputs the size of the text model's token embeddings (about 0.04 an element): a random
# encoder's unit-sized ones would drive its activations so large that the rounding of
# different batch shapes' kernels shows in logprobs.
OUTPUT_SCALE = 0.05


def write_audio_projector(out: Path, *, width: int = 576, seed: int = 0,
                          skip_tensors: tuple[str, ...] = (),
                          override_u32: dict[str, int] | None = None,
                          extra_tensors: tuple[str, ...] = ()) -> Path:
    """`skip_tensors`, `override_u32` and `extra_tensors` write broken files on purpose,
    for the load checks' tests (a missing tensor, a bad shape, a key bias mtmd asserts
    against)."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), "clip")
    u32 = {
        "clip.audio.embedding_length": HIDDEN,
        "clip.audio.feed_forward_length": FEED_FORWARD,
        "clip.audio.block_count": BLOCKS,
        "clip.audio.attention.head_count": HEADS,
        "clip.audio.projection_dim": width,
        "clip.audio.num_mel_bins": MEL_BINS,
        **(override_u32 or {}),
    }
    writer.add_bool("clip.has_vision_encoder", False)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "qwen2a")
    for key, value in u32.items():
        writer.add_uint32(key, value)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)

    weights = EncoderWeights(rng)
    matrix, vector = weights.matrix, weights.vector
    tensors: dict[str, np.ndarray] = {
        # numpy shapes are ggml's dimensions reversed: (out channels, in channels, kernel)
        "a.conv1d.1.weight": (rng.standard_normal((HIDDEN, MEL_BINS, 3)) * 0.1)
        .astype(np.float16),
        "a.conv1d.1.bias": vector(HIDDEN).reshape(HIDDEN, 1),
        "a.conv1d.2.weight": (rng.standard_normal((HIDDEN, HIDDEN, 3)) * 0.1)
        .astype(np.float16),
        "a.conv1d.2.bias": vector(HIDDEN).reshape(HIDDEN, 1),
        "a.position_embd.weight": (rng.standard_normal((POSITIONS, HIDDEN)) * 0.1)
        .astype(np.float32),
        "a.post_ln.weight": vector(HIDDEN, 1.0),
        "a.post_ln.bias": vector(HIDDEN, 0.0),
        "mm.a.fc.weight": (matrix(width, HIDDEN) * OUTPUT_SCALE).astype(np.float16),
        "mm.a.fc.bias": vector(width) * OUTPUT_SCALE,
    }
    for block in range(BLOCKS):  # Whisper's key projection has no bias
        tensors.update(weights.block(f"a.blk.{block}", HIDDEN, FEED_FORWARD, key_bias=False))
    for name in extra_tensors:
        tensors[name] = vector(HIDDEN)
    for name, data in tensors.items():
        if name not in skip_tensors:
            writer.add_tensor(name, data)
    return write_out(writer, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=576,
                        help="output width: the text model's embedding width")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_audio_projector(args.out, width=args.width, seed=args.seed))


if __name__ == "__main__":
    main()
