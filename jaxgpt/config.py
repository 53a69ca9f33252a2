"""Configuration: the model, the data and the training run, each a frozen, validated dataclass.

A `ModelConfig` is validated when it is built, so a model can never be constructed from an
inconsistent description. Defaults describe a GPT-2-style model.

Config files (`configs/*.py`) start from `base_config()`, an `ml_collections.ConfigDict` with
sections `model`, `data` and `train` whose keys are exactly the dataclasses' fields, so
command-line overrides like `--config.train.lr=1e-3` are type-checked against the defaults.
`resolve` turns such a dict into a `RunConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math

import ml_collections

from jaxgpt.errors import UserError

ACTIVATIONS = ("gelu", "relu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
POSITIONS = ("rope", "learned", "sinusoidal", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "yarn")
ATTENTION_KERNELS = ("xla", "dot_product", "flash_tpu")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(UserError, ValueError):
    """A configuration that cannot describe a working model; the message says how to fix it."""


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
    factor: how many times longer the new context is than the original (> 1 stretches).
    original_block_size: the context length the model was trained with; YaRN needs it to
        decide which frequencies complete a full rotation inside that window.
    beta_fast, beta_slow: YaRN's ramp bounds in rotations per original window (paper: 32, 1).
    """

    kind: str
    factor: float
    original_block_size: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0


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
    activation: "gelu" (tanh approximation, as GPT-2), "relu", or "swiglu" (Shazeer 2020).
    norm: "layernorm" or "rmsnorm" (Zhang & Sennrich 2019).
    norm_position: "pre" (x + f(norm(x)), GPT-2 onwards; trains stably without warmup
        tricks) or "post" (norm(x + f(x)), the original Transformer).
    norm_eps: epsilon inside the norms (GPT-2 uses 1e-5, Llama 1e-5 or 1e-6).
    position: "rope" (Su et al. 2021), "learned" (GPT-2), "sinusoidal" (Vaswani et al. 2017),
        "alibi" (Press et al. 2022) or "none" (causal attention alone carries order).
    rope_theta: RoPE base; frequencies are theta ** (-2i / head_dim).
    rope_scaling: a `RopeScaling`, or None for plain RoPE.
    bias: whether linear layers and LayerNorm have biases.
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
    init_std: standard deviation of the GPT-2 initialisation (0.02).
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
    tie_embeddings: bool = True
    dropout: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention: str = "xla"
    scan_layers: bool = False
    remat: str = "none"
    init_std: float = 0.02

    def __post_init__(self):
        # Resolve the derived defaults first so validation sees the numbers the model uses.
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        problems = _problems(self)
        if problems:
            raise ConfigError("invalid model config: " + "; ".join(problems))
        if self.mlp_hidden is None:
            object.__setattr__(self, "mlp_hidden", default_mlp_hidden(self.d_model, self.activation))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

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


