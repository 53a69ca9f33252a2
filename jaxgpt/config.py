"""What a run is: the model, the data, the training and the device mesh, each a frozen dataclass.

Every section is validated when it is built, in one way: it lists all its problems, each as
`section.field=value` and what would fix it, and raises them together as one ConfigError line.
So a model can never be built from an inconsistent description, and a user sees every mistake
at once. Defaults describe a GPT-2-style model.

Config files and the command line reach these through jaxgpt/config_files.py; what a resumed
run may change is in jaxgpt/job/resume.py.
"""

from __future__ import annotations

import dataclasses
import math

from jaxgpt.errors import UserError

ACTIVATIONS = ("gelu", "gelu_exact", "relu", "relu2", "swiglu")
NORMS = ("layernorm", "rmsnorm", "none")
NORM_POSITIONS = ("pre", "post")
POSITIONS = ("rope", "learned", "sinusoidal", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "yarn", "llama3", "longrope")
ATTENTION_KERNELS = ("xla", "dot_product", "flash_tpu")
ROPE_PAIRINGS = ("half", "interleaved")
OBJECTIVES = ("next_token", "masked")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(UserError, ValueError):
    """A configuration that cannot describe a working model; the message says how to fix it."""


class Problems:
    """What is wrong with one section, each problem phrased `section.field=value <what fixes it>`.
    `raise_if_any` raises them all as one line."""

    def __init__(self, section: str, values):
        self.section, self.values, self.found = section, values, []

    def add(self, field: str, requirement: str) -> None:
        self.found.append(f"{self.section}.{field}={getattr(self.values, field)!r} {requirement}")

    def positive_integers(self, *fields: str) -> None:
        for field in fields:
            value = getattr(self.values, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                self.add(field, "must be a positive integer")

    def positive(self, *fields: str) -> None:
        for field in fields:
            if not getattr(self.values, field) > 0:
                self.add(field, "must be positive")

    def not_negative(self, *fields: str) -> None:
        for field in fields:
            if not getattr(self.values, field) >= 0:
                self.add(field, "must be >= 0")

    def one_of(self, field: str, allowed) -> None:
        if getattr(self.values, field) not in allowed:
            self.add(field, f"is not one of {', '.join(map(repr, allowed))}")

    def raise_if_any(self) -> None:
        if self.found:
            raise ConfigError("invalid config: " + "; ".join(self.found))


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """How to stretch RoPE past the context length a model was trained on.

    kind: "linear" — position interpolation (Chen et al. 2023): positions are divided by
            `factor`, so a model sees its trained range of angles over a longer window.
          "ntk" — NTK-aware scaling (bloc97, 2023): the base is raised to
            theta * factor ** (head_dim / (head_dim - 2)), interpolating low frequencies while
            leaving the highest almost untouched.
          "yarn" — YaRN (Peng et al. 2023): per-frequency blend of interpolation and
            extrapolation by wavelength relative to `original_block_size`, plus a logit
            temperature 0.1 * ln(factor) + 1.
          "llama3" — Llama 3.1's rule (Meta, "The Llama 3 herd of models", 2024): pairs whose
            wavelength is shorter than original_block_size / high_freq_factor keep their
            frequency, those longer than original_block_size / low_freq_factor are divided by
            `factor`, and the ones between blend the two smoothly.
          "longrope" — LongRoPE (Ding et al. 2024; Phi-3): each pair's frequency divided by its
            own searched factor, long_factor for a model whose block_size is past
            original_block_size and short_factor otherwise, and cos and sin multiplied by
            sqrt(1 + ln(factor) / ln(original_block_size)).
    factor: how many times longer the new context is than the original (> 1 stretches).
    original_block_size: the context length the model was trained with; YaRN and llama3 need
        it to decide which frequencies complete a full rotation inside that window.
    beta_fast, beta_slow: YaRN's ramp bounds in rotations per original window (paper: 32, 1).
    low_freq_factor, high_freq_factor: llama3's bounds, also in rotations per original window
        (Llama 3.1: 1 and 4).
    long_factor, short_factor: longrope's per-pair divisors, head_dim / 2 of each. One set
        serves the whole model (the one for its block_size), so a KV cache's keys and its
        queries are always rotated alike; transformers instead switches from short to long
        factors once a sequence passes original_block_size.
    """

    kind: str
    factor: float
    original_block_size: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    long_factor: tuple[float, ...] | None = None
    short_factor: tuple[float, ...] | None = None

    def __post_init__(self):
        for field in ("long_factor", "short_factor"):  # lists from a file; a config must hash
            if isinstance(getattr(self, field), list):
                object.__setattr__(self, field, tuple(getattr(self, field)))


@dataclasses.dataclass(frozen=True)
class MixtureOfExperts:
    """A mixture-of-experts feed-forward layer in place of the MLP (Shazeer et al. 2017; Switch
    Transformer, Fedus et al. 2021; Mixtral, Jiang et al. 2024): a router picks `top_k` of
    `experts` MLPs for each token, and the token's output is their outputs weighted by the
    router's probabilities, renormalised over the chosen ones (Mixtral's rule) or as they are
    (Switch Transformer's).

    experts: how many expert MLPs each MoE layer has (0 in a config file: no MoE).
    top_k: experts each token is sent to.
    shared_experts: expert-sized MLPs every token also goes through, outside the routing
        (DeepSeekMoE, Dai et al. 2024); 0 for none.
    expert_hidden: hidden width of each expert (None: model.mlp_hidden).
    capacity_factor: when > 0, each expert takes at most ceil(capacity_factor x t x top_k /
        experts) of a sequence's t tokens (each sequence routes on its own, so microbatches and
        devices change nothing), first choices before second ones and earlier tokens first;
        the assignments past that are dropped (that expert adds nothing to the
        token; the residual carries it on). 0: dropless, every assignment computed (on a CPU
        this costs experts / top_k times the compute of the chosen experts alone).
    renormalize: weigh the chosen experts by their probabilities divided by the chosen ones'
        sum (Mixtral; transformers' norm_topk_prob), or by the probabilities themselves
        (Switch Transformer). At top_k=1 renormalising makes the one weight exactly 1, so the
        router learns only from the auxiliary losses, never from the task: top-1 routing wants
        renormalize=False.
    every: an MoE layer in every `every`-th block (blocks every-1, 2*every-1, ...), the others
        dense MLPs; 1 makes every block MoE.
    aux_loss: coefficient of the load-balancing loss, experts x sum_e f_e P_e (Switch
        Transformer), f_e the fraction of assignments routed to expert e and P_e its mean
        router probability; 1 when the load is uniform.
    z_loss: coefficient of the router z-loss, the mean of logsumexp(router logits)^2 (ST-MoE,
        Zoph et al. 2022), which keeps the router's logits small.
    The two losses are averaged over the MoE layers and added to the training objective;
    the logged loss stays the cross-entropy, comparable with a dense model's.
    """

    experts: int
    top_k: int = 2
    shared_experts: int = 0
    expert_hidden: int | None = None
    capacity_factor: float = 0.0
    renormalize: bool = True
    every: int = 1
    aux_loss: float = 0.01
    z_loss: float = 0.001


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer.

    vocab_size: number of token ids the embedding and LM head cover.
    block_size: the longest sequence the model is built for (size of a learned position
        table and of the KV cache).
    n_layer: number of transformer blocks.
    n_head: number of query heads.
    n_kv_head: number of key/value heads (Ainslie et al. 2023): n_head gives multi-head
        attention, 1 gives multi-query attention, anything dividing n_head in between gives
        grouped-query attention. None means n_head.
    d_model: width of the residual stream; head_dim = d_model // n_head.
    mlp_hidden: hidden width of the MLP. None means 4 * d_model, or for SwiGLU the Llama rule
        2/3 * 4 * d_model rounded up to a multiple of 64 (keeps the parameter count of a
        4x GELU MLP while adding the gate).
    activation: "gelu" (tanh approximation, as GPT-2), "gelu_exact" (the erf form), "relu",
        "relu2" (relu(x)^2, So et al. 2021, "Primer"), or "swiglu" (Shazeer 2020).
    norm: "layernorm", "rmsnorm" (Zhang & Sennrich 2019), or "none" (an ablation: no norms).
    norm_position: "pre" (x + f(norm(x)), GPT-2 onwards; trains stably without warmup
        tricks) or "post" (norm(x + f(x)), the original Transformer).
    norm_eps: epsilon inside the norms (GPT-2 uses 1e-5, Llama 1e-5 or 1e-6).
    position: "rope" (Su et al. 2021), "learned" (GPT-2), "sinusoidal" (Vaswani et al. 2017),
        "alibi" (Press et al. 2022) or "none" (causal attention alone carries order).
    rope_theta: RoPE base; frequencies are theta ** (-2i / head_dim).
    rope_scaling: a `RopeScaling`, or None for plain RoPE.
    bias: whether linear layers and LayerNorm have biases.
    qkv_bias: biases on the query, key and value projection even where `bias` is off (Qwen2:
        the Llama recipe plus these three biases).
    tie_embeddings: whether the LM head reuses the token embedding matrix (Press & Wolf 2017).
    dropout: dropout rate on embeddings and on each residual branch (0 disables it).
    dtype: compute dtype ("float32", "bfloat16", "float16"); softmax and the returned logits
        are always float32.
    param_dtype: storage dtype of the parameters.
    attention: attention kernel, "xla" (plain einsums, readable), "dot_product"
        (`jax.nn.dot_product_attention`, which can use cuDNN flash attention on GPU) or
        "flash_tpu" (Pallas's TPU flash attention; TPU only).
    scan_layers: run the blocks with `nn.scan`, so compile time does not grow with depth.
    remat: rematerialisation policy for each block: "none", "full" (save nothing),
        "dots" (save matmul outputs), "dots_no_batch" (save matmuls without batch dims).
    loss_chunk: in training, compute the LM head and the cross-entropy this many positions
        at a time, each piece's logits recomputed in the backward pass rather than kept (0:
        all positions at once). The logits are (batch, seq, vocab) float32, at GPT-2's 50,304
        tokens the step's largest tensor (12.3 GiB at batch 64, T=1024); chunks of 128 keep an
        eighth of them alive. The same loss and gradients up to float32 summation order.
    init_std: standard deviation of the GPT-2 initialisation (0.02).

    Switches from the records since GPT-2 (each off by default):
    qk_norm: RMSNorm over each query and key head before RoPE (Dehghani et al. 2023; OLMo 2),
        which bounds the attention logits and lets higher learning rates train stably.
    zero_init_residual: the attention and MLP output projections start at zero, so every block
        starts as the identity and the residual stream is the embedding (modded-nanogpt).
    logit_softcap: when > 0, logits become cap * tanh(logits / cap) (Gemma 2): no logit can
        grow past the cap, which keeps early training from overconfident spikes.
    attention_window: when > 0, each query sees only itself and the window - 1 tokens before it
        (sliding-window attention; Beltagy et al. 2020, Mistral 7B); 0 sees the whole prefix.

    Ablations, the questions the textbooks ask, each a switch (on = the standard model):
    scale_attention: divide scores by sqrt(head_dim). Off, the scores' variance grows with
        head_dim and the softmax saturates.
    causal: the causal mask. Off, training sees the tokens it predicts: its loss collapses while
        the model learns nothing it can use when generating (where the future does not exist).
    residual: the residual connections. Off, each block replaces its input (norms stay).
    mlp: the MLP. Off, every block is attention alone (Elhage et al. 2021's attention-only
        transformers, where induction heads are easiest to see); its norm goes with it.
    uniform_attention: every query weighs each key it may see equally, 1/t over t keys: what
        attention does if it learns nothing about where to look (the scores are ignored).
    rope_pairing: "half" (GPT-NeoX / Llama) or "interleaved" (the RoPE paper, GPT-J).
    scale_embeddings: token embeddings multiplied by sqrt(d_model) before positions are added
        (Vaswani et al. 2017, section 3.4): at the 0.02 init a token's embedding has entries
        of 0.02, a sinusoidal position's up to 1; scaled, the token carries std 0.02 sqrt(d).
        The LM head, tied or not, reads the residual stream unscaled.
    qkv_projections: the learned query, key and value projections. Off, each head's slice of
        the input is its query, its key and its value at once (q = k = v): attention can then
        only weigh tokens by how alike they already are; it needs n_kv_head = n_head.

    moe: a `MixtureOfExperts` in place of the MLP, or None for dense MLPs.

    embedding_norm: a norm over the embeddings (token plus position) before the first block
        (BERT's embedding LayerNorm).
    head_transform: BERT's prediction head: between the last block and the readout a d_model
        dense layer, the activation and a norm, and the logits get a bias per token.
    logits_bias: a bias per token added to the logits without head_transform's layers (BART's
        final_logits_bias).
    mask_token: the masked objective's mask token id; None: the last of the vocabulary
        (jaxgpt/training/masked.py). Imported BERT weights set their tokenizer's [MASK].

    objective: what the model is trained to predict. "next_token": each token from those
        before it (a decoder). "masked": hidden tokens from both sides (an encoder, BERT's
        masked-token prediction; needs causal=False; jaxgpt/training/masked.py): the last id of the
        vocabulary is the mask token.
    mask_rate: the share of positions the masked objective hides and scores (BERT: 0.15).
    encoder_layers: blocks of a bidirectional encoder in front of the decoder (the original
        Transformer's encoder–decoder, Vaswani et al. 2017); each decoder block then attends
        to the encoder's output (cross-attention) between its self-attention and its MLP. The
        encoder reads a batch's sources (text pairs: jaxgpt/data/pairs.py), shares the token
        embedding, and is built by the same switches as the decoder; 0: decoder-only.
    """

    vocab_size: int = 256
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    d_model: int = 128
    mlp_hidden: int | None = None
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    position: str = "learned"
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    bias: bool = True
    qkv_bias: bool = False
    tie_embeddings: bool = True
    dropout: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention: str = "xla"
    scan_layers: bool = False
    remat: str = "none"
    loss_chunk: int = 0
    init_std: float = 0.02
    qk_norm: bool = False
    zero_init_residual: bool = False
    logit_softcap: float = 0.0
    attention_window: int = 0
    scale_attention: bool = True
    causal: bool = True
    residual: bool = True
    mlp: bool = True
    uniform_attention: bool = False
    rope_pairing: str = "half"
    scale_embeddings: bool = False
    qkv_projections: bool = True
    moe: MixtureOfExperts | None = None
    embedding_norm: bool = False
    head_transform: bool = False
    logits_bias: bool = False
    mask_token: int | None = None
    objective: str = "next_token"
    mask_rate: float = 0.15
    encoder_layers: int = 0

    def __post_init__(self):
        # Resolve the derived defaults first so validation sees the numbers the model uses.
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if isinstance(self.moe, dict):
            object.__setattr__(self, "moe", MixtureOfExperts(**self.moe))
        _check_model(self)
        if self.mlp_hidden is None:
            object.__setattr__(self, "mlp_hidden", default_mlp_hidden(self.d_model, self.activation))

    @property
    def has_logits_bias(self) -> bool:
        """Whether the LM head adds a bias per token (BERT's head, or logits_bias)."""
        return self.head_transform or self.logits_bias

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def expert_hidden(self) -> int:
        """Hidden width of one expert MLP (of a shared one too)."""
        return (self.moe.expert_hidden if self.moe else None) or self.mlp_hidden

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block `layer` (from 0) holds a mixture of experts rather than a dense MLP."""
        return self.moe is not None and layer % self.moe.every == self.moe.every - 1

    @property
    def moe_layers(self) -> list[int]:
        """The blocks that hold a mixture of experts, in order."""
        return [i for i in range(self.n_layer) if self.is_moe_layer(i)]

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_kv_head

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_mlp_hidden(d_model: int, activation: str) -> int:
    if activation == "swiglu":
        return 64 * math.ceil(2 * 4 * d_model / 3 / 64)
    return 4 * d_model


def _check_model(c: ModelConfig) -> None:
    problems = Problems("model", c)
    problems.positive_integers("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model")
    if c.mlp_hidden is not None:
        problems.positive_integers("mlp_hidden")
    problems.one_of("activation", ACTIVATIONS)
    problems.one_of("norm", NORMS)
    problems.one_of("norm_position", NORM_POSITIONS)
    problems.one_of("position", POSITIONS)
    problems.one_of("attention", ATTENTION_KERNELS)
    problems.one_of("remat", REMAT_POLICIES)
    problems.one_of("rope_pairing", ROPE_PAIRINGS)
    problems.one_of("objective", OBJECTIVES)
    problems.one_of("dtype", DTYPES)
    problems.one_of("param_dtype", DTYPES)
    problems.raise_if_any()  # the divisibility checks below assume positive integers

    if c.d_model % c.n_head:
        problems.add("d_model", f"is not divisible by n_head={c.n_head}; choose d_model as a multiple of n_head")
    if c.n_head % c.n_kv_head:
        problems.add(
            "n_head", f"is not divisible by n_kv_head={c.n_kv_head}; each key/value head must serve a whole group"
        )
    if c.position == "rope" and c.head_dim % 2:
        problems.add(
            "d_model",
            f"and n_head={c.n_head} give an odd head_dim={c.head_dim}; RoPE rotates pairs of dimensions, so choose "
            "them to give an even head_dim",
        )
    if c.position == "sinusoidal" and c.d_model % 2:
        problems.add("d_model", "is odd; sinusoidal positions need an even d_model")
    if c.uniform_attention and c.position == "alibi":
        problems.add(
            "position",
            "is 'alibi', which biases the scores that uniform_attention ignores; choose another position or "
            "uniform_attention=False",
        )
    if not c.qkv_projections and c.n_kv_head != c.n_head:
        problems.add(
            "qkv_projections",
            f"off makes every head its own key, but n_kv_head={c.n_kv_head}; set n_kv_head={c.n_head}",
        )
    if c.qkv_bias and not c.qkv_projections:
        problems.add("qkv_bias", "needs the projections it biases; set qkv_projections=True or qkv_bias=False")
    if c.objective == "masked":
        _check_masked(c, problems)
    if not isinstance(c.encoder_layers, int) or isinstance(c.encoder_layers, bool) or c.encoder_layers < 0:
        problems.add("encoder_layers", "must be a whole number of blocks, or 0 for a decoder alone")
    elif c.encoder_layers and (c.objective != "next_token" or not c.causal):
        problems.add("encoder_layers", "give the encoder to a causal next-token decoder (objective=next_token)")
    if c.mask_token is not None and not (isinstance(c.mask_token, int) and 0 <= c.mask_token < c.vocab_size):
        problems.add("mask_token", f"must be a token id below vocab_size={c.vocab_size}, or None for the last one")
    if c.head_transform and c.activation == "swiglu":
        problems.add(
            "head_transform", "applies an elementwise activation, and swiglu is gated; choose gelu, gelu_exact or relu"
        )
    if not 0.0 <= c.dropout < 1.0:
        problems.add("dropout", "must be in [0, 1)")
    problems.positive("rope_theta", "norm_eps", "init_std")
    problems.not_negative("logit_softcap")
    if not isinstance(c.attention_window, int) or isinstance(c.attention_window, bool) or c.attention_window < 0:
        problems.add("attention_window", "must be a whole number of tokens, or 0 for the whole prefix")
    if not isinstance(c.loss_chunk, int) or isinstance(c.loss_chunk, bool) or c.loss_chunk < 0:
        problems.add("loss_chunk", "must be a whole number of positions, or 0 for the whole sequence at once")
    elif c.loss_chunk and c.block_size % c.loss_chunk:
        problems.add(
            "loss_chunk", f"must divide block_size={c.block_size}; choose a divisor such as {largest_divisor(c)}"
        )
    _check_rope_scaling(c, problems)
    _check_moe(c, problems)
    problems.raise_if_any()


def largest_divisor(c: ModelConfig) -> int:
    """The largest divisor of block_size not above loss_chunk: the nearest chunk that divides."""
    return max(d for d in range(1, min(c.loss_chunk, c.block_size) + 1) if c.block_size % d == 0)


def _check_masked(c: ModelConfig, problems: Problems) -> None:
    if c.causal:
        problems.add(
            "objective", "predicts hidden tokens from both sides, which the causal mask forbids; set causal=False"
        )
    if not 0.0 < c.mask_rate < 1.0:
        problems.add("mask_rate", "must be between 0 and 1 (exclusive); BERT hides 0.15")


def _check_rope_scaling(c: ModelConfig, problems: Problems) -> None:
    if c.rope_scaling is None:
        return
    s = c.rope_scaling
    if c.position != "rope":
        problems.add("position", "but rope_scaling is set; set position='rope' or drop rope_scaling")
    if s.kind not in ROPE_SCALINGS:
        allowed = ", ".join(map(repr, ROPE_SCALINGS))
        problems.found.append(f"model.rope_scaling.kind={s.kind!r} is not one of {allowed}")
    if not s.factor > 0:
        problems.found.append(f"model.rope_scaling.factor={s.factor!r} must be positive")
    if s.kind in ("yarn", "llama3", "longrope") and not (s.original_block_size or 0) > 0:
        problems.found.append(
            f"model.rope_scaling.original_block_size={s.original_block_size!r}: {s.kind} needs the positive "
            "context length the model was trained with"
        )
    if s.kind == "llama3" and not 0 < s.low_freq_factor < s.high_freq_factor:
        problems.found.append(
            f"model.rope_scaling.low_freq_factor={s.low_freq_factor!r}, high_freq_factor={s.high_freq_factor!r}: "
            "llama3 needs 0 < low_freq_factor < high_freq_factor (Llama 3.1: 1 and 4)"
        )
    if s.kind == "longrope":
        for field in ("long_factor", "short_factor"):
            factors = getattr(s, field)
            if factors is None or len(factors) != c.head_dim // 2 or not all(f > 0 for f in factors):
                problems.found.append(
                    f"model.rope_scaling.{field}={factors!r}: longrope needs head_dim / 2 = {c.head_dim // 2} "
                    "positive factors, one per rotary pair"
                )


def _check_moe(c: ModelConfig, problems: Problems) -> None:
    if c.moe is None:
        return
    m = c.moe
    moe = Problems("model.moe", m)
    moe.positive_integers("experts", "top_k", "every")
    if isinstance(m.experts, int) and m.experts < 2:
        moe.add("experts", "must be at least 2 for a choice to route (or 0 in a config file for dense MLPs)")
    if isinstance(m.top_k, int) and isinstance(m.experts, int) and m.top_k > m.experts:
        moe.add("top_k", f"is more than the {m.experts} experts; choose at most experts")
    if not isinstance(m.shared_experts, int) or m.shared_experts < 0:
        moe.add("shared_experts", "must be a whole number >= 0")
    if m.expert_hidden is not None:
        moe.positive_integers("expert_hidden")
    moe.not_negative("capacity_factor", "aux_loss", "z_loss")
    if isinstance(m.every, int) and m.every > c.n_layer:
        moe.add("every", f"is more than n_layer={c.n_layer}, so no block would hold experts; choose at most n_layer")
    if not c.mlp:
        problems.add("mlp", "is off, but the experts replace the MLP; turn mlp on or drop model.moe")
    if c.scan_layers and m.every != 1:
        moe.add(
            "every",
            "mixes MoE and dense blocks, which scan_layers cannot iterate as one; set every=1 or scan_layers=False",
        )
    problems.found.extend(moe.found)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where text comes from and how it becomes tokens.

    source: builtin:python-docs | builtin:repeated-random | text:PATH | hf:NAME[:CONFIG] (see
        jaxgpt/data/sources.py): a token stream cut into windows; or pairs:PATH | builtin:dates |
        builtin:reverse | builtin:sort (jaxgpt/data/pairs.py): examples of a source and its
        target, the loss on the target.
    tokenizer: char | byte | gpt2 | r50k_base | cl100k_base | o200k_base.
    val_fraction: share of the token stream, taken from its end, held out for validation.
    text_column: the column holding text in .jsonl/.parquet files and Hub datasets.
    max_tokens: stop preparing after this many tokens (0: the whole corpus); for sampling a
        slice of a huge streamed corpus.
    cache_dir: where prepared token files live ("" means $JAXGPT_CACHE or ~/.cache/jaxgpt).
    shard_tokens: tokens per prepared file (the last holds the rest): a preparation killed part
        way continues from its last whole shard, so this bounds the work a kill loses. It names
        the files, not the tokens: any value prepares the same stream.
    align_to_documents: training windows begin where a document does (at the separator before
        it, so its first token is predicted from a clean start) or a whole window further into
        a long one, instead of at any offset (modded-nanogpt's "align batch starts with EoS",
        nanochat's BOS-aligned rows); shorter documents are packed after it as without.
    attend_within_documents: each token attends only to the tokens of its own document, and
        positions restart at each document's start (its separator), as Llama 3 trains on
        packed documents; without it a window's tokens attend to every earlier token in it,
        whichever document it is from. Training, evaluation and bits per byte score the same
        tokens either way.
    """

    source: str = "builtin:python-docs"
    tokenizer: str = "char"
    val_fraction: float = 0.1
    text_column: str = "text"
    max_tokens: int = 0
    cache_dir: str = ""
    shard_tokens: int = 1 << 27  # 256 MiB of uint16 tokens per file
    align_to_documents: bool = False
    attend_within_documents: bool = False

    def __post_init__(self):
        problems = Problems("data", self)
        if not 0.0 < self.val_fraction < 1.0:
            problems.add("val_fraction", "must be between 0 and 1 (exclusive)")
        if not self.max_tokens >= 0:
            problems.add("max_tokens", "must be >= 0 (0 means all)")
        if not self.shard_tokens >= 1:
            problems.add("shard_tokens", "must be >= 1")
        for name in ("align_to_documents", "attend_within_documents"):
            if self.pairs and getattr(self, name):
                problems.add(name, "cuts windows from a stream; a pairs source packs whole examples already: drop it")
        problems.raise_if_any()

    @property
    def pairs(self) -> bool:
        """Whether the source is a set of (source, target) examples rather than a token stream."""
        return is_pairs_source(self.source)


BUILTIN_PAIRS = ("dates", "reverse", "sort")  # builtin:NAME sources of text pairs (jaxgpt/data/pairs.py)


def is_pairs_source(source: str) -> bool:
    """pairs:PATH and builtin:dates, reverse and sort (jaxgpt/data/pairs.py) give examples, the
    others a token stream."""
    kind, _, rest = source.partition(":")
    return kind == "pairs" or (kind == "builtin" and rest in BUILTIN_PAIRS)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The optimisation and its cadence.

    steps: optimizer steps in the run (raise it to extend a finished run).
    batch_size: sequences of model.block_size tokens per step.
    lr, min_lr: peak learning rate, reached after warmup_steps of linear warmup, then cosine
        decay to min_lr at decay_steps (Loshchilov & Hutter 2017), constant after.
    decay_steps: where the cosine ends; 0 means at `steps`. Extending a finished run with
        decay_steps set to its old length continues at min_lr instead of raising the rate.
    weight_decay: AdamW's decoupled decay, on matrices only: norms and biases are never
        decayed, embeddings only with decay_embeddings.
    beta1, beta2: Adam moments; beta2 = 0.95 as in GPT-3 and nanoGPT, steadier than 0.999 for
        large transformers.
    grad_clip: clip the global gradient norm to this (0 disables).
    eval_every, eval_batches: evaluate train and val loss on eval_batches fixed batches.
    log_every: write a metrics line and refresh the progress bar.
    log_layer_grad_norms: also log the gradient norm of each parameter group (embeddings, each
        block, the final norm) as grad_norm/<group>, from the last step of each interval: where
        in the depth the gradient vanishes or explodes.
    checkpoint_every, keep_checkpoints: save every so many steps (and at the end), keeping
        the newest keep_checkpoints and the best by validation loss.
    multiple_choice: also score the model on multiple-choice questions (a HellaSwag JSONL
        file, or hf:NAME[:SPLIT]; jaxgpt/lab/multiple_choice.py) at the end, and every
        multiple_choice_every steps if that is not 0, on the first multiple_choice_limit of them
        (0: all); logged as multiple_choice_accuracy and multiple_choice_accuracy_norm.
    seed: seeds initialisation, dropout and every batch.
    microbatches: split each batch into this many sequential microbatches and accumulate
        their gradients inside the compiled step (same result up to float32 summation order,
        less activation memory). 0 lets the run choose (jaxgpt/hardware/step_choice.py): the fewest whose
        step fits the CPU's cache, or the accelerator's memory.
    dtype: compute dtype, "float32" or "bfloat16" (parameters and optimizer state stay
        float32: mixed precision).
    decay_embeddings: also apply weight decay to the token/position embeddings.
    optimizer: "adamw", or "muon": Muon (Jordan et al. 2024; optax.contrib) for the blocks'
        matrices, whose momentum is orthogonalised by a Newton-Schulz iteration, at muon_lr
        (following the same warmup and cosine), with train.weight_decay; Adam (with Nesterov
        momentum, as optax's Muon has it) without weight decay at lr for everything else
        (embeddings, LM head, norms, biases).
    muon_lr, muon_momentum: Muon's peak learning rate and momentum (Nesterov).
    init_from: start from trained weights instead of a random init: a jaxgpt run's workdir
        (its newest checkpoint; the same tokenizer), or Hugging Face weights (a directory, or
        a Hub name such as "gpt2"). The model section must describe the same architecture,
        except that block_size may change where no parameter has its length (any position
        kind but learned) and rope_theta / rope_scaling may change: a context extension. A
        new run with a fresh optimizer, in its own workdir; config.json records the origin.
    tensorboard: also write the metrics as TensorBoard event files in <workdir>/tensorboard
        (`tensorboard --logdir runs`).
    wandb_project: also log to this Weights & Biases project ("" for none; needs
        `pip install wandb` and a login).
    """

    steps: int = 2000
    batch_size: int = 12
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    decay_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_batches: int = 20
    log_every: int = 50
    log_layer_grad_norms: bool = False
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    multiple_choice: str = ""
    multiple_choice_every: int = 0
    multiple_choice_limit: int = 0
    seed: int = 0
    microbatches: int = 0
    dtype: str = "float32"
    decay_embeddings: bool = False
    optimizer: str = "adamw"
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    init_from: str = ""
    tensorboard: bool = True
    wandb_project: str = ""

    def __post_init__(self):
        problems = Problems("train", self)
        problems.positive("steps", "batch_size", "eval_every", "eval_batches", "log_every", "checkpoint_every")
        problems.positive("keep_checkpoints", "lr")
        if self.microbatches < 0 or (self.microbatches and self.batch_size % self.microbatches):
            problems.add(
                "microbatches",
                f"does not divide train.batch_size={self.batch_size}; choose microbatches dividing the batch, or 0 to "
                "let the run choose",
            )
        if not 0 <= self.min_lr <= self.lr:
            problems.add("min_lr", f"must be between 0 and train.lr={self.lr}")
        if not 0 <= self.warmup_steps < self.steps:
            problems.add("warmup_steps", f"must be >= 0 and below train.steps={self.steps}")
        if self.decay_steps and not self.warmup_steps < self.decay_steps:
            problems.add(
                "decay_steps", f"must be 0 (decay until train.steps) or above train.warmup_steps={self.warmup_steps}"
            )
        for field in ("beta1", "beta2"):
            if not 0 <= getattr(self, field) < 1:
                problems.add(field, "must be in [0, 1)")
        problems.not_negative("weight_decay", "grad_clip", "multiple_choice_every", "multiple_choice_limit")
        if self.multiple_choice_every and not self.multiple_choice:
            problems.add("multiple_choice_every", "scores questions from train.multiple_choice, which is empty: set it")
        problems.one_of("dtype", ("float32", "bfloat16"))
        problems.one_of("optimizer", ("adamw", "muon"))
        problems.positive("muon_lr")
        if not 0 <= self.muon_momentum < 1:
            problems.add("muon_momentum", "must be in [0, 1)")
        problems.raise_if_any()


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The device mesh (see jaxgpt/sharding.py): sizes of the data, fsdp, tensor and expert
    axes. -1 takes all the devices the other axes leave (at most one -1); the default puts
    every device on `data`. The product must divide the device count (a smaller mesh uses the
    first devices). The expert axis splits a mixture of experts' experts (and, outside the
    experts, the batch, as data does)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1

    def __post_init__(self):
        problems = Problems("mesh", self)
        for field in ("data", "fsdp", "tensor", "expert"):
            if getattr(self, field) == 0 or getattr(self, field) < -1:
                problems.add(field, "must be positive, or -1 for all the devices the other axes leave")
        if [self.data, self.fsdp, self.tensor, self.expert].count(-1) > 1:
            problems.found.append(
                f"mesh {self._text()} has more than one -1; use at most one -1 (the axis taking the rest)"
            )
        problems.raise_if_any()

    def shape(self, n_devices: int) -> tuple[int, int, int, int]:
        """The axes' sizes over `n_devices`, in the mesh's order (sharding.AXES)."""
        sizes = [self.data, self.fsdp, self.expert, self.tensor]
        fixed = math.prod(s for s in sizes if s != -1)
        if n_devices % fixed:
            raise ConfigError(
                f"mesh {self._text()} does not divide the {n_devices} devices; choose sizes whose product divides "
                f"{n_devices} (mesh.data, mesh.fsdp, mesh.tensor, mesh.expert)"
            )
        return tuple(n_devices // fixed if s == -1 else s for s in sizes)

    def _text(self) -> str:
        return f"data={self.data}, fsdp={self.fsdp}, tensor={self.tensor}, expert={self.expert}"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        experts = self.model.moe.experts if self.model.moe else 0
        if self.mesh.expert != 1 and not experts:
            raise ConfigError(
                f"mesh.expert={self.mesh.expert} splits experts over devices, but the model has none; set "
                "model.moe.experts or leave mesh.expert at 1"
            )
        if self.mesh.expert > 1 and experts % self.mesh.expert:
            raise ConfigError(
                f"mesh.expert={self.mesh.expert} does not divide model.moe.experts={experts}; choose a divisor so "
                "each device holds whole experts"
            )
        if self.model.encoder_layers and not self.data.pairs:
            raise ConfigError(
                f"model.encoder_layers={self.model.encoder_layers} gives the model an encoder, which reads a source "
                f"for each target, and data.source={self.data.source!r} is one stream of text; give it text pairs "
                "(pairs:PATH, builtin:reverse, builtin:sort or builtin:dates), or set model.encoder_layers=0"
            )
        if self.model.encoder_layers and self.train.multiple_choice:
            raise ConfigError(
                "train.multiple_choice scores endings as text continuing text, which an encoder–decoder's decoder "
                "does not read; leave it empty for a run with model.encoder_layers"
            )
        tokens = self.train.batch_size * self.model.block_size
        if self.model.objective == "masked" and self.model.mask_rate * tokens < 1:
            raise ConfigError(
                f"model.mask_rate={self.model.mask_rate} hides {self.model.mask_rate * tokens:.2g} of a batch's "
                f"{tokens:,} tokens on average, so most batches would score nothing (a loss of 0 over no tokens); "
                f"raise mask_rate to at least {1 / tokens:.2g}, or the batch or block size"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def with_train(run: RunConfig, **changes) -> RunConfig:
    """`run` with these fields of its train section changed."""
    return dataclasses.replace(run, train=dataclasses.replace(run.train, **changes))


def run_config_from_dict(d: dict) -> RunConfig:
    """Inverse of RunConfig.to_dict (reads a run's config.json)."""
    return RunConfig(
        ModelConfig(**d["model"]), DataConfig(**d["data"]), TrainConfig(**d["train"]), MeshConfig(**d.get("mesh", {}))
    )
