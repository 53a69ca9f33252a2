"""The model: token embedding -> n_layer blocks -> final norm -> LM head. A decoder (GPT- or
Llama-style; config.causal), an encoder trained on blanks (config.objective="masked"), or an
encoder–decoder (config.encoder_layers: an `Encoder` in front, cross-attention in each block).

`GPT(config).apply({"params": params}, tokens)` gives float32 logits (batch, seq, vocab).
For generation, `init_cache` makes an empty KV cache and `decode=True` reads and extends it:

    cache = init_cache(config, batch_size)
    logits, vars = model.apply({"params": params, "cache": cache}, prompt, decode=True, mutable=["cache"])
    # then one token at a time, passing vars["cache"] back in
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxgpt.config import ModelConfig
from jaxgpt.model import lora
from jaxgpt.model.attention import CausalSelfAttention, CrossAttention
from jaxgpt.model.convolution import CausalConvolution
from jaxgpt.model.layers import ACTIVATION_FUNCTIONS, MLP, dtypes, make_norm, projection_keywords
from jaxgpt.model.moe import MixtureOfExpertsLayer
from jaxgpt.model.positions import sinusoidal_embedding
from jaxgpt.model.products import compute_dtype, dot_general_for
from jaxgpt.model.sites import site

REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Block(nn.Module):
    """One transformer block: attention (or model.token_mixer's convolution) then MLP, each a
    residual branch.

    pre-norm:  x + attn(norm(x)), then x + mlp(norm(x))
    post-norm: norm(x + attn(x)), then norm(x + mlp(x))
    sandwich:  x + norm'(attn(norm(x))), then x + norm'(mlp(norm(x)))  (Gemma 2 and 3)

    With config.mlp off (attention-only) the second line, its norm included, is not there; in
    a mixture-of-experts block (moe) the experts take the MLP's place (jaxgpt/model/moe.py). Given an
    encoder's output (`memory`: an encoder–decoder's decoder block), cross-attention to it is a
    residual branch of its own between the two, normed as they are. `windowed`: whether its
    attention keeps to model.attention_window (where global_every interleaves global blocks).
    """

    config: ModelConfig
    train: bool = False
    moe: bool = False
    windowed: bool = True

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        positions: jnp.ndarray,
        cache_index: jnp.ndarray | None,
        segments: jnp.ndarray | None = None,
        memory: jnp.ndarray | None = None,
        memory_segments: jnp.ndarray | None = None,
        x0: jnp.ndarray | None = None,
        tokens: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        """cache_index: None, or where this call's tokens start in the KV cache (decoding);
        segments: None, or each token's sequence in its row (jaxgpt/training/batch.py); memory and
        memory_segments: the encoder's output (b, s, d_model) and its tokens' segments; x0: the
        first block's input, which config.x0_mix mixes into this block's; tokens: the tokens
        themselves (b, t), which config.value_embeddings looks up in this block's own table."""
        c = self.config
        dropout = nn.Dropout(c.dropout, deterministic=not self.train)
        skip = (lambda x: x) if c.residual else (lambda x: 0)  # noqa: E731  (residual=False: an ablation)

        def residual_branch(x, branch, norm_name, out_site):
            """x plus what `branch` writes (the site `out_site`), normed (the norm `norm_name`)
            before (pre-norm), after, or what it reads and what it writes both (sandwich: a
            second norm, `norm_name`_out)."""
            norm = make_norm(c, norm_name)
            if c.norm_position == "pre":
                return skip(x) + dropout(site(self, out_site, branch(norm(x))))
            if c.norm_position == "sandwich":
                written = make_norm(c, f"{norm_name}_out")(branch(norm(x)))
                return skip(x) + dropout(site(self, out_site, written))
            return norm(skip(x) + dropout(site(self, out_site, branch(x))))

        if c.x0_mix:
            mix = self.param("x0_mix", lambda _: jnp.asarray([1.0, 0.0], c.param_dtype))  # a, b
            x = mix[0].astype(x.dtype) * x + mix[1].astype(x.dtype) * x0
        x = site(self, "hook_resid_pre", x)
        value_embedding = None
        if c.value_embeddings:
            width = c.n_kv_head * c.head_dim
            table = nn.Embed(c.vocab_size, width, embedding_init=embedding_init(c), **dtypes(c), name="value_embed")
            value_embedding = table(tokens)
        if c.token_mixer == "convolution":
            convolution = CausalConvolution(c, name="conv")
            attention_branch = lambda x: convolution(x, cache_index, segments)  # noqa: E731
        else:
            attention = CausalSelfAttention(c, windowed=self.windowed, name="attn")
            attention_branch = lambda x: attention(x, positions, cache_index, segments, value_embedding)  # noqa: E731
        x = residual_branch(x, attention_branch, "norm_1", "hook_attn_out")
        x = site(self, "hook_resid_mid", x)
        if memory is not None:
            cross = CrossAttention(c, name="cross")
            cross_branch = lambda x: cross(x, memory, segments, memory_segments)  # noqa: E731
            x = residual_branch(x, cross_branch, "norm_cross", "hook_cross_attn_out")
            x = site(self, "hook_resid_mid_cross", x)
        if c.mlp:  # else the attention-only ablation
            mlp = MixtureOfExpertsLayer(c, name="moe") if self.moe else MLP(c, name="mlp")
            x = residual_branch(x, mlp, "norm_2", "hook_mlp_out")
        return site(self, "hook_resid_post", x)


