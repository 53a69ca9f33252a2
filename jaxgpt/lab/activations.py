"""Named activations: read any of them in one forward pass, change any of them inside it.

Every family the engine trains has these sites (jaxgpt/model/sites.py puts them in the forward
pass), named as TransformerLens names them. Shapes: b batch, t positions, s key positions,
H query heads, K key/value heads, d head_dim, D d_model, F the MLP's hidden width.

    hook_embed                        (b, t, D)     token embeddings (times sqrt(D) with scale_embeddings)
    hook_pos_embed                    (b, t, D)     the position table's rows (learned, sinusoidal)
    blocks.L.hook_resid_pre           (b, t, D)     the residual stream entering block L
    blocks.L.attn.hook_q              (b, t, H, d)  queries, before rotary positions
    blocks.L.attn.hook_k, hook_v      (b, s, K, d)  keys and values, keys before rotary positions
    blocks.L.attn.hook_rot_q, hook_rot_k            queries and keys after rotary positions (rope)
    blocks.L.attn.hook_attn_scores    (b, H, t, s)  q.k scaled, plus the mask (-inf) and ALiBi
    blocks.L.attn.hook_pattern        (b, H, t, s)  the softmax of the scores
    blocks.L.attn.hook_attn_gate      (b, t, H, d)  the sigmoid gate on each head's output (model.attention_gate;
                                                    (b, t, H, 1) headwise)
    blocks.L.attn.hook_z              (b, t, H, d)  each head's output, before the output matrix (gated)
    blocks.L.conv.hook_conv_in        (b, t, D)     a convolution mixer's values (model.token_mixer)
    blocks.L.conv.hook_conv_out       (b, t, D)     the convolution's output, before its projection
    blocks.L.hook_attn_out            (b, t, D)     what attention (or the convolution) writes into the stream
    blocks.L.hook_resid_mid           (b, t, D)     the stream after attention
    blocks.L.cross_attn.hook_*                      an encoder–decoder's cross-attention (as attn;
                                                    keys and values from the encoder's output)
    blocks.L.hook_cross_attn_out      (b, t, D)     what cross-attention writes
    blocks.L.hook_resid_mid_cross     (b, t, D)     the stream after cross-attention
    blocks.L.mlp.hook_pre             (b, t, F)     the MLP's pre-activation (SwiGLU: the gate)
    blocks.L.mlp.hook_pre_linear      (b, t, F)     SwiGLU's linear half
    blocks.L.mlp.hook_post            (b, t, F)     after the activation (SwiGLU: the product)
    blocks.L.hook_mlp_out             (b, t, D)     what the MLP (or the experts) writes
    blocks.L.hook_resid_post          (b, t, D)     the stream leaving block L
    ln_final.hook_out                 (b, t, D)     what the LM head reads (post-norm: the stream)
    encoder.<any of the above>                      an encoder–decoder's encoder, on the sources

With post-norm blocks, resid_mid and resid_post are after their norms. A mixture-of-experts
block has hook_mlp_out but no mlp.* sites; attention-only blocks no MLP sites at all. The names
are TransformerLens 4's (its TransformerBridge; tests/test_transformer_lens.py compares every
one on a GPT-2-family run); its norms' hook_normalized and hook_scale are not sites here.

`run_with_cache(config, params, tokens, names)` returns the logits and the named activations;
`run_with_interventions(config, params, tokens, edits)` the logits with activations changed,
where `edits` maps site names to `Edit`s (`replace`, `zero`, `mean_ablate`, `steer` build them,
for chosen heads and positions). Edits are arrays, so a sweep of them runs as one compiled program:
`sweep`. Runs in float32 and keeps the run's layout,
layers scanned or not, rematerialised or not.
"""

from __future__ import annotations

import re
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.model.sites import CACHE, INTERVENTIONS
from jaxgpt.model.transformer import GPT, init_params