def _problems(c: ModelConfig) -> list[str]:
    """Every way `c` is inconsistent, each phrased as what was seen and how to fix it."""
    out = []

    def one_of(field, allowed):
        value = getattr(c, field)
        if value not in allowed:
            out.append(f"{field}={value!r} is not one of {', '.join(map(repr, allowed))}")

    for field in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model"):
        value = getattr(c, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            out.append(f"{field}={value!r} must be a positive integer")
    if c.mlp_hidden is not None and (not isinstance(c.mlp_hidden, int) or c.mlp_hidden <= 0):
        out.append(f"mlp_hidden={c.mlp_hidden!r} must be a positive integer or None for the default")
    for field, allowed in (
        ("activation", ACTIVATIONS),
        ("norm", NORMS),
        ("norm_position", NORM_POSITIONS),
        ("position", POSITIONS),
        ("attention", ATTENTION_KERNELS),
        ("remat", REMAT_POLICIES),
        ("dtype", DTYPES),
        ("param_dtype", DTYPES),
    ):
        one_of(field, allowed)
    if out:  # the divisibility checks below assume positive integers
        return out

    if c.d_model % c.n_head:
        out.append(f"d_model={c.d_model} is not divisible by n_head={c.n_head}; choose d_model as a multiple of n_head")
    if c.n_head % c.n_kv_head:
        out.append(
            f"n_head={c.n_head} is not divisible by n_kv_head={c.n_kv_head}; "
            "each key/value head must serve a whole group of query heads"
        )
    if c.position == "rope" and (c.d_model // c.n_head) % 2:
        out.append(
            f"head_dim={c.d_model // c.n_head} (d_model/n_head) is odd; RoPE rotates pairs of "
            "dimensions, so choose d_model and n_head giving an even head_dim"
        )
    if c.position == "sinusoidal" and c.d_model % 2:
        out.append(f"d_model={c.d_model} is odd; sinusoidal positions need an even d_model")
    if not 0.0 <= c.dropout < 1.0:
        out.append(f"dropout={c.dropout!r} must be in [0, 1)")
    for field in ("rope_theta", "norm_eps", "init_std"):
        if not getattr(c, field) > 0:
            out.append(f"{field}={getattr(c, field)!r} must be positive")
    if c.rope_scaling is not None:
        s = c.rope_scaling
        if c.position != "rope":
            out.append(f"rope_scaling is set but position={c.position!r}; set position='rope' or drop rope_scaling")
        if s.kind not in ROPE_SCALINGS:
            out.append(f"rope_scaling.kind={s.kind!r} is not one of {', '.join(map(repr, ROPE_SCALINGS))}")
        if not s.factor > 0:
            out.append(f"rope_scaling.factor={s.factor!r} must be positive")
        if s.kind == "yarn" and not (s.original_block_size or 0) > 0:
            out.append(
                f"rope_scaling.original_block_size={s.original_block_size!r}: YaRN needs the "
                "positive context length the model was trained with"
            )
    return out


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where text comes from and how it becomes tokens.

    source: builtin:python-docs | text:PATH | hf:NAME[:CONFIG] (see the module docstring).
    tokenizer: char | byte | gpt2 | r50k_base | cl100k_base | o200k_base.
    val_fraction: share of the token stream, taken from its end, held out for validation.
    text_column: the column holding text in .jsonl/.parquet files and Hub datasets.
    max_tokens: stop preparing after this many tokens (0: the whole corpus); for sampling a
        slice of a huge streamed corpus.
    cache_dir: where prepared token files live ("" means $JAXGPT_CACHE or ~/.cache/jaxgpt).
    """

    source: str = "builtin:python-docs"
    tokenizer: str = "char"
    val_fraction: float = 0.1
    text_column: str = "text"
    max_tokens: int = 0
    cache_dir: str = ""

    def __post_init__(self):
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={self.val_fraction} must be between 0 and 1 (exclusive)")
        if self.max_tokens < 0:
            raise ConfigError(f"data.max_tokens={self.max_tokens} must be >= 0 (0 means all)")


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
    checkpoint_every, keep_checkpoints: save every so many steps (and at the end), keeping
        the newest keep_checkpoints.
    seed: seeds initialisation, dropout and every batch.
    microbatches: split each batch into this many sequential microbatches and accumulate
        their gradients inside the compiled step (same result up to float32 summation order,
        less activation memory). 0 lets the run choose (jaxgpt/autotune.py): the fewest whose
        step fits the CPU's cache, or the accelerator's memory.
    dtype: compute dtype, "float32" or "bfloat16" (parameters and optimizer state stay
        float32: mixed precision).
    decay_embeddings: also apply weight decay to the token/position embeddings.
    init_from: start from Hugging Face weights (a directory, or a Hub name such as "gpt2")
        instead of a random init; the model section must describe the same architecture.
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
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    seed: int = 0
    microbatches: int = 0
    dtype: str = "float32"
    decay_embeddings: bool = False
    init_from: str = ""
    tensorboard: bool = True
    wandb_project: str = ""

    def __post_init__(self):
        problems = []
        for field in ("steps", "batch_size", "eval_every", "eval_batches", "log_every", "checkpoint_every"):
            if getattr(self, field) <= 0:
                problems.append(f"train.{field}={getattr(self, field)} must be positive")
        if self.keep_checkpoints <= 0:
            problems.append(f"train.keep_checkpoints={self.keep_checkpoints} must be positive")
        if self.microbatches < 0 or (self.microbatches and self.batch_size % self.microbatches):
            problems.append(
                f"train.batch_size={self.batch_size} is not divisible by train.microbatches={self.microbatches}; "
                "choose microbatches dividing the batch, or 0 to let the run choose"
            )
        if not self.lr > 0:
            problems.append(f"train.lr={self.lr} must be positive")
        if not 0 <= self.min_lr <= self.lr:
            problems.append(f"train.min_lr={self.min_lr} must be between 0 and train.lr={self.lr}")
        if not 0 <= self.warmup_steps < self.steps:
            problems.append(f"train.warmup_steps={self.warmup_steps} must be >= 0 and below train.steps={self.steps}")
        if self.decay_steps and not self.warmup_steps < self.decay_steps:
            problems.append(
                f"train.decay_steps={self.decay_steps} must be 0 (decay until train.steps) or above "
                f"train.warmup_steps={self.warmup_steps}"
            )
        for field in ("beta1", "beta2"):
            if not 0 <= getattr(self, field) < 1:
                problems.append(f"train.{field}={getattr(self, field)} must be in [0, 1)")
        for field in ("weight_decay", "grad_clip"):
            if getattr(self, field) < 0:
                problems.append(f"train.{field}={getattr(self, field)} must be >= 0")
        if self.dtype not in ("float32", "bfloat16"):
            problems.append(f"train.dtype={self.dtype!r} must be 'float32' or 'bfloat16'")
        if problems:
            raise ConfigError("invalid config: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The device mesh (see jaxgpt/sharding.py): sizes of the data, fsdp and tensor axes.
    -1 takes all the devices the other axes leave (at most one -1); the default puts every
    device on `data`. The product must divide the device count (a smaller mesh uses the first
    devices)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def shape(self, n_devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
            raise ConfigError(f"mesh {self._text()}: sizes must be positive, with at most one -1 (all the rest)")
        fixed = math.prod(s for s in sizes if s != -1)
        if n_devices % fixed:
            raise ConfigError(
                f"mesh {self._text()} does not divide the {n_devices} devices; choose sizes whose product divides "
                f"{n_devices} (mesh.data, mesh.fsdp, mesh.tensor)"
            )
        return tuple(n_devices // fixed if s == -1 else s for s in sizes)

    def _text(self) -> str:
        return f"data={self.data}, fsdp={self.fsdp}, tensor={self.tensor}"


# Set by the run, not by the config: compute dtype comes from train.dtype, and parameters are
# always stored in float32 for training (mixed precision).
_RUN_OWNED_MODEL_FIELDS = ("dtype", "param_dtype")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    mesh: MeshConfig = MeshConfig()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def base_config() -> ml_collections.ConfigDict:
    """Every key a config file may set, with its default; config files change some of them."""

    def section(cls, skip=()):
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            default = f.default
            if default is None and f.name != "rope_scaling":  # typed placeholders keep CLI overrides typed
                default = ml_collections.config_dict.placeholder(int)
            out[f.name] = default
        return ml_collections.ConfigDict(out)

    config = ml_collections.ConfigDict()
    config.model = section(ModelConfig, _RUN_OWNED_MODEL_FIELDS)
    config.model.vocab_size = ml_collections.config_dict.placeholder(int)  # from the tokenizer
    config.data = section(DataConfig)
    config.train = section(TrainConfig)
    config.mesh = section(MeshConfig)
    return config


def _checked_section(values: dict, cls, section: str, skip=()) -> dict:
    allowed = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    for key in values:
        if key not in allowed:
            guess = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {section}.{guess[0]}?" if guess else f"known keys: {', '.join(allowed)}"
            raise ConfigError(f"unknown config key {section}.{key}; {hint}")
    return values


def resolve(config, vocab_size: int | None = None, notes: list[str] | None = None) -> RunConfig:
    """A ConfigDict (or plain nested dict) -> validated RunConfig.

    model.vocab_size is taken from `vocab_size` (the tokenizer's) when the config leaves it
    unset; a config value smaller than the tokenizer's vocabulary is an error. A warmup as
    long as the run (a shipped config shortened with --config.train.steps) is clipped to a
    tenth of the run, and `notes` gets a line saying so.
    """
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for section in raw:
        if section not in ("model", "data", "train", "mesh"):
            raise ConfigError(f"unknown config section {section!r}; a config has model, data, train and mesh")
    model = dict(_checked_section(dict(raw.get("model", {})), ModelConfig, "model", _RUN_OWNED_MODEL_FIELDS))
    data = DataConfig(**_checked_section(dict(raw.get("data", {})), DataConfig, "data"))
    train_values = _checked_section(dict(raw.get("train", {})), TrainConfig, "train")
    train_values = _clip_warmup(train_values, notes if notes is not None else [])
    train = TrainConfig(**train_values)
    if model.get("vocab_size") is None:
        model["vocab_size"] = vocab_size or 1  # 1: a stand-in to validate the rest before the tokenizer exists
    elif vocab_size and model["vocab_size"] < vocab_size:
        raise ConfigError(
            f"model.vocab_size={model['vocab_size']} is smaller than the tokenizer's {vocab_size} tokens; "
            "leave it unset or raise it"
        )
    mesh = MeshConfig(**_checked_section(dict(raw.get("mesh", {})), MeshConfig, "mesh"))
    model = ModelConfig(**model, dtype=train.dtype, param_dtype="float32")
    return RunConfig(model, data, train, mesh)


def _clip_warmup(train: dict, notes: list[str]) -> dict:
    defaults = TrainConfig.__dataclass_fields__
    steps = train.get("steps", defaults["steps"].default)
    warmup = train.get("warmup_steps", defaults["warmup_steps"].default)
    if isinstance(steps, int) and isinstance(warmup, int) and steps > 0 and warmup >= steps:
        clipped = steps // 10
        notes.append(f"train.warmup_steps={warmup} is not shorter than train.steps={steps}; warming up for {clipped}")
        return train | {"warmup_steps": clipped}
    return train


def run_config_from_dict(d: dict) -> RunConfig:
    """Inverse of RunConfig.to_dict (reads a run's config.json)."""
    return RunConfig(
        ModelConfig(**d["model"]), DataConfig(**d["data"]), TrainConfig(**d["train"]), MeshConfig(**d.get("mesh", {}))
    )


# The fields that decide the parameters' shapes and meaning (not dropout, dtypes or layout).
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "block_size",
    "n_layer",
    "n_head",
    "n_kv_head",
    "d_model",
    "mlp_hidden",
    "activation",
    "norm",
    "norm_position",
    "norm_eps",
    "position",
    "rope_theta",
    "rope_scaling",
    "bias",
    "tie_embeddings",
)


# What a resumed run may change: how long it runs (raising steps also moves the end of the
# cosine schedule), the learning-rate schedule and clipping (the optimizer state does not
# depend on them), how often it logs, evaluates and saves, and how the same math is laid out
# (microbatches, attention kernel, rematerialisation). Anything else
# changes the model, the data or the batches, and a checkpoint of another run cannot continue it.
RESUMABLE_FIELDS = frozenset(
    {
        "train.steps",
        "train.lr",  # lowering the learning rate is the way on after a divergence
        "train.warmup_steps",
        "train.decay_steps",
        "train.grad_clip",
        "train.min_lr",
        "train.eval_every",
        "train.eval_batches",
        "train.log_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.microbatches",
        "train.tensorboard",
        "train.wandb_project",
        "model.attention",
        "model.remat",
        "data.cache_dir",
        "mesh.data",  # a checkpoint restores onto any device layout
        "mesh.fsdp",
        "mesh.tensor",
    }
)


def resume_conflicts(saved: dict, current: dict) -> list[str]:
    """'key: saved -> current' for every difference between two RunConfig dicts outside
    RESUMABLE_FIELDS."""
    conflicts = []
    for section in ("model", "data", "train", "mesh"):
        for key in sorted(set(saved.get(section, {})) | set(current.get(section, {}))):
            before, after = saved.get(section, {}).get(key), current.get(section, {}).get(key)
            if before != after and f"{section}.{key}" not in RESUMABLE_FIELDS:
                conflicts.append(f"{section}.{key}: {before!r} -> {after!r}")
    return conflicts
