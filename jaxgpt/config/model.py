"""What a model is: `ModelConfig`, with its RoPE scaling and mixture of experts, each a frozen
dataclass checked when it is built (every problem, one line: jaxgpt/config/problems.py).
Defaults describe a GPT-2-style model."""

from __future__ import annotations

import dataclasses
import math

from jaxgpt.config.problems import Problems

ACTIVATIONS = ("gelu", "gelu_exact", "relu", "relu2", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")  # down(act(gate(x)) * up(x)): two matrices in, one out
NORMS = ("layernorm", "rmsnorm", "none")
NORM_POSITIONS = ("pre", "post", "sandwich")
POSITIONS = ("rope", "learned", "sinusoidal", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "yarn", "llama3", "longrope")
ATTENTION_KERNELS = ("xla", "dot_product", "flash_tpu")
ROPE_PAIRINGS = ("half", "interleaved")
OBJECTIVES = ("next_token", "masked", "classification")
ATTENTION_GATES = ("none", "elementwise", "headwise")
ENCODER_SUMMARIES = ("none", "mean")  # what cross-attention reads of the source: model.encoder_summary
TOKEN_MIXERS = ("attention", "convolution")
LORA_TARGETS = ("qkv", "out", "up", "down", "q", "kv")  # projections an adapter may sit beside (jaxgpt/model/lora.py)
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")


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
    d_model: width of the residual stream.
    head_dim: each head's width; None: d_model // n_head. Set, the queries are n_head x head_dim
        wide and the keys and values n_kv_head x head_dim, whatever d_model, and the output
        projection maps the heads back to d_model (Gemma's and Qwen3's heads are wider than
        d_model / n_head).
    mlp_hidden: hidden width of the MLP. None means 4 * d_model, or for SwiGLU the Llama rule
        2/3 * 4 * d_model rounded up to a multiple of 64 (keeps the parameter count of a
        4x GELU MLP while adding the gate).
    activation: "gelu" (tanh approximation, as GPT-2), "gelu_exact" (the erf form), "relu",
        "relu2" (relu(x)^2, So et al. 2021, "Primer"), or the gated "swiglu" and "geglu"
        (Shazeer 2020: down(act(gate(x)) * up(x)), silu or GPT-2's tanh GELU; Llama, Gemma).
    norm: "layernorm", "rmsnorm" (Zhang & Sennrich 2019), or "none" (an ablation: no norms).
    norm_position: "pre" (x + f(norm(x)), GPT-2 onwards; trains stably without warmup
        tricks), "post" (norm(x + f(x)), the original Transformer) or "sandwich"
        (x + norm'(f(norm(x))), a norm before and after each branch: Gemma 2 and 3).
    norm_eps: epsilon inside the norms (GPT-2 uses 1e-5, Llama 1e-5 or 1e-6).
    position: "rope" (Su et al. 2021), "learned" (GPT-2), "sinusoidal" (Vaswani et al. 2017),
        "alibi" (Press et al. 2022) or "none" (causal attention alone carries order).
    rope_theta: RoPE base; frequencies are theta ** (-2i / head_dim).
    rope_scaling: a `RopeScaling`, or None for plain RoPE.
    attention_scale_dim: the scores are multiplied by attention_scale_dim ** -0.5 rather than
        divided by sqrt(head_dim) (Gemma's query_pre_attn_scalar); None: head_dim.
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
    init_heads_identical: every attention head of a layer starts with the same weights (its
        query, key, value and output slices drawn once and copied; the key/value heads alike).
        Nothing then tells the heads apart, so each gets the same gradient and they stay equal
        however long they train (docs/lab.md): random initialisation is what lets heads differ.

    Switches from the records since GPT-2 (each off by default):
    qk_norm: RMSNorm over each query and key head before RoPE (Dehghani et al. 2023; OLMo 2),
        which bounds the attention logits and lets higher learning rates train stably.
    zero_init_residual: the attention and MLP output projections start at zero, so every block
        starts as the identity and the residual stream is the embedding (modded-nanogpt).
    logit_softcap: when > 0, logits become cap * tanh(logits / cap) (Gemma 2): no logit can
        grow past the cap, which keeps early training from overconfident spikes.
    attention_window: when > 0, each query sees only itself and the window - 1 tokens before it
        (sliding-window attention; Beltagy et al. 2020, Mistral 7B); 0 sees the whole prefix.
    global_every: with attention_window, every global_every-th block (blocks every-1,
        2*every-1, ...; as moe.every counts) sees the whole prefix and the others the window:
        local and global layers interleaved (Gemma 2: 2, Gemma 3: 6). 0: every block windowed.
    rope_local_theta: the RoPE base of the windowed blocks where they are interleaved with
        global ones (Gemma 3's rope_local_base_freq; 0: rope_theta). Those blocks use plain
        RoPE: rope_scaling stretches the global blocks' alone, which see the long context.
    x0_mix: each block reads a learned mix of the residual stream and the first block's input
        (the embeddings), a * x + b * x0, with its own two numbers starting at a = 1, b = 0
        (modded-nanogpt's x0 skip): every layer can reach the tokens' identities directly.
    value_embeddings: each block has its own embedding table of the tokens, as wide as its
        keys and values, and its attention's values become a * v + b * e, e the tokens' rows,
        a and b learned per block from 1/2 and 1/2 (modded-nanogpt's value embeddings): the
        values can carry what a token is, whatever the residual stream has made of it.
    attention_gate: a sigmoid gate on each head's output, computed from the attention's own
        input, before the output projection (Qiu et al. 2025, "Gated Attention for Large
        Language Models", their G1 position; Qwen3-Next): "elementwise", one gate per feature of
        each head (n_head x head_dim from d_model, the paper's best), "headwise", one scalar per
        head (n_head from d_model), or "none". The gate can close a head where it would
        otherwise park its weight on the first token (the attention sink).

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
    token_mixer: what each block's first branch does to mix positions: "attention", or
        "convolution", a causal depthwise convolution (jaxgpt/model/convolution.py): the values
        v = x W_v, each feature j summing its last conv_width values with weights of its own,
        y_t[j] = sum_i w_i[j] v_{t-i}[j], then an output projection. It is attention whose
        pattern is fixed by distance alone, learned, one per feature, and conv_width long: no
        token can look up another by what it is (what induction needs). Its parameters are
        2 d_model^2 + conv_width d_model to attention's 4 d_model^2; a wider MLP evens them.
    conv_width: the convolution's width in tokens (itself and the conv_width - 1 before it).

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
        vocabulary is the mask token. "classification": each labelled text's class (data.source
        labels:PATH; jaxgpt/data/labels.py) from its last token (a decoder) or its first (an
        encoder, causal=False), read by a classifier of model.classes outputs.
    mask_rate: the share of positions the masked objective hides and scores (BERT: 0.15).
    encoder_layers: blocks of a bidirectional encoder in front of the decoder (the original
        Transformer's encoder–decoder, Vaswani et al. 2017); each decoder block then attends
        to the encoder's output (cross-attention) between its self-attention and its MLP. The
        encoder reads a batch's sources (text pairs: jaxgpt/data/pairs.py), shares the token
        embedding, and is built by the same switches as the decoder; 0: decoder-only.
    encoder_summary: what of the source the decoder's cross-attention reads. "none": every
        encoder position (attention, Bahdanau et al. 2015). "mean": one vector a source, the
        mean of its encoder outputs, at every position, so each cross-attention reads that one
        vector whatever its weights: the fixed-size bottleneck of the encoder–decoder RNN
        (Cho et al. 2014, Sutskever et al. 2014) that attention was invented to remove.
    classes: the classifier's outputs, for model.objective=classification: a linear layer over
        the final norm's output in the LM head's place, read at one position of each example
        (jaxgpt/data/labels.py); 0: as many as the labelled texts have labels.
    patch_size: a Vision Transformer (Dosovitskiy et al. 2021): the model reads images of an image
        source (jaxgpt/data/images.py) cut into patch_size x patch_size patches, each projected to
        d_model as a token's embedding would be (patch_embed), after a learned class token; with
        objective=classification and causal=False the class token's output is classified.
        block_size is then 1 + the patches an image has. 0: the model reads tokens.
    channels: an image's channels (1 grey, 3 RGB), for patch_size.
    mtp_weight: multi-token prediction (DeepSeek-V3's, at depth 1; Gloeckle et al. 2024): a
        module beside the head that predicts the token after next, from the last block's output
        and the next token's embedding through one more block, read out by the shared head;
        its loss, times this weight, is added to the next-token loss in training (the
        "ahead_loss" logged, and val_ahead_loss), and generation never runs it. 0: none.

    lora_rank: low-rank adapters of this rank beside the projections lora_targets names (Hu et
        al. 2021; jaxgpt/model/lora.py): y = x W + (lora_alpha / rank) x A B, B starting at 0,
        and training changes A and B alone (the rest frozen, without optimizer state). 0: none.
        Fine-tune with train.init_from, which fills the base weights; `jaxgpt export` merges
        the adapters into the weights.
    lora_alpha: the adapters' scale is lora_alpha / lora_rank (the paper's alpha).
    lora_embeddings: with adapters, also train the token embedding (and an untied head) in
        full: what tokens the fine-tuning adds need (a chat template's start alike, and frozen
        could not be told apart), at the cost of the table's optimizer state.
    lora_targets: the adapted projections by name, comma-separated: qkv and out (attention;
        q and kv for cross-attention's), up and down (the MLP).
    """

    vocab_size: int = 256
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    d_model: int = 128
    head_dim: int | None = None
    mlp_hidden: int | None = None
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    position: str = "learned"
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    attention_scale_dim: int | None = None
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
    init_heads_identical: bool = False
    qk_norm: bool = False
    zero_init_residual: bool = False
    logit_softcap: float = 0.0
    attention_window: int = 0
    global_every: int = 0
    rope_local_theta: float = 0.0
    x0_mix: bool = False
    value_embeddings: bool = False
    scale_attention: bool = True
    causal: bool = True
    residual: bool = True
    mlp: bool = True
    uniform_attention: bool = False
    rope_pairing: str = "half"
    scale_embeddings: bool = False
    qkv_projections: bool = True
    attention_gate: str = "none"
    token_mixer: str = "attention"
    conv_width: int = 4
    moe: MixtureOfExperts | None = None
    embedding_norm: bool = False
    head_transform: bool = False
    logits_bias: bool = False
    mask_token: int | None = None
    objective: str = "next_token"
    mask_rate: float = 0.15
    encoder_layers: int = 0
    encoder_summary: str = "none"
    mtp_weight: float = 0.0
    classes: int = 0
    patch_size: int = 0
    channels: int = 1
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_embeddings: bool = False
    lora_targets: str = "qkv,out,up,down"

    def __post_init__(self):
        # Resolve the derived defaults first so validation sees the numbers the model uses.
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.head_dim is None and _divides(self.n_head, self.d_model):
            object.__setattr__(self, "head_dim", self.d_model // self.n_head)
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if isinstance(self.moe, dict):
            object.__setattr__(self, "moe", MixtureOfExperts(**self.moe))
        _check_model(self)
        if self.mlp_hidden is None:
            object.__setattr__(self, "mlp_hidden", default_mlp_hidden(self.d_model, self.activation))

    @property
    def adapted(self) -> tuple[str, ...]:
        """The projections low-rank adapters sit beside (none without lora_rank)."""
        return tuple(t.strip() for t in self.lora_targets.split(",") if t.strip()) if self.lora_rank else ()

    @property
    def has_logits_bias(self) -> bool:
        """Whether the LM head adds a bias per token (BERT's head, or logits_bias)."""
        return self.head_transform or self.logits_bias

    @property
    def expert_hidden(self) -> int:
        """Hidden width of one expert MLP (of a shared one too)."""
        return (self.moe.expert_hidden if self.moe else None) or self.mlp_hidden

    def is_windowed_layer(self, layer: int) -> bool:
        """Whether block `layer` (from 0) attends within attention_window rather than over the
        whole prefix (global_every interleaves the two)."""
        every = self.global_every
        return bool(self.attention_window) and not (every and layer % every == every - 1)

    @property
    def has_final_norm(self) -> bool:
        """Whether the stream is normed before the head: pre-norm and sandwich blocks leave it
        unnormed, post-norm blocks end normed."""
        return self.norm_position != "post"

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block `layer` (from 0) holds a mixture of experts rather than a dense MLP."""
        return self.moe is not None and layer % self.moe.every == self.moe.every - 1

    @property
    def outputs(self) -> int:
        """What the model's last layer chooses among: a classifier's classes, else the vocabulary
        (a uniform guess over them scores ln outputs)."""
        return self.classes or self.vocab_size

    @property
    def moe_layers(self) -> list[int]:
        """The blocks that hold a mixture of experts, in order."""
        return [i for i in range(self.n_layer) if self.is_moe_layer(i)]

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_kv_head

    @property
    def adds_a_mask_token(self) -> bool:
        """Whether the masked objective's mask token is its own id after the tokenizer's."""
        return self.objective == "masked" and self.mask_token is None

    def notes(self) -> list[str]:
        """What a run says at its start about this model: where its val_loss is not a language
        model's, and where a setting trains something it is not expected to."""
        notes = [self.objective_note()] if self.objective_note() else []
        if self.moe is not None and self.moe.top_k == 1 and self.moe.renormalize:
            notes.append(
                "model.moe.top_k=1 with renormalize=True: the one chosen expert's weight is exactly 1, so the router "
                "learns from its auxiliary losses alone, never from the task; set --config.model.moe.renormalize=false "
                "(Switch Transformer's rule) for a router the task trains"
            )
        return notes

    def objective_note(self) -> str | None:
        """What a run says at its start where its val_loss is not a language model's, else None."""
        if self.objective == "masked":
            return (
                f"model.objective=masked: an encoder, scored on the {self.mask_rate:.0%} of tokens it hides "
                "(val_loss and val_accuracy); not comparable with a next-token loss"
            )
        if self.objective == "next_token" and not self.causal:
            return (
                "model.causal=false: training sees the token each position predicts, so val_loss is not a language "
                "model's loss; every evaluation also scores the weights from the past alone (val_loss_past_only, as "
                "generation uses them), and jaxgpt compare ranks the run by that"
            )
        return None

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Every field by what it is to the code that treats fields by kind, so none is forgotten by it:
#   architecture  what the weights compute, their shapes and meaning: a run starting from weights
#                 takes it from them, a resume and a fine-tuning compare it (jaxgpt/job/pretrained.py)
#   workbench     the same, a switch no Hugging Face family's checkpoint has: export refuses it on
#                 (jaxgpt/hf/family.py)
#   run           what a run chooses for itself over the same weights: arithmetic and layout,
#                 regularisation, the initialisation, the objective's masking rate, adapters
# tests/test_config.py fails on a field of ModelConfig in none of them.
FIELD_KINDS = {
    **dict.fromkeys(
        ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model", "head_dim", "mlp_hidden",
         "activation", "norm", "norm_position", "norm_eps", "position", "rope_theta", "rope_scaling",
         "attention_scale_dim", "bias", "qkv_bias", "tie_embeddings", "moe", "logits_bias", "mask_token",
         "objective", "encoder_layers", "classes", "patch_size", "channels"),
        "architecture",
    ),
    **dict.fromkeys(
        ("qk_norm", "logit_softcap", "attention_window", "global_every", "rope_local_theta", "scale_attention",
         "causal", "residual", "rope_pairing", "mlp", "uniform_attention", "qkv_projections", "scale_embeddings",
         "embedding_norm", "head_transform",
         "x0_mix", "value_embeddings", "mtp_weight", "attention_gate", "token_mixer", "conv_width", "encoder_summary"),
        "workbench",
    ),
    **dict.fromkeys(
        ("dropout", "dtype", "param_dtype", "attention", "scan_layers", "remat", "loss_chunk", "init_std",
         "zero_init_residual", "init_heads_identical", "mask_rate", "lora_rank", "lora_alpha", "lora_embeddings",
         "lora_targets"),
        "run",
    ),
}  # fmt: skip


def fields_of_kind(kind: str) -> tuple[str, ...]:
    """The ModelConfig fields FIELD_KINDS gives `kind`, in the dataclass's order."""
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if FIELD_KINDS.get(f.name) == kind)


def _divides(n, d) -> bool:
    return isinstance(n, int) and isinstance(d, int) and n > 0 and d % n == 0


def default_mlp_hidden(d_model: int, activation: str) -> int:
    if activation in GATED_ACTIVATIONS:
        return 64 * math.ceil(2 * 4 * d_model / 3 / 64)
    return 4 * d_model


def _check_classifier(c: ModelConfig, problems: Problems) -> None:
    if not problems.whole_number("classes", "of labels, or 0 for as many as the data has"):
        return
    if c.classes and c.objective != "classification":
        problems.add("classes", f"gives a classifier, which model.objective={c.objective!r} does not train; set 0")
    if c.objective == "classification" and c.classes == 1:
        problems.add("classes", "is 1, and a classifier tells at least 2 apart; leave it 0 for the data's labels")
    if c.objective == "classification" and c.loss_chunk:
        problems.add("loss_chunk", "chunks the vocabulary's logits, and a classifier has a few; set 0")
    if not problems.whole_number("patch_size", "of pixels a side, or 0 for a model that reads tokens"):
        return
    if c.patch_size and (c.objective != "classification" or c.causal or c.encoder_layers):
        problems.add("patch_size", "gives a Vision Transformer, an encoder that classifies: set objective="
                     "classification, causal=False and encoder_layers=0, or patch_size=0")  # fmt: skip
    if c.channels not in (1, 3):
        problems.add("channels", "is an image's channels: 1 (grey) or 3 (RGB)")


def _check_multi_token(c: ModelConfig, problems: Problems) -> None:
    problems.not_negative("mtp_weight")
    if c.mtp_weight and (c.objective != "next_token" or not c.causal or c.encoder_layers):
        problems.add(
            "mtp_weight",
            "predicts the token after next from the ones before, which needs a causal next-token decoder without an "
            "encoder (objective=next_token, causal=True, encoder_layers=0); set mtp_weight=0",
        )


def _check_adapters(c: ModelConfig, problems: Problems) -> None:
    problems.not_negative("lora_rank")
    if not c.lora_rank:
        return
    problems.positive("lora_alpha")
    if isinstance(c.lora_rank, int) and isinstance(c.d_model, int) and c.lora_rank > c.d_model:
        problems.add(
            "lora_rank",
            f"is above d_model={c.d_model}: every adapted projection reads or writes the d_model-wide stream, so "
            f"A·B has rank at most {c.d_model} and the rest is parameters that add nothing; choose at most that",
        )
    unknown = [t for t in c.adapted if t not in LORA_TARGETS]
    if unknown or not c.adapted:
        named = ", ".join(unknown) or "nothing"
        problems.add("lora_targets", f"names {named}; choose from {', '.join(LORA_TARGETS)}")
    if c.moe is not None and {"up", "down"} & set(c.adapted):
        problems.add("lora_targets", "adapts the MLP, and a mixture of experts has no adapters; use qkv,out")


def _check_heads(c: ModelConfig, problems: Problems) -> None:
    """How the width splits into heads, and what the positions and projections ask of them."""
    if c.head_dim is None:  # left to the width, which does not split
        problems.add(
            "d_model", f"is not divisible by n_head={c.n_head}; choose d_model as a multiple of n_head, or a head_dim"
        )
        return
    if not (isinstance(c.head_dim, int) and c.head_dim > 0):
        problems.add("head_dim", "must be a positive whole number of features a head, or None for d_model / n_head")
        return
    if c.n_head % c.n_kv_head:
        problems.add(
            "n_head", f"is not divisible by n_kv_head={c.n_kv_head}; each key/value head must serve a whole group"
        )
    if c.position == "rope" and c.head_dim % 2:
        problems.add("head_dim", f"is odd (d_model={c.d_model}, n_head={c.n_head}); RoPE rotates pairs of dimensions, "
                     "so choose an even head_dim")  # fmt: skip
    if c.position == "sinusoidal" and c.d_model % 2:
        problems.add("d_model", "is odd; sinusoidal positions need an even d_model")
    if c.uniform_attention and c.position == "alibi":
        problems.add(
            "position",
            "is 'alibi', which biases the scores that uniform_attention ignores; choose another position or "
            "uniform_attention=False",
        )
    if not c.qkv_projections and c.n_head * c.head_dim != c.d_model:
        problems.add(
            "qkv_projections",
            f"off makes each head's slice of the input its query, but head_dim={c.head_dim} x n_head={c.n_head} is "
            f"not d_model={c.d_model}; leave head_dim unset",
        )
    if not c.qkv_projections and c.n_kv_head != c.n_head:
        problems.add(
            "qkv_projections",
            f"off makes every head its own key, but n_kv_head={c.n_kv_head}; set n_kv_head={c.n_head}",
        )
    if c.qkv_bias and not c.qkv_projections:
        problems.add("qkv_bias", "needs the projections it biases; set qkv_projections=True or qkv_bias=False")
    if c.init_heads_identical and not c.qkv_projections:
        problems.add("init_heads_identical", "starts the projections alike, and qkv_projections=False has none: each "
                     "head reads its own slice of the input; leave it off")  # fmt: skip


def _check_token_mixer(c: ModelConfig, problems: Problems) -> None:
    """The convolution in attention's place, and what it cannot be combined with."""
    problems.one_of("token_mixer", TOKEN_MIXERS)
    if c.token_mixer != "convolution":
        return
    problems.positive_integers("conv_width")
    if isinstance(c.conv_width, int) and c.conv_width > c.block_size:
        problems.add("conv_width", f"is more than block_size={c.block_size}; choose at most that")
    if not c.causal or c.encoder_layers:
        problems.add(
            "token_mixer", "is causal, reading each position's past alone; a model that reads both sides "
            "(causal=False, an encoder) needs token_mixer='attention'"
        )  # fmt: skip
    attention_only = {
        "attention_gate": c.attention_gate != "none", "attention_window": c.attention_window, "qk_norm": c.qk_norm,
        "value_embeddings": c.value_embeddings, "uniform_attention": c.uniform_attention, "qkv_bias": c.qkv_bias,
        "init_heads_identical": c.init_heads_identical, "qkv_projections": not c.qkv_projections,
        "scale_attention": not c.scale_attention, "attention_scale_dim": c.attention_scale_dim is not None,
    }  # fmt: skip
    for field, on in attention_only.items():
        if on:
            problems.add(field, "is a setting of attention, and token_mixer='convolution' has none; leave it off")
    if {"qkv", "out"} & set(c.adapted):
        problems.add(
            "lora_targets", "adapts attention's projections, and token_mixer='convolution' has none; use up,down"
        )


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
    _check_adapters(c, problems)
    problems.one_of("objective", OBJECTIVES)
    problems.one_of("attention_gate", ATTENTION_GATES)
    problems.one_of("dtype", DTYPES)
    problems.one_of("param_dtype", DTYPES)
    problems.raise_if_any()  # the divisibility checks below assume positive integers

    _check_heads(c, problems)
    _check_token_mixer(c, problems)
    if c.objective == "masked":
        _check_masked(c, problems)
    has_encoder = problems.whole_number("encoder_layers", "of blocks, or 0 for a decoder alone") and c.encoder_layers
    if has_encoder and (c.objective != "next_token" or not c.causal):
        problems.add("encoder_layers", "give the encoder to a causal next-token decoder (objective=next_token)")
    problems.one_of("encoder_summary", ENCODER_SUMMARIES)
    if c.encoder_summary != "none" and not c.encoder_layers:
        problems.add(
            "encoder_summary", "summarises an encoder's output, and encoder_layers=0 has none; set encoder_layers"
        )
    _check_multi_token(c, problems)
    _check_classifier(c, problems)
    if c.mask_token is not None and not (isinstance(c.mask_token, int) and 0 <= c.mask_token < c.vocab_size):
        problems.add("mask_token", f"must be a token id below vocab_size={c.vocab_size}, or None for the last one")
    if c.head_transform and c.activation in GATED_ACTIVATIONS:
        problems.add(
            "head_transform",
            f"applies an elementwise activation, and {c.activation} is gated; choose gelu, gelu_exact or relu",
        )
    problems.below_one("dropout")
    problems.positive("rope_theta", "norm_eps", "init_std")
    problems.not_negative("logit_softcap")
    problems.whole_number("attention_window", "of tokens, or 0 for the whole prefix")
    _check_local_layers(c, problems)
    if (
        problems.whole_number("loss_chunk", "of positions, or 0 for the whole sequence at once")
        and c.loss_chunk
        and c.block_size % c.loss_chunk
    ):
        problems.add(
            "loss_chunk", f"must divide block_size={c.block_size}; choose a divisor such as {largest_divisor(c)}"
        )
    _check_rope_scaling(c, problems)
    _check_moe(c, problems)
    problems.raise_if_any()


def _check_local_layers(c: ModelConfig, problems: Problems) -> None:
    """Interleaved windowed and global blocks (global_every, rope_local_theta)."""
    if c.attention_scale_dim is not None and not (isinstance(c.attention_scale_dim, int) and c.attention_scale_dim > 0):
        problems.add("attention_scale_dim", "must be a positive whole number, or None to scale by head_dim")
    problems.not_negative("rope_local_theta")
    if not problems.whole_number("global_every", "of blocks, or 0 for every block windowed"):
        return
    if c.global_every and not c.attention_window:
        problems.add(
            "global_every", "interleaves windowed and global blocks, but attention_window=0; set a window or 0"
        )
    elif c.global_every > c.n_layer:
        problems.add(
            "global_every", f"is more than n_layer={c.n_layer}, so no block would be global; choose at most that"
        )
    if c.rope_local_theta and not (c.global_every and c.position == "rope"):
        problems.add(
            "rope_local_theta", "is the RoPE base of windowed blocks between global ones; set global_every and "
            "position='rope', or 0"
        )  # fmt: skip
    if c.scan_layers and c.global_every:
        problems.add(
            "global_every",
            "mixes windowed and global blocks, which scan_layers cannot iterate as one; set scan_layers=False",
        )


def largest_divisor(c: ModelConfig) -> int:
    """The largest divisor of block_size not above loss_chunk: the nearest chunk that divides."""
    return max(d for d in range(1, min(c.loss_chunk, c.block_size) + 1) if c.block_size % d == 0)


def _check_masked(c: ModelConfig, problems: Problems) -> None:
    if c.causal:
        problems.add(
            "objective", "predicts hidden tokens from both sides, which the causal mask forbids; set causal=False"
        )
    problems.share("mask_rate", "; BERT hides 0.15")


def _check_rope_scaling(c: ModelConfig, problems: Problems) -> None:
    if c.rope_scaling is None:
        return
    s = c.rope_scaling
    scaling = Problems("model.rope_scaling", s)
    if c.position != "rope":
        problems.add("position", "but rope_scaling is set; set position='rope' or drop rope_scaling")
    scaling.one_of("kind", ROPE_SCALINGS)
    scaling.positive("factor")
    if s.kind in ("yarn", "llama3", "longrope") and not (s.original_block_size or 0) > 0:
        scaling.add("original_block_size", f"must be positive: {s.kind} needs the context length it was trained with")
    if s.kind == "llama3" and not 0 < s.low_freq_factor < s.high_freq_factor:
        scaling.add(
            "low_freq_factor",
            f"and high_freq_factor={s.high_freq_factor!r}: llama3 needs 0 < low_freq_factor < high_freq_factor "
            "(Llama 3.1: 1 and 4)",
        )
    if s.kind == "longrope":
        for field in ("long_factor", "short_factor"):
            factors = getattr(s, field)
            if factors is None or len(factors) != c.head_dim // 2 or not all(f > 0 for f in factors):
                scaling.add(field, f"must be head_dim / 2 = {c.head_dim // 2} positive factors, one per rotary pair")
    problems.include(scaling)


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
    moe.whole_number("shared_experts", "of MLPs every token also passes through, or 0 for none")
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
    problems.include(moe)