def embedding_init(config: ModelConfig):
    return nn.initializers.normal(config.init_std)


def token_positions(
    module: nn.Module, config: ModelConfig, seq: int, decode: bool, given: jnp.ndarray | None = None
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """The positions of a call's `seq` tokens ((seq,), or the batch's own (batch, seq) when
    `given`), and, when decoding, the cache index: how many tokens the KV cache already holds
    (the `module`'s cache "index" is advanced by seq)."""
    if not decode:
        if config.position == "learned" and seq > config.block_size:
            raise ValueError(
                f"sequence of {seq} tokens is longer than block_size={config.block_size}, the size of the "
                "learned position table; shorten the input or use rope/alibi/sinusoidal positions"
            )
        return (jnp.arange(seq) if given is None else given), None
    assert given is None, "a KV-cache step's positions are the cache's"
    index = module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    cache_index = index.value
    index.value = cache_index + seq
    return jnp.arange(seq) + cache_index, cache_index


def input_embeddings(
    module: nn.Module, config: ModelConfig, wte: nn.Embed, tokens: jnp.ndarray, positions: jnp.ndarray, pixels=None
) -> jnp.ndarray:
    """What the first block reads: the tokens' embeddings (times sqrt(d_model) with
    scale_embeddings; the site hook_embed) plus, for absolute positions, their position's
    (hook_pos_embed; rope and alibi act inside attention instead), normalised with
    embedding_norm. Called inside `module`'s compact method: a learned table is its "wpe".
    A Vision Transformer's (patch_size) patches are projected and added to their tokens'
    embeddings (jaxgpt/data/images.py: the class token's and "a patch here", the projection's bias)."""
    c = config
    x = wte(tokens)
    if c.patch_size:
        if pixels is None:
            raise ValueError("a Vision Transformer (model.patch_size) reads its patches: pass pixels=")
        patch_embed = nn.Dense(c.d_model, use_bias=False, kernel_init=embedding_init(c), name="patch_embed",
                               **projection_keywords(c))  # fmt: skip
        x = x + patch_embed(pixels.astype(x.dtype) / 255)  # bytes as [0, 1]: the class token's zeros add nothing
    if c.scale_embeddings:
        x = x * jnp.sqrt(jnp.asarray(c.d_model, x.dtype))
    x = site(module, "hook_embed", x)
    if c.position == "learned":
        wpe = nn.Embed(c.block_size, c.d_model, embedding_init=embedding_init(c), **dtypes(c), name="wpe")
        x = x + site(module, "hook_pos_embed", jnp.broadcast_to(wpe(positions), x.shape))
    elif c.position == "sinusoidal":
        table = sinusoidal_embedding(positions, c.d_model).astype(x.dtype)
        x = x + site(module, "hook_pos_embed", jnp.broadcast_to(table, x.shape))
    return make_norm(c, "norm_embeddings")(x) if c.embedding_norm else x


def _scan_step(block: Block, x, positions, cache_index, segments, memory, memory_segments, x0, tokens):
    return block(x, positions, cache_index, segments, memory, memory_segments, x0, tokens), None


class GPT(nn.Module):
    """The transformer `config` describes: a decoder, an encoder (causal=False, masked
    objective) or, with encoder_layers, an encoder–decoder; `GPT` after the model the
    teaching texts build first."""

    config: ModelConfig

    @nn.compact
    @lora.adapted  # low-rank adapters beside the projections model.lora_targets names, where it has them
    def __call__(
        self,
        tokens: jnp.ndarray,
        *,
        segments: jnp.ndarray | None = None,
        positions: jnp.ndarray | None = None,
        sources: jnp.ndarray | None = None,
        source_segments: jnp.ndarray | None = None,
        source_positions: jnp.ndarray | None = None,
        pixels: jnp.ndarray | None = None,
        memory: jnp.ndarray | None = None,
        encode_only: bool = False,
        train: bool = False,
        decode: bool = False,
        head: bool = True,
    ) -> jnp.ndarray:
        """tokens (batch, seq) int -> logits (batch, seq, vocab) float32.

        segments, positions: (batch, seq) where a row holds several sequences or padding: each
            token's sequence (attention stays within it) and its place there (jaxgpt/training/batch.py).
        sources, source_segments, source_positions: (batch, source seq), an encoder–decoder's
            (config.encoder_layers): what its encoder reads; or `memory`, what it made of them
            (encode_only=True returns that, for decoding with the sources encoded once).
        pixels: (batch, seq, patch_size x patch_size x channels) uint8, a Vision Transformer's
            patches (config.patch_size; jaxgpt/data/images.py).
        train: enables dropout (needs a "dropout" rng).
        decode: read and extend the KV cache (mutable "cache" collection; see init_cache).
        head: False stops before the LM head, returning what it reads (batch, seq, d_model):
            the loss then applies the head a chunk at a time (`head_logits`, model.loss_chunk).
        """
        c = self.config
        wte = nn.Embed(c.vocab_size, c.d_model, embedding_init=embedding_init(c), **dtypes(c), name="wte")
        if c.encoder_layers and memory is None:
            if sources is None:
                raise ValueError("an encoder–decoder (model.encoder_layers) reads sources: pass sources= or memory=")
            memory = Encoder(c, name="encoder")(wte, sources, source_segments, source_positions, train=train)
        if encode_only:
            return memory
        positions, cache_index = token_positions(self, c, tokens.shape[1], decode, positions)
        x = input_embeddings(self, c, wte, tokens, positions, pixels)  # (batch, seq, d_model)
        x = nn.Dropout(c.dropout, deterministic=not train)(x)
        beside = (segments, memory, source_segments)
        x, residuals = stacked_blocks(
            c, x, positions, cache_index, *beside, train=train, tokens=tokens,
            capturing=self.is_mutable_collection("intermediates"),
        )  # fmt: skip
        if c.mtp_weight and not decode:  # training's second prediction, read by its loss term
            ahead = TokenAfterNext(c, name="mtp")(x, wte, tokens, positions, segments, train=train)
            self.sow("ahead", "features", ahead)
        if c.classes:  # a classifier in the LM head's place (model.objective=classification)
            if residuals:  # capturing: the residual stream after every layer (a classifier has no logit lens)
                self.sow("intermediates", "residual", jnp.stack(residuals))
            return self._classifier(x)
        features = self._head_input()
        final = site(self, "final_norm_out", features(x))  # TransformerLens's ln_final.hook_out
        return self._logits(wte, features, final, residuals) if head else final

    def _logits(self, wte: nn.Embed, features, final: jnp.ndarray, residuals: list) -> jnp.ndarray:
        """The LM head's logits of the final norm's output; capturing (jaxgpt.lab.capture), the
        residual stream after every layer and the logit lens, its readout there, beside them."""
        c = self.config
        weights = self._head_weights(wte)  # once: a parameter may be created only once
        if residuals:
            self.sow("intermediates", "residual", jnp.stack(residuals))
            lens = [head_logits(c, weights, features(r)) for r in residuals]
            self.sow("intermediates", "logit_lens", jnp.stack(lens))
        return head_logits(c, weights, final)

    def _classifier(self, x: jnp.ndarray) -> jnp.ndarray:
        """Each position's class logits (batch, seq, classes) float32: a linear layer over the
        final norm's output (pre-norm), read where the batch scores a text."""
        c = self.config
        final = site(self, "final_norm_out", make_norm(c, "norm_f")(x) if c.has_final_norm else x)
        classifier = nn.Dense(c.classes, kernel_init=embedding_init(c), name="classifier", **projection_keywords(c))
        return classifier(final).astype(jnp.float32)

    def _head_input(self):
        """The function from the residual stream to what the LM head reads: the final norm
        (pre-norm models; post-norm blocks already end normalised), with head_transform BERT's
        dense, activation and norm."""
        c = self.config
        norm_f = make_norm(c, "norm_f") if c.has_final_norm else (lambda x: x)
        if not c.head_transform:
            return norm_f
        dense = nn.Dense(
            c.d_model, kernel_init=embedding_init(c), use_bias=c.bias, name="head_dense", **projection_keywords(c)
        )
        norm = make_norm(c, "head_norm")
        return lambda x: norm(ACTIVATION_FUNCTIONS[c.activation](dense(norm_f(x))))

    def _head_weights(self, wte: nn.Embed) -> dict:
        """The LM head's parameters, as `head_weights` reads them from a params tree."""
        c = self.config
        weights = {"embedding": wte.embedding} if c.tie_embeddings else {"kernel": LMHead(c, name="lm_head")()}
        if c.has_logits_bias:  # BERT's and BART's bias per token
            weights["bias"] = self.param("head_bias", nn.initializers.zeros, (c.vocab_size,), jnp.dtype(c.param_dtype))
        return weights


def stacked_blocks(
    c: ModelConfig,
    x,
    positions,
    cache_index,
    segments,
    memory,
    memory_segments,
    *,
    train: bool,
    tokens: jnp.ndarray | None = None,
    capturing: bool = False,
    count: int | None = None,
    prefix: str = "block",
) -> tuple[jnp.ndarray, list[jnp.ndarray]]:
    """`count` (default n_layer) blocks in the calling module (reading `tokens` when they have
    value embeddings), each rematerialised by config.remat; with config.scan_layers one block
    traced once and iterated (compile time independent of depth; each parameter gains a leading
    layer axis). Returns the output and, with `capturing` and the layers unscanned, the residual
    stream before the first block and after each (else an empty list)."""
    count = c.n_layer if count is None else count
    block = Block
    if c.remat != "none":
        # Under scan, XLA cannot common-subexpression the recomputation away, so the
        # guard against it (prevent_cse) only costs speed there.
        block = nn.remat(Block, policy=REMAT_POLICIES[c.remat], prevent_cse=not c.scan_layers)
    x0, tokens = (x if c.x0_mix else None), (tokens if c.value_embeddings else None)
    beside = (positions, cache_index, segments, memory, memory_segments, x0, tokens)
    if c.scan_layers:
        scan = nn.scan(
            _scan_step,
            variable_axes={"params": 0, "cache": 0, "router": 0, "sites": 0, "interventions": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast,) * len(beside),
            length=count,
        )
        x, _ = scan(block(c, train=train, moe=c.moe is not None, name=f"{prefix}s"), x, *beside)
        return x, []
    residuals = [x]
    for i in range(count):
        layer = block(c, train=train, moe=c.is_moe_layer(i), windowed=c.is_windowed_layer(i), name=f"{prefix}_{i}")
        x = layer(x, *beside)
        residuals.append(x)
    return x, residuals if capturing else []


class Encoder(nn.Module):
    """An encoder–decoder's encoder: the sources embedded by the shared table `wte` (plus their
    own position table, for learned positions), config.encoder_layers blocks without the causal
    mask, built by the same switches as the decoder's (dense: a mixture of experts stays in the
    decoder), and the final norm of a pre-norm model. Returns what cross-attention reads, the
    memory (batch, source seq, d_model): the encoder's output, or with model.encoder_summary
    its mean over each source, at each of the source's positions (`source_means`)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, wte: nn.Embed, sources, segments=None, positions=None, *, train: bool = False) -> jnp.ndarray:
        c = self.config.replace(causal=False, moe=None, encoder_layers=0, encoder_summary="none")
        positions, _ = token_positions(self, c, sources.shape[1], False, positions)
        x = input_embeddings(self, c, wte, sources, positions)
        x = nn.Dropout(c.dropout, deterministic=not train)(x)
        x, _ = stacked_blocks(
            c, x, positions, None, segments, None, None, train=train, tokens=sources, count=self.config.encoder_layers
        )
        x = site(self, "final_norm_out", make_norm(c, "norm_f")(x) if c.has_final_norm else x)
        return source_means(x, segments) if self.config.encoder_summary == "mean" else x


def source_means(x: jnp.ndarray, segments: jnp.ndarray | None) -> jnp.ndarray:
    """Each position's row of `x` (batch, seq, d) replaced by the mean over its segment's
    positions (over the whole row without segments): one vector a source, so every key of a
    source is alike and cross-attention can only read that vector, evenly weighted."""
    if segments is None:
        return jnp.broadcast_to(x.mean(axis=1, keepdims=True), x.shape)
    same = (segments[:, :, None] == segments[:, None, :]).astype(x.dtype)  # (batch, seq, seq)
    return jnp.einsum("bst,btd->bsd", same, x) / same.sum(-1, keepdims=True)


class TokenAfterNext(nn.Module):
    """Multi-token prediction at depth 1 (DeepSeek-V3's MTP module, config.mtp_weight): at each
    position t, the last block's output and the embedding of token t + 1, each normed, joined
    and projected back to d_model, then one more block and a final norm: what the shared LM
    head reads to predict token t + 2. Causal attention keeps it to tokens up to t + 1. The
    last position's token t + 1 lies outside the window (a stand-in is read there, and the
    loss term leaves that position unscored). Returns (batch, seq, d_model)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, wte: nn.Embed, tokens, positions, segments, *, train: bool) -> jnp.ndarray:
        c = self.config.replace(moe=None)
        following = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
        joined = jnp.concatenate([make_norm(c, "norm_hidden")(x), make_norm(c, "norm_next")(wte(following))], -1)
        project = nn.Dense(
            c.d_model, use_bias=False, kernel_init=embedding_init(c), name="project", **projection_keywords(c)
        )
        x = project(joined)  # its own first input, where the block mixes that in (x0_mix)
        x = Block(c, train=train, name="block")(x, positions, None, segments, None, None, x, tokens)
        return make_norm(c, "norm_f")(x) if c.has_final_norm else x


