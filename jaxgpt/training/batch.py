"""The batch contract: what every data source hands the engine, and every objective reads.

A batch is a dict of (rows, seq) arrays, row r of each describing the same seq positions:

    inputs     int32    the tokens the model reads
    targets    int32    what each position is scored against (the next token; the masked
                        objective scores the inputs themselves and ignores this)
    weights    float32  how much each position's loss counts: 0 for padding, for a prompt
                        the model is not taught to write, ...; absent: 1 everywhere
    segments   int32    which sequence of the row each token belongs to: a token attends only
                        to tokens of its own segment (packed documents, padding); absent:
                        one sequence a row
    positions  int32    each token's position within its segment, what RoPE, ALiBi's
                        distances and position tables read; absent: 0, 1, ..., seq - 1

and for an encoder–decoder (model.encoder_layers), what its encoder reads, (rows, source seq):

    sources, source_segments, source_positions
                        the source tokens, their segments (a target token attends to the
                        source tokens of its own segment) and positions

and for learning from rewards (train.rl; jaxgpt/data/rollouts.py), beside the sampled answers:

    advantages        float32  each scored position's advantage, its answer's
    reference_losses  float32  the starting model's cross-entropy there (the KL's reference)
    sampling_losses   float32  the cross-entropy there of the parameters that sampled the
                               answers (train.rl.updates > 1: PPO's ratio's denominator)

and for a Vision Transformer (model.patch_size; jaxgpt/data/images.py), beside its inputs:

    pixels     uint8    (rows, seq, patch_size x patch_size x channels): each position's
                        patch, zeros at the class token

A field whose value would be its default is left out, so a batch of plain windows is
{inputs, targets} and computes exactly what it did before the other fields existed (and a run
compiles only what its batches use). A (rows, seq + 1) array of windows cut from a token stream
stands for {inputs: windows[:, :-1], targets: windows[:, 1:]} wherever a batch is taken
(`as_batch`): the lab's tools and tests score windows directly.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.sharding import batch_sharding

FIELDS = ("inputs", "targets", "weights", "segments", "positions", "sources", "source_segments", "source_positions",
          "pixels", "advantages", "reference_losses", "sampling_losses")  # fmt: skip
MODEL_INPUTS = ("segments", "positions", "sources", "source_segments", "source_positions", "pixels")  # beside inputs
REQUIRED = ("inputs", "targets")


def as_batch(batch) -> dict:
    """`batch` as the contract's dict: a dict is checked and returned as it is, an array of
    windows (rows, seq + 1) split into inputs and targets."""
    if isinstance(batch, Mapping):
        unknown = set(batch) - set(FIELDS)
        missing = set(REQUIRED) - set(batch)
        if unknown or missing:
            raise ValueError(f"a batch holds {FIELDS} ({REQUIRED} at least); got {sorted(batch)}")
        return dict(batch)
    return {"inputs": batch[:, :-1], "targets": batch[:, 1:]}


def windows_batch(windows: np.ndarray) -> dict[str, np.ndarray]:
    """The batch of windows (rows, seq + 1) as the data layer hands it over: two arrays."""
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


def batch_fields(run) -> dict[str, type]:
    """The fields of `run`'s batches (a RunConfig's) and their dtypes: what its step is compiled for."""
    fields = {"inputs": jnp.int32, "targets": jnp.int32}
    if run.train.rl:  # sampled answers, one a row (jaxgpt/data/rollouts.py)
        fields |= {"weights": jnp.float32, "advantages": jnp.float32}
        fields |= {"reference_losses": jnp.float32}
        return fields | ({"sampling_losses": jnp.float32} if run.train.rl.updates > 1 else {})
    if run.data.examples:  # packed examples, the loss on their answers (jaxgpt/data/pairs.py)
        fields["weights"] = jnp.float32
    if run.data.examples or run.data.attend_within_documents:
        fields |= {"segments": jnp.int32, "positions": jnp.int32}
    if run.model.encoder_layers:  # what the encoder reads
        fields |= {"sources": jnp.int32, "source_segments": jnp.int32, "source_positions": jnp.int32}
    if run.model.patch_size:  # an image a row, scored at its class token
        fields |= {"weights": jnp.float32, "pixels": jnp.uint8}
    return fields


def batch_layout(run, mesh) -> dict:
    """The shapes, dtypes and shardings of `run`'s batches over `mesh` (jax.ShapeDtypeStructs,
    nothing allocated): what a step is compiled for before any batch exists."""
    shape, where = (run.train.batch_size, run.row_length), batch_sharding(mesh)
    patch = (run.model.patch_size**2 * run.model.channels,)
    return {
        name: jax.ShapeDtypeStruct(shape + (patch if name == "pixels" else ()), dtype, sharding=where)
        for name, dtype in batch_fields(run).items()
    }


def rows_of(batch: Mapping) -> int:
    return batch["inputs"].shape[0]


def length_of(batch: Mapping) -> int:
    return batch["inputs"].shape[1]


def scored_weight(batch: Mapping):
    """How many positions the batch scores (their weights' sum): rows x seq without weights."""
    if "weights" in batch:
        return jnp.sum(batch["weights"].astype(jnp.float32))
    return float(rows_of(batch) * length_of(batch))


def segment_positions(segments: np.ndarray) -> np.ndarray:
    """Each token's position within its segment, for segments (rows, seq) whose tokens of one
    segment are contiguous: 0 where a segment starts, counting up to its end."""
    segments = np.asarray(segments)
    index = np.broadcast_to(np.arange(segments.shape[-1]), segments.shape)
    starts = np.ones(segments.shape, bool)
    starts[..., 1:] = segments[..., 1:] != segments[..., :-1]
    start_index = np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
    return (index - start_index).astype(np.int32)