# Which axis of a site holds heads and which positions (the batch is axis 0 everywhere).
HEAD_AXIS = {"hook_q": 2, "hook_rot_q": 2, "hook_k": 2, "hook_rot_k": 2, "hook_v": 2, "hook_z": 2}
HEAD_AXIS |= {"hook_attn_gate": 2}
HEAD_AXIS |= {"hook_attn_scores": 1, "hook_pattern": 1}
POSITION_AXIS = {"hook_attn_scores": 2, "hook_pattern": 2}  # query positions; 1 for every other site

# Module names in the parameters that the site names spell otherwise.
_MODULE_NAMES = {"cross_attn": "cross"}
_SITE_NAMES = {"final_norm_out": "ln_final.hook_out"}


class Edit(NamedTuple):
    """What an intervention does at one site: x -> (1 - mask) * x + mask * value + add, each array
    broadcastable to the site's shape (jaxgpt/model/sites.py); what is not given is 0."""

    mask: jax.Array | float = 0.0
    value: jax.Array | float = 0.0
    add: jax.Array | float = 0.0


# The sites of one block, and the model's, in the forward pass's order.
SITE_ORDER = (
    "hook_embed hook_pos_embed hook_resid_pre hook_q hook_k hook_v hook_rot_q hook_rot_k hook_attn_scores "
    "hook_pattern hook_attn_gate hook_z hook_conv_in hook_conv_out hook_attn_out hook_resid_mid "
    "hook_cross_attn_out hook_resid_mid_cross hook_pre hook_pre_linear hook_post hook_mlp_out hook_resid_post hook_out"
).split()


def flax_path(name: str) -> tuple[str, ...]:
    """A site's full name -> its path in the unscanned model's collections:
    "blocks.1.attn.hook_z" -> ("block_1", "attn", "hook_z")."""
    parts = name.replace("ln_final.hook_out", "final_norm_out").split(".")
    path = []
    while parts:
        part = parts.pop(0)
        path.append(f"block_{parts.pop(0)}" if part == "blocks" and parts else _MODULE_NAMES.get(part, part))
    return tuple(path)


def site_name(path: tuple[str, ...]) -> str:
    """The inverse of flax_path."""
    back = {v: k for k, v in _MODULE_NAMES.items()}
    parts = []
    for part in path:
        block = re.fullmatch(r"block_(\w+)", part)
        parts.append(f"blocks.{block.group(1)}" if block else _SITE_NAMES.get(part, back.get(part, part)))
    return ".".join(parts)


def forward_order(name: str) -> tuple:
    """A sort key putting site names in the order the forward pass reaches them."""
    decoder = not name.startswith("encoder.")
    block = re.search(r"blocks\.(\d+)\.", name)
    leaf = name.rsplit(".", 1)[-1]
    layer = int(block.group(1)) if block else (1e9 if leaf == "hook_out" else -1)
    place = SITE_ORDER.index(leaf)
    if ".cross_attn." in name:  # between the stream after self-attention and cross-attention's output
        place = SITE_ORDER.index("hook_resid_mid") + (1 + place) / 100
    return decoder, layer, place