class LMHead(nn.Module):
    """The output matrix (d_model, vocab) of a model whose head is not its embedding: the
    parameter nn.Dense would make (same name, shape, initialiser), applied by `head_logits`."""

    config: ModelConfig

    @nn.compact
    def __call__(self) -> jnp.ndarray:
        c = self.config
        return self.param("kernel", embedding_init(c), (c.d_model, c.vocab_size), jnp.dtype(c.param_dtype))


def head_weights(config: ModelConfig, params: dict) -> dict:
    """The LM head's parameters in a GPT's params tree: the tied embedding or lm_head's
    kernel, and BERT's or BART's bias per token."""
    if config.tie_embeddings:
        weights = {"embedding": params["wte"]["embedding"]}
    else:
        weights = {"kernel": params["lm_head"]["kernel"]}
    return weights | ({"bias": params["head_bias"]} if config.has_logits_bias else {})


def grow_vocabulary(config: ModelConfig, params: dict, vocab_size: int) -> dict:
    """`params` of a model of config.vocab_size tokens with rows for the tokens up to
    `vocab_size` added (special tokens a fine-tuning adds, jaxgpt/data/conversations.py): each
    new embedding row (the blocks' value embeddings' too), head column and bias the mean of the
    trained ones, so a new token starts where an average token is, and the trained tokens' logits
    are unchanged (Hewitt 2021, "Initializing new word embeddings for pretrained language models")."""
    added = vocab_size - config.vocab_size
    if added <= 0:
        return params

    def grown(array, axis: int):
        mean = jnp.mean(array, axis=axis, keepdims=True)
        return jnp.concatenate([array, jnp.repeat(mean, added, axis=axis)], axis=axis)

    out = dict(params)
    out["wte"] = {**params["wte"], "embedding": grown(params["wte"]["embedding"], 0)}
    if not config.tie_embeddings:
        out["lm_head"] = {**params["lm_head"], "kernel": grown(params["lm_head"]["kernel"], 1)}
    if config.has_logits_bias:
        out["head_bias"] = grown(params["head_bias"], 0)

    def with_value_tables_grown(tree):  # each block's value embeddings (vocab, width), stacked or not
        if not isinstance(tree, dict):
            return tree
        if "value_embed" in tree:
            tree = {**tree, "value_embed": {"embedding": grown(tree["value_embed"]["embedding"], -2)}}
        return {name: with_value_tables_grown(branch) for name, branch in tree.items()}

    return with_value_tables_grown(out) if config.value_embeddings else out


