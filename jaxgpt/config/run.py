"""What a run is: the model (jaxgpt/config/model.py), the data, the training and the device
mesh, each a frozen dataclass checked when it is built, and the checks that need two sections
at once (RunConfig)."""

from __future__ import annotations

import dataclasses
import math

from jaxgpt.config.model import ModelConfig
from jaxgpt.config.problems import ConfigError, Problems

# train.lab's measures (jaxgpt/lab/watch.py), those read on random tokens repeated twice first
LAB_MEASURES = ("induction", "previous_token", "dla", "entropy", "logit_lens", "norms", "probe")
HEAD_MEASURES = LAB_MEASURES[:4]  # a number per head; the rest one per layer


CHECKPOINT_SCHEDULES = ("", "log")


def lab_measures(lab: str) -> tuple[str, ...]:
    """train.lab's measures, in LAB_MEASURES' order ("all": every one)."""
    named = {m.strip() for m in lab.split(",") if m.strip()}
    return LAB_MEASURES if named == {"all"} else tuple(m for m in LAB_MEASURES if m in named)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where text comes from and how it becomes tokens.

    source: builtin:python-docs | builtin:repeated-random | text:PATH | hf:NAME[:CONFIG] (see
        jaxgpt/data/sources.py): a token stream cut into windows; or pairs:PATH | builtin:dates |
        builtin:reverse | builtin:sort (jaxgpt/data/pairs.py): examples of a source and its
        target, the loss on the target; or labels:PATH | builtin:brackets (jaxgpt/data/labels.py):
        texts and their labels, to classify (model.objective=classification); or chat:PATH.jsonl
        | builtin:arithmetic-chat (jaxgpt/data/conversations.py): conversations rendered by the chat template, the loss
        on the assistant's turns. builtin:arithmetic is sums written out, a stream to pretrain on.
    tokenizer: char | byte | gpt2 | r50k_base | cl100k_base | o200k_base, a folder holding the
        tokenizer.json `jaxgpt tokenizer` trained, or a run's workdir (the tokenizer it was
        trained with: a char vocabulary kept when fine-tuning on other text). A chat source adds
        the template's special tokens after it.
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
    loss_on: what a chat source's training scores: "assistant" (the assistant's turns and their
        end-of-turn tokens: the model is taught to answer, not to write the user's questions) or
        "all" (every token of the conversation, the ablation). Evaluation scores the assistant's
        turns either way, so the two are compared on the same tokens.
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
    loss_on: str = "assistant"

    def __post_init__(self):
        problems = Problems("data", self)
        problems.share("val_fraction")
        if not self.max_tokens >= 0:
            problems.add("max_tokens", "must be >= 0 (0 means all)")
        if not self.shard_tokens >= 1:
            problems.add("shard_tokens", "must be >= 1")
        for name in ("align_to_documents", "attend_within_documents"):
            if self.examples and getattr(self, name):
                problems.add(name, "cuts windows from a stream; this source packs whole examples already: drop it")
        problems.one_of("loss_on", LOSS_ON)
        if self.loss_on != "assistant" and not self.chat:
            problems.add("loss_on", "chooses which turns of a conversation are scored; only a chat source has turns")
        problems.raise_if_any()

    @property
    def kind(self) -> str:
        """What the source gives (source_kind): "pairs", "labels", "images", "chat" or "stream"."""
        return source_kind(self.source)

    pairs = property(lambda self: self.kind == "pairs", doc="(source, target) examples (jaxgpt/data/pairs.py)")
    labelled = property(lambda self: self.kind == "labels", doc="labelled texts, to classify (data/labels.py)")
    images = property(lambda self: self.kind == "images", doc="labelled images, for a ViT (jaxgpt/data/images.py)")
    chat = property(lambda self: self.kind == "chat", doc="conversations (jaxgpt/data/conversations.py)")

    @property
    def examples(self) -> bool:
        """Whether batches pack whole examples (pairs, conversations, labelled texts), the loss
        on what each scores, rather than cut windows from a stream."""
        return self.pairs or self.chat or self.labelled


