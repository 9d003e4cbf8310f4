"""Writes a tiny multimodal projector for TESTS ONLY: a CLIP-style vision encoder with
random weights (image 32x32, patch 8, width 64, one block) and an `mlp` projector whose
output width matches a text model's embedding width (576 = SmolLM2-135M's).

What such a projector makes a model say means nothing; every mechanism around it is
real: llama.cpp's mtmd loads it, turns each image into 16 embedding tokens, and two
different images change the text model's next-token logits. The output is deterministic
(a fixed seed), so tests can rebuild it instead of shipping a binary file.

    python -m edge_testkit.models.make_test_projector OUT.gguf [--width 576] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from edge_testkit.models.gguf_test_weights import EncoderWeights, write_out

IMAGE_SIZE = 32
PATCH_SIZE = 8
HIDDEN = 64
FEED_FORWARD = 128
HEADS = 4
BLOCKS = 1
MERGE = 2  # the tiling (idefics3) projector's pixel-shuffle factor


def write_projector(out: Path, *, width: int = 576, seed: int = 0, tiles: int = 0,
                    skip_tensors: tuple[str, ...] = (),
                    override_u32: dict[str, int] | None = None,
                    wrong_type_keys: tuple[str, ...] = ()) -> Path:
    """`tiles` > 0 writes an `idefics3` (SmolVLM-style) projector instead, whose
    preprocessing splits an image into an overview and up to tiles x tiles tiles: mtmd
    then makes several image chunks of one image (4 tokens each: a 2x2 pixel shuffle).
    `skip_tensors`, `override_u32` and `wrong_type_keys` write broken files on purpose,
    for the load checks' tests (a missing tensor, a bad head count, an INT32 key)."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), "clip")
    u32 = {
        "clip.vision.image_size": IMAGE_SIZE,
        "clip.vision.patch_size": PATCH_SIZE,
        "clip.vision.embedding_length": HIDDEN,
        "clip.vision.feed_forward_length": FEED_FORWARD,
        "clip.vision.block_count": BLOCKS,
        "clip.vision.attention.head_count": HEADS,
        "clip.vision.projection_dim": width,
        **({"clip.vision.preproc_image_size": IMAGE_SIZE * tiles,
            "clip.vision.projector.scale_factor": MERGE} if tiles else {}),
        **(override_u32 or {}),
    }
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", "idefics3" if tiles else "mlp")
    for key, value in u32.items():
        if key in wrong_type_keys:
            writer.add_int32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    weights = EncoderWeights(rng)
    matrix, vector = weights.matrix, weights.vector
    n_patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    tensors: dict[str, np.ndarray] = {
        # numpy shapes are ggml's dimensions reversed
        "v.patch_embd.weight": (rng.standard_normal((HIDDEN, 3, PATCH_SIZE, PATCH_SIZE))
                                * 0.1).astype(np.float16),
        "v.patch_embd.bias": vector(HIDDEN),
        "v.position_embd.weight": (rng.standard_normal((n_patches, HIDDEN)) * 0.1)
        .astype(np.float32),
    }
    for block in range(BLOCKS):
        tensors.update(weights.block(f"v.blk.{block}", HIDDEN, FEED_FORWARD))
    if tiles:  # pixel shuffle: MERGE x MERGE patches into one token, then one projection
        tensors["mm.model.fc.weight"] = matrix(width, HIDDEN * MERGE * MERGE)
    else:
        tensors["mm.0.weight"] = matrix(width, HIDDEN)
        tensors["mm.0.bias"] = vector(width)
        tensors["mm.2.weight"] = matrix(width, width)
        tensors["mm.2.bias"] = vector(width)
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
    parser.add_argument("--tiles", type=int, default=0,
                        help="write a tiling idefics3 projector (up to TILES x TILES tiles)")
    args = parser.parse_args()
    print(write_projector(args.out, width=args.width, seed=args.seed, tiles=args.tiles))


if __name__ == "__main__":
    main()