def head_logits(config: ModelConfig, weights: dict, features: jnp.ndarray) -> jnp.ndarray:
    """(..., d_model) head input -> (..., vocab) float32 logits: the LM head (the embedding's
    transpose, or its own matrix; in the compute dtype, as nn.Embed.attend and nn.Dense
    compute), a bias per token (BERT's, BART's), the soft cap. One definition for the model's forward pass
    and the chunked loss."""
    dtype = compute_dtype(config)
    product = dot_general_for(config).get("dot_general", jax.lax.dot_general)
    x = features.astype(dtype)
    tied = "embedding" in weights  # (vocab, d_model): its last axis is the one contracted
    matrix = (weights["embedding"] if tied else weights["kernel"]).astype(dtype)
    logits = product(x, matrix, (((x.ndim - 1,), (1 if tied else 0,)), ((), ())))
    logits = logits.astype(jnp.float32)
    if "bias" in weights:
        logits = logits + weights["bias"].astype(jnp.float32)
    if config.logit_softcap:
        logits = config.logit_softcap * jnp.tanh(logits / config.logit_softcap)
    return logits


def init_params(config: ModelConfig, rng: jax.Array) -> dict:
    """Freshly initialised parameters (the "params" collection) for `config`."""
    tokens = jnp.zeros((1, min(config.block_size, 8)), jnp.int32)
    return GPT(config).init(rng, tokens, **inputs_beside(config, tokens))["params"]