# The sources that give examples rather than a token stream, by kind: each kind's prefix
# (pairs:PATH, labels:PATH, images:PATH, chat:PATH.jsonl; prompts:PATH is chat) and its builtin:NAME sources.
BUILTIN_SOURCES = {
    "pairs": ("dates", "reverse", "sort"),  # text pairs (jaxgpt/data/pairs.py)
    "labels": ("brackets",),  # labelled texts (jaxgpt/data/labels.py)
    "images": ("digits",),  # labelled images (jaxgpt/data/images.py)
    "chat": ("arithmetic-chat", "arithmetic-chat-3"),  # conversations (jaxgpt/data/conversations.py)
}
LOSS_ON = ("assistant", "all")


def source_kind(source: str) -> str:
    """A source's kind: "pairs", "labels", "images" or "chat" where it gives examples (by its
    prefix, or one of BUILTIN_SOURCES' builtin:NAME), "stream" for any other (text, a dataset,
    a token file, builtin:arithmetic's lines)."""
    prefix, _, rest = source.partition(":")
    if prefix in BUILTIN_SOURCES:
        return prefix
    if prefix == "prompts":  # prompts:PATH: a prompt and its answer a line, each a conversation of one turn
        return "chat"
    named = [kind for kind, names in BUILTIN_SOURCES.items() if prefix == "builtin" and rest in names]
    return named[0] if named else "stream"


@dataclasses.dataclass(frozen=True)
class Reinforcement:
    """Learning from rewards (train.rl; jaxgpt/data/rollouts.py): each step samples
    `samples` answers to each of `prompts` training prompts with the KV cache, scores each with
    `reward` on the host, and takes one policy-gradient step on the answers' tokens (GRPO, Shao
    et al. 2024: each answer's advantage is its reward minus its group's mean).

    samples: answers drawn for each prompt, the group its advantage is measured within (0 in
        a config file: no reinforcement learning).
    prompts: prompts a step; the step's batch is prompts x samples rows (train.batch_size is
        set to that).
    temperature, top_p: how the answers are drawn (jaxgpt/model/sampling.py).
    max_tokens: the longest answer, in tokens; one not finished by then scores as written.
    reward: "exact" (the answer is the reference, whitespace aside), "number" (the last number
        in the answer is the reference's within `tolerance`), "format" (the answer ends its
        turn and holds a number), or "module:function", your own reward(prompt, completion) ->
        float, called on the host with the prompt's and the answer's text, a batch at a time.
    tolerance: "number"'s, relative to the reference's size (0: equal).
    baseline: "group" (the group's mean reward subtracted: GRPO's, nanochat's), or "none"
        (the reward itself: REINFORCE with no baseline, the ablation).
    scale: divide each advantage by its group's standard deviation (GRPO's; Dr. GRPO leaves
        it out, Liu et al. 2025); with the group baseline only.
    kl: coefficient of the KL divergence to the run's starting model (train.init_from's
        weights, frozen), the k3 estimate per token (Schulman 2020), in the loss; 0 for none
        (it is measured, train_kl, either way).
    every_token: the loss on the prompt's tokens too (the ablation: the policy gradient on
        tokens the model did not choose).
    updates: optimizer steps taken on each batch of answers (GRPO's and PPO's mu), so a batch
        is sampled every `updates` steps. From the second on, the policy has moved from the one
        that sampled, and each token's loss is PPO's clipped surrogate (Schulman et al. 2017),
        -min(r A, clip(r, 1 - clip, 1 + clip) A) with r = pi / pi_sampling: an update cannot
        gain by moving a token's probability further than `clip` from where it was sampled.
        train.steps and train.checkpoint_every are whole batches: a run stops, and resumes, only
        between them.
    clip: PPO's epsilon (0.2 in PPO and GRPO), with updates > 1.
    turns: which of a training conversation's questions are prompts: "first", or "every" (each
        read after the conversation before it, its earlier answers the references: a chat model
        answers later turns too, and the held-out conversations score them; such prompts are
        longer, so raise `length` to fit them).
    draws: prompts drawn and answered a step (0: `prompts`). Where more, the groups whose
        answers' rewards all tie (every answer right, or every one wrong: no signal, and most of
        a good model's) are dropped and the step trains on the first `prompts` of the rest, topped
        up with tied groups where too few have a signal (DAPO's dynamic sampling, Yu et al. 2025,
        with a fixed number drawn): an update's answers carry what is to be learned.
    length: the positions of a row of the batch of answers, prompt and answer (0: model.block_size).
        A row holds one prompt and one answer, so rows as long as the longest of them cost an
        update no more than it needs (a sum asked and answered is about 45 of a 128-token
        context); prompts that leave fewer than max_tokens positions are left out.
    """

    samples: int = 8
    prompts: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    reward: str = "exact"
    tolerance: float = 0.0
    baseline: str = "group"
    scale: bool = True
    kl: float = 0.0
    every_token: bool = False
    updates: int = 1
    clip: float = 0.2
    turns: str = "first"
    draws: int = 0
    length: int = 0

    def __post_init__(self):
        problems = Problems("train.rl", self)
        problems.positive("samples", "prompts", "max_tokens", "updates", "clip")
        problems.not_negative("temperature", "tolerance", "kl", "length", "draws")
        if self.draws and self.draws < self.prompts:
            problems.add("draws", f"must be 0 or at least train.rl.prompts={self.prompts}: the groups kept are drawn")
        if self.length and self.length <= self.max_tokens:
            problems.add("length", f"must leave room for a prompt before train.rl.max_tokens={self.max_tokens}")
        if not 0 < self.top_p <= 1:
            problems.add("top_p", "must be in (0, 1]")
        problems.one_of("baseline", BASELINES)
        problems.one_of("turns", TURNS)
        if self.reward not in REWARDS and ":" not in self.reward:
            problems.add("reward", f"is one of {', '.join(REWARDS)}, or your own as module:function")
        if self.baseline == "group" and self.samples < 2:
            problems.add("samples", "must be at least 2: a group of one answer has its own reward as the baseline")
        problems.raise_if_any()