def _layer(array, layer: int):
    """One layer of a scanned stack: an array's, or a shape's (jax.eval_shape's answers)."""
    if isinstance(array, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(array.shape[1:], array.dtype)
    return array[layer]


def _sown(tree, path=()) -> dict:
    """The "sites" collection -> {full name: array}, in the forward pass's order; a scanned
    stack of blocks becomes one name per layer."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, tuple):  # sow's tuple of one
            out[site_name((*path, key))] = value[0]
        elif key == "blocks":  # scanned: every leaf has a leading layer axis
            for name, array in _sown(value, (*path, "block_STACK")).items():
                for layer in range(array.shape[0]):
                    out[name.replace("blocks.STACK", f"blocks.{layer}")] = _layer(array, layer)
        else:
            out |= _sown(value, (*path, key))
    return dict(sorted(out.items(), key=lambda item: forward_order(item[0])))


def interventions_collection(config: ModelConfig, edits: dict[str, Edit]) -> dict:
    """{site name: Edit} -> the "interventions" collection in the model's layout. Scanned layers
    (config.scan_layers) take one stacked entry per site: a layer without an edit there gets
    mask 0 and add 0, which leave it exactly as it was."""
    tree: dict = {}
    for name, edit in edits.items():
        *scopes, leaf = flax_path(name)
        node = tree
        for scope in scopes:
            node = node.setdefault(scope, {})
        node[leaf] = dict(edit._asdict())
    if not config.scan_layers:
        return tree
    encoder = dict(tree.get("encoder", {}))
    if encoder:
        tree["encoder"] = _stacked(encoder, config.encoder_layers)
    return _stacked(tree, config.n_layer)


def _stacked(tree: dict, layers: int) -> dict:
    """block_i entries -> one "blocks" entry whose arrays have a leading layer axis."""
    blocks = [tree.pop(f"block_{i}", None) for i in range(layers)]
    present = [b for b in blocks if b is not None]
    if not present:
        return tree
    leaves = {}
    for block in present:  # the union of the sites edited in any layer
        for path, leaf in jax.tree_util.tree_leaves_with_path(block):
            leaves.setdefault(path, []).append(leaf)
    stacked: dict = {}
    for path, arrays in leaves.items():
        shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in arrays))
        per_layer = []
        for block in blocks:
            found = _find(block, path)
            per_layer.append(jnp.broadcast_to(found, shape) if found is not None else jnp.zeros(shape))
        node = stacked
        keys = [p.key for p in path]
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = jnp.stack(per_layer)
    tree["blocks"] = stacked
    return tree


def _find(tree, path):
    for p in path:
        if tree is None or p.key not in tree:
            return None
        tree = tree[p.key]
    return tree


def lab_config(config: ModelConfig) -> ModelConfig:
    """The run's model as the lab runs it: float32 whatever it trained in, layout unchanged."""
    return config.replace(dtype="float32")


@partial(jax.jit, static_argnames=("config", "names"))
def _forward(config: ModelConfig, params, tokens, inputs: dict, edits: dict, names: tuple[str, ...] | None):
    variables = {"params": params}
    if edits:
        variables[INTERVENTIONS] = interventions_collection(config, edits)
    if names is None:
        return GPT(config).apply(variables, tokens, **inputs), {}
    logits, state = GPT(config).apply(variables, tokens, **inputs, mutable=[CACHE])
    sown = _sown(state[CACHE])
    missing = sorted(set(names) - set(sown))
    if missing:
        raise ValueError(f"no site named {missing[0]} in this model; its sites: {', '.join(sorted(sown))}")
    return logits, {name: sown[name] for name in names}


def site_shapes(config: ModelConfig, tokens, **inputs) -> dict[str, tuple[int, ...]]:
    """Every site of the model on inputs shaped as these, in the forward pass's order, with its
    shape: what `run_with_cache` can return."""
    config = lab_config(config)
    tokens = jnp.asarray(tokens, jnp.int32)

    def all_sites():
        params = init_params(config, jax.random.key(0))
        return GPT(config).apply({"params": params}, tokens, **inputs, mutable=[CACHE])[1][CACHE]

    return {name: s.shape for name, s in _sown(jax.eval_shape(all_sites)).items()}


def run_with_cache(config: ModelConfig, params, tokens, names, edits: dict[str, Edit] | None = None, **inputs):
    """Logits (b, t, vocab) and {name: activation} for the sites `names` (see the table above),
    changed by `edits` where given. `inputs`: the batch contract's other model inputs
    (segments, positions; sources for an encoder–decoder)."""
    config = lab_config(config)
    logits, cache = _forward(config, params, jnp.asarray(tokens, jnp.int32), inputs, edits or {}, tuple(names))
    return logits, cache


def run_with_interventions(config: ModelConfig, params, tokens, edits: dict[str, Edit], **inputs) -> jax.Array:
    """Logits (b, t, vocab) with the sites in `edits` changed."""
    return _forward(lab_config(config), params, jnp.asarray(tokens, jnp.int32), inputs, edits, None)[0]


def sweep(metric, config: ModelConfig, params, tokens, make_edits, count: int, batch_size: int = 16, **inputs):
    """metric(logits) under each of `count` interventions, as one compiled program:
    make_edits(i) gives the i-th's {name: Edit} from a traced index i (one-hot masks built from
    it, say, and values the sweep shares), run `batch_size` at a time (lax.map, vmapped within).
    Returns metric's outputs stacked (count, ...)."""
    config = lab_config(config)
    tokens = jnp.asarray(tokens, jnp.int32)

    @jax.jit
    def run(params):
        def one(i):
            variables = {"params": params, INTERVENTIONS: interventions_collection(config, make_edits(i))}
            return metric(GPT(config).apply(variables, tokens, **inputs))

        return jax.lax.map(one, jnp.arange(count), batch_size=min(batch_size, count))

    return run(params)


def removed_heads(config: ModelConfig, keep) -> dict[str, Edit]:
    """Edits that remove heads (Michel et al. 2019's head ablation): keep (n_layer, n_head), 1
    keeps a head and 0 zeroes its output (hook_z) at every position; a traced array will do,
    so one compiled program scores every choice of heads (evaluate's greedy pruning)."""
    keep = jnp.asarray(keep, jnp.float32)
    removed = (1 - keep)[:, None, None, :, None]  # (layer, batch, position, head, head_dim)
    return {f"blocks.{i}.attn.hook_z": Edit(mask=removed[i]) for i in range(config.n_layer)}


def site_mask(shape, name: str, heads=None, positions=None) -> np.ndarray:
    """A 0/1 mask for the site `name` of `shape` (batch first): 1 at the chosen heads (a list,
    or None for all) and positions (query positions for scores and patterns; None for all),
    broadcast over the batch."""
    leaf = name.rsplit(".", 1)[-1]
    mask = np.ones((1, *shape[1:]), np.float32)
    for axis, chosen in ((HEAD_AXIS.get(leaf), heads), (POSITION_AXIS.get(leaf, 1), positions)):
        if chosen is None:
            continue
        if axis is None:
            raise ValueError(
                f"{name} has no head axis; heads are chosen at hook_q/k/v/z, hook_attn_scores, hook_pattern"
            )
        keep = np.zeros(shape[axis], bool)
        keep[np.asarray(chosen)] = True
        mask = mask * keep.reshape([-1 if a == axis else 1 for a in range(len(shape))])
    return mask


def replace(shape, name: str, value, heads=None, positions=None) -> Edit:
    """An Edit that puts `value` (broadcastable to the site) at the chosen heads and positions:
    patching, or mean-ablation with a mean over a dataset's activations."""
    return Edit(jnp.asarray(site_mask(shape, name, heads, positions)), jnp.asarray(value, jnp.float32))


def zero(shape, name: str, heads=None, positions=None) -> Edit:
    """An Edit that zeroes the chosen heads and positions (zero-ablation)."""
    return replace(shape, name, 0.0, heads, positions)


def mean_ablate(reference, name: str, heads=None, positions=None) -> Edit:
    """An Edit that puts the site's mean over a reference batch (its activations there,
    (b, ...) from run_with_cache) at the chosen heads and positions: mean-ablation, which
    removes what a component says about this input while keeping its typical output."""
    reference = jnp.asarray(reference, jnp.float32)
    return replace(reference.shape, name, reference.mean(0, keepdims=True), heads, positions)


def steer(shape, name: str, vector, heads=None, positions=None) -> Edit:
    """An Edit that adds `vector` (broadcastable to the site) at the chosen heads and positions."""
    mask = jnp.asarray(site_mask(shape, name, heads, positions))
    return Edit(add=mask * jnp.asarray(vector, jnp.float32))