def inputs_beside(config: ModelConfig, tokens: jnp.ndarray) -> dict:
    """What a model reads beside `tokens` where it reads more, as zeros: an encoder–decoder's
    sources, a Vision Transformer's pixels."""
    if config.encoder_layers:
        return {"sources": tokens}
    if config.patch_size:
        return {"pixels": jnp.zeros((*tokens.shape, config.patch_size**2 * config.channels), jnp.uint8)}
    return {}


def init_cache(config: ModelConfig, batch_size: int) -> dict:
    """An empty KV cache (the "cache" collection) for `batch_size` sequences of up to block_size."""
    tokens = jnp.zeros((batch_size, 1), jnp.int32)
    beside = inputs_beside(config, tokens)
    shapes = jax.eval_shape(lambda: GPT(config).init(jax.random.key(0), tokens, decode=True, **beside))["cache"]
    return zeros_shaped(shapes)


def zeros_shaped(shapes):
    """Zeros shaped as a tree of jax.eval_shape's answers: the empty caches and sums to fill."""
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def stack_blocks(params: dict, n_layer: int) -> dict:
    """Unscanned layout (block_0 ... block_{L-1}) -> scanned layout (blocks, leading L axis)."""
    out = {k: v for k, v in params.items() if not k.startswith("block_")}
    out["blocks"] = jax.tree.map(lambda *layers: jnp.stack(layers), *(params[f"block_{i}"] for i in range(n_layer)))
    return out