BASELINES = ("group", "none")
TURNS = ("first", "every")
REWARDS = ("exact", "number", "format")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The optimisation and its cadence.

    steps: optimizer steps in the run (raise it to extend a finished run).
    batch_size: sequences of model.block_size tokens per step.
    lr, min_lr: peak learning rate, reached after warmup_steps of linear warmup, then cosine
        decay to min_lr at decay_steps (Loshchilov & Hutter 2017), constant after.
    decay_steps: where the cosine ends; 0 means at `steps`. Extending a finished run with
        decay_steps set to its old length continues at min_lr instead of raising the rate.
    cooldown_steps: 0 for the cosine; else the rate stays at lr after the warmup and falls
        linearly to min_lr over the last cooldown_steps before decay_steps (warmup-stable-decay,
        as the modded-nanogpt speedrun trains; docs/speedrun.md has what it buys here).
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
    checkpoint_schedule: "log" also saves and keeps for good the checkpoints of steps 1, 2, 3, 4,
        6, 8, 11, 16, 23, ... (each about √2 times the last: many early, few late, where circuits
        form), for `jaxgpt evaluate --over_checkpoints`; "" for none.
    multiple_choice: also score the model on multiple-choice questions (a JSONL file of
        HellaSwag, ARC, PIQA or Winogrande questions, or hf:NAME[:SPLIT];
        jaxgpt/lab/multiple_choice.py) at the end, and every multiple_choice_every steps if that
        is not 0, on the first multiple_choice_limit of them (0: all); logged as
        multiple_choice_accuracy and multiple_choice_accuracy_norm.
    seed: seeds initialisation, dropout and every batch.
    microbatches: split each batch into this many sequential microbatches and accumulate
        their gradients inside the compiled step (same result up to float32 summation order,
        less activation memory). 0 lets the run choose (jaxgpt/hardware/step_choice.py): the fewest whose
        step fits the CPU's cache, or the accelerator's memory.
    one_program_for_cores: on a CPU whose cores share the batch (jaxgpt/hardware/core_parallel.py),
        compute their shares with one program over all the cores, compiled once, instead of a
        program per core: a fresh start compiles about a third less, but each step waits for the
        host's work between steps (3-10% slower steps at 4 unscanned layers): for short runs
        (docs/benchmarks.md, "What train.py does for speed").
    dtype: compute dtype, "float32" or "bfloat16" (parameters and optimizer state stay
        float32: mixed precision).
    decay_embeddings: also apply weight decay to the token/position embeddings.
    optimizer: "adamw", or "muon": Muon (Jordan et al. 2024; optax.contrib) for the blocks'
        matrices, whose momentum is orthogonalised by a Newton-Schulz iteration, at muon_lr
        (following the same warmup and cosine), with train.weight_decay; Adam (with Nesterov
        momentum, as optax's Muon has it) without weight decay at lr for everything else
        (embeddings, LM head, norms, biases).
    muon_lr, muon_momentum: Muon's peak learning rate and momentum (Nesterov).
    muon_momentum_warmup, muon_momentum_start: Muon's momentum rises linearly from
        muon_momentum_start to muon_momentum over the first muon_momentum_warmup steps (the
        modded-nanogpt speedrun's warmup: a shorter memory while the gradients change fast);
        0 holds it at muon_momentum from the first step.
    init_from: start from trained weights instead of a random init: a jaxgpt run's workdir
        (its newest checkpoint; the same tokenizer), or Hugging Face weights (a directory, or
        a Hub name such as "gpt2"). The model section must describe the same architecture,
        except that block_size may change where no parameter has its length (any position
        kind but learned) and rope_theta / rope_scaling may change: a context extension. A
        new run with a fresh optimizer, in its own workdir; config.json records the origin.
    init_step: with init_from a jaxgpt run, the step of the kept checkpoint to start from (a
        model caught partway through its training); 0 for its newest.
    lab: what the heads and layers do, measured at every evaluation on fixed probes (jaxgpt/lab/watch.py):
        comma-separated, of induction, previous_token, entropy, logit_lens, dla, norms, probe, or "all";
        logged as lab_<measure> (a list per block of a value per head, or a value per layer
        boundary). "" for none. A causal next-token decoder's, on plain text.
    tensorboard: also write the metrics as TensorBoard event files in <workdir>/tensorboard
        (`tensorboard --logdir runs`).
    wandb_project: also log to this Weights & Biases project ("" for none; needs
        `pip install wandb` and a login).
    rl: learning from rewards instead of from the data's text (Reinforcement; None: off).
    """

    steps: int = 2000
    batch_size: int = 12
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    decay_steps: int = 0
    cooldown_steps: int = 0
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
    checkpoint_schedule: str = ""
    multiple_choice: str = ""
    multiple_choice_every: int = 0
    multiple_choice_limit: int = 0
    seed: int = 0
    microbatches: int = 0
    one_program_for_cores: bool = False
    dtype: str = "float32"
    decay_embeddings: bool = False
    optimizer: str = "adamw"
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_momentum_warmup: int = 0
    muon_momentum_start: float = 0.85
    init_from: str = ""
    init_step: int = 0
    lab: str = ""
    tensorboard: bool = True
    wandb_project: str = ""
    rl: Reinforcement | None = None

    def __post_init__(self):
        if isinstance(self.rl, dict):
            object.__setattr__(self, "rl", Reinforcement(**self.rl))
        problems = Problems("train", self)
        problems.positive("steps", "batch_size", "eval_every", "eval_batches", "log_every", "checkpoint_every")
        problems.positive("keep_checkpoints", "lr")
        problems.one_of("checkpoint_schedule", CHECKPOINT_SCHEDULES)
        newest = "(0: init_from's newest checkpoint)"
        if problems.whole_number("init_step", newest) and self.init_step and not self.init_from:
            problems.add("init_step", "needs train.init_from, the run whose checkpoint of that step to start from")
        if unknown := sorted({m.strip() for m in self.lab.split(",") if m.strip()} - {*LAB_MEASURES, "all"}):
            problems.add("lab", f"names {', '.join(unknown)}; choose from {', '.join(LAB_MEASURES)}, or all")
        if self.microbatches < 0 or (self.microbatches and self.batch_size % self.microbatches):
            problems.add(
                "microbatches",
                f"does not divide train.batch_size={self.batch_size}; choose microbatches dividing the batch, or 0 to "
                "let the run choose",
            )
        self._check_schedule(problems)
        problems.below_one("beta1", "beta2", "muon_momentum", "muon_momentum_start")
        if self.rl and self.rl.updates > 1:  # a run stops and resumes between batches of answers alone
            for name in ("steps", "checkpoint_every"):
                if getattr(self, name) % self.rl.updates:
                    problems.add(name, f"must be a multiple of train.rl.updates={self.rl.updates}: a step's batch of "
                                 "answers is sampled at the first of its updates, and a run resumes there")  # fmt: skip
            if self.checkpoint_schedule:
                problems.add("checkpoint_schedule", f"must be empty with train.rl.updates={self.rl.updates}")
        problems.not_negative("weight_decay", "grad_clip", "multiple_choice_every", "multiple_choice_limit")
        problems.not_negative("muon_momentum_warmup")
        if self.multiple_choice_every and not self.multiple_choice:
            problems.add("multiple_choice_every", "scores questions from train.multiple_choice, which is empty: set it")
        problems.one_of("dtype", ("float32", "bfloat16"))
        problems.one_of("optimizer", ("adamw", "muon"))
        problems.positive("muon_lr")
        problems.raise_if_any()

    def _check_schedule(self, problems: Problems) -> None:
        """The learning rate's schedule: warmup, decay and cooldown within the run's steps."""
        if not 0 <= self.min_lr <= self.lr:
            problems.add("min_lr", f"must be between 0 and train.lr={self.lr}")
        if not 0 <= self.warmup_steps < self.steps:
            problems.add("warmup_steps", f"must be >= 0 and below train.steps={self.steps}")
        if self.decay_steps and not self.warmup_steps < self.decay_steps:
            problems.add(
                "decay_steps", f"must be 0 (decay until train.steps) or above train.warmup_steps={self.warmup_steps}"
            )
        decay_end = self.decay_steps or self.steps
        if not 0 <= self.cooldown_steps <= decay_end - self.warmup_steps:
            problems.add(
                "cooldown_steps",
                f"must be between 0 (a cosine decay) and {decay_end - self.warmup_steps}, the steps between the "
                f"warmup's end ({self.warmup_steps}) and the decay's ({decay_end})",
            )


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

    @property
    def row_length(self) -> int:
        """The positions of a row of a training batch: model.block_size, or train.rl.length."""
        return (self.train.rl.length if self.train.rl else 0) or self.model.block_size

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
        if self.model.encoder_layers and self.data.chat:
            raise ConfigError(
                f"model.encoder_layers={self.model.encoder_layers} gives the model an encoder, and a chat source's "
                "conversations are read by a decoder alone; set model.encoder_layers=0"
            )
        if (self.data.labelled or self.data.images) != (self.model.objective == "classification"):
            raise ConfigError(
                f"data.source={self.data.source!r} and model.objective={self.model.objective!r}: labelled texts "
                "(labels:PATH, builtin:brackets) or images (images:PATH, builtin:digits) train a classifier and a "
                "classifier needs them; set both or neither"
            )
        if self.data.images != bool(self.model.patch_size):
            raise ConfigError(
                f"data.source={self.data.source!r} and model.patch_size={self.model.patch_size}: images are read in "
                "patches (model.patch_size > 0, a Vision Transformer) and patches are cut from images; set both or "
                "neither (configs/vit_digits.py)"
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
        if self.train.rl and self.row_length > self.model.block_size:
            raise ConfigError(
                f"train.rl.length={self.train.rl.length} is longer than model.block_size={self.model.block_size}; "
                "lower it (0: the block size)"
            )
        if self.train.rl and not (self.data.chat and self.model.objective == "next_token"):
            raise ConfigError(
                f"train.rl samples answers to a chat source's prompts, and data.source={self.data.source!r} with "
                f"model.objective={self.model.objective!r} is not a decoder trained on conversations; give it "
                "builtin:arithmetic-chat, chat:PATH or prompts:PATH (configs/rl_arithmetic.py)"
            )
        heads_measured = [m for m in lab_measures(self.train.lab) if m in HEAD_MEASURES]
        if heads_measured and self.model.token_mixer != "attention":
            raise ConfigError(
                f"train.lab={self.train.lab!r} measures heads ({', '.join(heads_measured)}), and "
                f"model.token_mixer={self.model.token_mixer!r} has none; measure its layers alone "
                "(train.lab=logit_lens,norms,probe)"
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