def unstack_blocks(params: dict) -> dict:
    """Scanned layout -> unscanned layout; the inverse of stack_blocks."""
    out = {k: v for k, v in params.items() if k != "blocks"}
    n_layer = jax.tree.leaves(params["blocks"])[0].shape[0]
    for i in range(n_layer):
        out[f"block_{i}"] = jax.tree.map(lambda a, i=i: a[i], params["blocks"])
    return out


def count_params(params) -> int:
    """Number of scalars in a parameter tree (arrays or shape structs)."""
    return sum(int(p.size) for p in jax.tree.leaves(params))


def active_params(config: ModelConfig, params=None) -> int:
    """Parameters one token's forward pass uses: all of them in a dense model; in a mixture of
    experts all but the experts the token is not routed to (experts - top_k of each MoE
    layer's; the router and a shared expert are used by every token). `params`: the model's
    parameters or their shapes, where the caller has them."""
    params = params if params is not None else jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    total = count_params(params)
    if config.moe is None:
        return total
    m = config.moe
    leaves = jax.tree_util.tree_leaves_with_path(params)
    experts = sum(int(p.size) for path, p in leaves if str(getattr(path[-1], "key", "")).startswith("experts_"))
    return total - experts // m.experts * (m.experts - m.top_k)


def describe_parameters(config: ModelConfig, params) -> str:
    """ "N parameters", and for a mixture of experts how many of them a token uses."""
    total = count_params(params)
    if config.moe is None:
        return f"{total:,} parameters"
    m = config.moe
    return (
        f"{total:,} parameters, {active_params(config, params):,} active per token ({m.top_k} of {m.experts} experts)"
    )


def flops_per_token(config: ModelConfig, seq_len: int | None = None, shapes=None) -> float:
    """Training FLOPs per token, 6 N + 12 L d T (Kaplan et al. 2020; PaLM appendix B).

    N counts the parameters that take part in matrix multiplies: all of them except the
    token-embedding lookup (unless tied, when the same matrix is the LM head), the learned
    position table, the blocks' value embeddings (lookups too), and in a mixture of experts
    the experts a token is not routed to (`active_params`). 6 N is a forward (2 N) and
    backward (4 N) multiply-add per parameter; 12 L d T adds attention's score and value
    matmuls over a context of T tokens (default block_size), with d = n_head * head_dim (d_model
    unless model.head_dim sets the heads' width). Norms, softmax and elementwise work are not
    counted; MFU figures use this convention. A convolution in attention's place
    (model.token_mixer) has no scores: its taps, one multiply-add per token each, are in N.
    For an encoder–decoder the encoder's parameters count against the target tokens too, and
    its attention and the cross-attention's are counted as the decoder's (L = n_layer +
    encoder_layers): a figure of the same order, not an exact count, since sources and targets
    differ in length. `shapes`: the parameters' shapes where the caller has
    them (a run's state layout), else found by tracing the model's initialisation.
    """
    seq_len = seq_len or config.block_size
    if shapes is None:
        shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    n = active_params(config, shapes)
    if "wpe" in shapes:
        n -= count_params(shapes["wpe"])
    if not config.tie_embeddings:
        n -= count_params(shapes["wte"])
    looked_up = jax.tree_util.tree_leaves_with_path(shapes)
    n -= sum(int(p.size) for path, p in looked_up if "value_embed" in jax.tree_util.keystr(path))
    if config.token_mixer == "convolution":  # no scores: its taps are parameters, a multiply-add each, in 6 N
        return 6.0 * n
    attention_width = config.n_head * config.head_dim  # d_model, unless the heads have a width of their own
    return 6.0 * n + 12.0 * (config.n_layer + config.encoder_layers) * attention_width * seq_len
