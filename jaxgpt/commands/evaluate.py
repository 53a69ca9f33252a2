"""Loss against position and context length: python -m jaxgpt evaluate --workdir DIR [--workdir DIR ...]

Examples:
  python -m jaxgpt evaluate --workdir runs/tiny --workdir runs/llama_tiny --lengths 64,128,256,512 \\
      --out docs/images/loss_by_position.png
  python -m jaxgpt evaluate --workdir runs/llama_tiny --workdir runs/llama_tiny_yarn512 --lengths 128,512
  python -m jaxgpt evaluate --workdir runs/tiny --mask_heads
  python -m jaxgpt evaluate --workdir runs/tiny --remove_heads 0.1,3.2
  python -m jaxgpt evaluate --workdir runs/tiny --prune 0.25
  python -m jaxgpt evaluate --workdir runs/tiny --prune 0.25 --out runs/tiny_pruned
  python -m jaxgpt evaluate --workdir runs/tiny --induction
  python -m jaxgpt evaluate --workdir runs/tiny --over_checkpoints --lab induction,entropy
  python -m jaxgpt evaluate --workdir runs/sft_arithmetic --workdir runs/rl_arithmetic --pass_at 8

The same stretch of each run's validation text (its first --tokens tokens) is cut into
back-to-back windows of each length, and each window is scored in one forward pass: the loss
at every position, averaged over the windows. A model that uses its context predicts better
the further into a window it is; one whose positions do not carry past the length it trained
at (model.block_size) gets worse beyond it. Learned position embeddings have no row past
block_size, so longer lengths are refused for those runs, with that reason; RoPE, sinusoidal,
ALiBi and no positions at all are evaluated at any length.

A run trained on text pairs (data.source pairs:PATH or builtin:dates) is scored on every
held-out pair instead: the loss on the answers, the share of their tokens right, and the share
of answers greedy decoding writes exactly. With --pass_at K a run trained on conversations (or
from rewards) also answers its held-out first questions (--turns every: every turn's question, after
the turns before it) K times at --temperature and once greedily, scored by its train.rl.reward:
pass@1 ... pass@K (jaxgpt/lab/pass_at_k.py).

Prints a row per run and length (the loss within the trained length and beyond it) and draws
loss against position at each run's longest length beside mean loss against length, one
colour per run.

--mask_heads instead scores windows of block_size once with every attention head and once
with each head removed (its output zeroed), and prints the loss increase per layer and head.
--remove_heads LAYER.HEAD,... scores them with that set removed at once; --prune FRACTION
removes that share of the heads greedily, each time the one whose removal raises the loss
least, and prints the order and the loss before and after; with --out DIR it cuts the same
number of heads out of every layer's weights and writes the smaller model to DIR, a run folder
that train.py fine-tunes with --config.train.init_from=DIR (jaxgpt/lab/pruning.py). --induction prints each head's
induction score (jaxgpt/lab/capture.py): on n random tokens repeated twice, the attention each token
of the second copy pays to the token after its first occurrence; 1 is a perfect induction head,
and attention spread evenly over the tokens a query sees scores the mean of 1/(t + 1) over the
second copy's positions t, about ln(2) / n (0.043 for the n = 16 the command prints at).

--over_checkpoints takes train.lab's measures (--lab, jaxgpt/lab/watch.py) at every kept
checkpoint of a run that did not log them, on the probes its training would have used (its seed,
its validation split: where it did log them, the same numbers), prints a line a checkpoint and
writes them to <workdir>/lab_over_checkpoints.jsonl, which `jaxgpt timeline` draws. A run trained
with train.checkpoint_schedule=log keeps many early checkpoints and few late ones for it.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import matplotlib
import numpy as np
from absl import flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxgpt.commands import cli  # noqa: E402
from jaxgpt.commands.plot import DPI, SIZE_INCHES, save_png  # noqa: E402
from jaxgpt.config import ModelConfig  # noqa: E402
from jaxgpt.errors import UserError  # noqa: E402

LOGITS_BYTES = 2**28  # windows scored at once: their float32 logits stay under 256 MiB


@dataclasses.dataclass(frozen=True)
class LengthResult:
    length: int
    windows: int
    by_position: np.ndarray  # (length,) mean loss in nats at each position

    def mean(self, start: int = 0, stop: int | None = None) -> float:
        part = self.by_position[start:stop]
        return float(part.mean()) if part.size else float("nan")


def refusal(model: ModelConfig, length: int, split_tokens: int) -> str | None:
    """Why `length` cannot be evaluated for this model and split, or None."""
    if model.position == "learned" and length > model.block_size:
        return (
            f"learned position embeddings have no row past block_size={model.block_size}, so no length "
            f"above it can be scored (train with position=rope, sinusoidal, alibi or none to measure that)"
        )
    if split_tokens < length + 1:
        return f"the validation split has {split_tokens} tokens, fewer than a window of {length} + 1"
    return None


@functools.cache
def scorer(model: ModelConfig):
    """The loss at each position of a batch of windows, under a head mask (n_layer, n_head),
    jitted once per model."""
    from jaxgpt.lab.activations import interventions_collection, removed_heads
    from jaxgpt.model.transformer import GPT
    from jaxgpt.training.train_step import token_losses

    def score(params, batch, keep):
        removed = interventions_collection(model, removed_heads(model, keep))
        return token_losses(GPT(model), params, batch, interventions=removed)

    return jax.jit(score)


@dataclasses.dataclass(frozen=True)
class ValidationText:
    """A run's validation tokens, with where its documents begin for a run trained to attend
    within them (data.attend_within_documents), so its windows are scored as it was trained."""

    tokens: np.ndarray
    documents: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def windows(self, starts: list[int], length: int) -> dict[str, np.ndarray]:
        from jaxgpt.data.batches import windows_at

        return windows_at(self.tokens, np.asarray(starts), length, self.documents)


def losses_by_position(
    model: ModelConfig, params, tokens, length: int, budget: int, keep: np.ndarray | None = None
) -> LengthResult:
    """The mean loss at each position of the back-to-back windows of `length` + 1 tokens that
    fit in the first `budget` tokens of `tokens` (an array, or a ValidationText; at least one
    window); keep (n_layer, n_head) zeroes the heads marked 0 (default: every head kept)."""
    from jaxgpt.model.kernels import kernel_fallback

    text = tokens if isinstance(tokens, ValidationText) else ValidationText(np.asarray(tokens))

    windows = max(1, min(budget, len(tokens) - 1) // length)
    model = model.replace(
        dtype="float32", remat="none", attention=kernel_fallback(model.attention, jax.default_backend(), training=False)
    )
    keep = np.ones((model.n_layer, model.n_head), np.float32) if keep is None else keep
    rows = max(1, min(windows, LOGITS_BYTES // (length * model.vocab_size * 4)))
    totals = np.zeros(length)
    for first in range(0, windows, rows):
        starts = [i * length if i < windows else 0 for i in range(first, first + rows)]
        # the last group is filled up with the first window, so every call has one shape; only
        # the real windows are counted
        counted = min(rows, windows - first)
        totals += np.asarray(scorer(model)(params, text.windows(starts, length), keep))[:counted].sum(axis=0)
    return LengthResult(length, windows, totals / windows)


def without_each_head(model: ModelConfig, params, tokens: np.ndarray, budget: int) -> tuple[float, np.ndarray]:
    """(loss with every head, (n_layer, n_head) loss with that one head removed), over windows
    of block_size: how much the model leans on each head."""
    full = losses_by_position(model, params, tokens, model.block_size, budget).mean()
    losses = np.zeros((model.n_layer, model.n_head))
    for layer, head in np.ndindex(*losses.shape):
        keep = np.ones_like(losses, np.float32)
        keep[layer, head] = 0
        losses[layer, head] = losses_by_position(model, params, tokens, model.block_size, budget, keep).mean()
    return full, losses


def without_heads(model: ModelConfig, params, tokens: np.ndarray, budget: int, removed) -> float:
    """The loss over windows of block_size with the heads `removed` ((layer, head) pairs) zeroed."""
    keep = np.ones((model.n_layer, model.n_head), np.float32)
    for layer, head in removed:
        keep[layer, head] = 0
    return float(losses_by_position(model, params, tokens, model.block_size, budget, keep).mean())


def prune_greedily(
    model: ModelConfig, params, tokens: np.ndarray, budget: int, fraction: float, per_layer: int | None = None
) -> list[tuple]:
    """Remove round(fraction x heads) heads one at a time, each time the one whose removal
    (beside those already removed) raises the loss least: [((layer, head), loss after), ...].
    per_layer: instead, exactly that many from every layer (a layer that has given its share
    offers no more)."""
    removed: list[tuple] = []
    count = per_layer * model.n_layer if per_layer else round(fraction * model.n_layer * model.n_head)
    for _ in range(count):
        taken = [r for r, _ in removed]
        full = {layer for layer in range(model.n_layer) if per_layer and sum(r[0] == layer for r in taken) == per_layer}
        left = [h for h in np.ndindex(model.n_layer, model.n_head) if h not in taken and h[0] not in full]
        scored = [(h, without_heads(model, params, tokens, budget, [r for r, _ in removed] + [h])) for h in left]
        removed.append(min(scored, key=lambda item: item[1]))
    return removed


def write_pruned_run(out: Path, run, params: dict, tokenizer, step: int, pruned_from: dict) -> Path:
    """A run folder at `out` (new or empty) holding the smaller model's weights alone, as step
    `step` (the source's), with its config, tokenizer and what was cut (`pruned_from`)."""
    import json

    from jaxgpt.job.checkpoint import Checkpoints
    from jaxgpt.job.resume import WEIGHTS_ONLY, checkpoint_record
    from jaxgpt.job.workdir import make
    from jaxgpt.tokenizers import save_tokenizer

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not an empty folder; give a new folder for the pruned run")
    make(out)
    (out / "config.json").write_text(json.dumps(run.to_dict(), indent=2))
    save_tokenizer(tokenizer, out / "tokenizer.json")
    record = checkpoint_record(step, 0.0, [], run, tokenizer) | {WEIGHTS_ONLY: True, "pruned_from": pruned_from}
    checkpoints = Checkpoints(out / "checkpoints", keep=1)
    try:
        checkpoints.save(step, {"params": params}, record)
        checkpoints.wait()
    finally:
        checkpoints.close()
    return out


def parse_heads(text: str, model: ModelConfig) -> list[tuple[int, int]]:
    """'0.1,3.2' -> [(0, 1), (3, 2)], or one line naming what is wrong."""
    heads = []
    for item in filter(None, text.split(",")):
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise UserError(f"--remove_heads {item!r} is not LAYER.HEAD (e.g. 0.1 for layer 0's head 1)")
        if int(layer) >= model.n_layer or int(head) >= model.n_head:
            raise UserError(
                f"--remove_heads {item}: the model has layers 0-{model.n_layer - 1} of heads 0-{model.n_head - 1}"
            )
        heads.append((int(layer), int(head)))
    if not heads:
        raise UserError("--remove_heads names no head; give LAYER.HEAD,... (e.g. 0.1,3.2)")
    return heads


def induction_lines(name: str, workdir: Path, step: int | None) -> list[str]:
    """Each head's induction score, a row per layer, and the strongest head."""
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab.capture import model_induction_scores

    run, params, _, _ = load_latest(workdir, step=step)
    if reason := headless(run.model):
        raise UserError(f"{workdir}: {reason}")
    scores = model_induction_scores(run.model, params)
    half = min(run.model.block_size // 2, 64)
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    chance = np.log(2) / half
    lines = [
        f"{name}: induction score per head on {half} random tokens repeated (1: perfect; chance about {chance:.3f})"
    ]
    lines.append("layer " + "".join(f"{f'head {h}':>9}" for h in range(scores.shape[1])))
    lines += [f"{i:>5} " + "".join(f"{x:>9.3f}" for x in row) for i, row in enumerate(scores)]
    return lines + [f"strongest: layer {layer} head {head}, {scores[layer, head]:.3f}"]


def removal_lines(name: str, workdir: Path, f) -> list[str]:
    """--remove_heads or --prune on one run, as printed."""
    run, params, _, val = load_run(workdir, f.step, budget=f.tokens)
    if reason := refusal(run.model, run.model.block_size, len(val)) or headless(run.model):
        raise UserError(f"{workdir}: {reason}")
    full = without_heads(run.model, params, val, f.tokens, [])
    if f.remove_heads is not None:
        heads = parse_heads(f.remove_heads, run.model)
        loss = without_heads(run.model, params, val, f.tokens, heads)
        named = ", ".join(f"{layer}.{head}" for layer, head in heads)
        return [f"{name}: loss {full:.4f} with every head, {loss:.4f} without {named} ({loss - full:+.4f})"]
    if not 0 < f.prune < 1:
        raise UserError(f"--prune {f.prune} is not a share of the heads; give one between 0 and 1 (e.g. 0.25)")
    per_layer = None
    if f.out is not None:
        from jaxgpt.lab import pruning

        if reason := pruning.refusal(run.model):
            raise UserError(f"{workdir}: --prune --out cannot cut heads out of its weights: {reason}")
        per_layer = pruning.per_layer_share(run.model, f.prune)
    pruned = prune_greedily(run.model, params, val, f.tokens, f.prune, per_layer)
    total = run.model.n_layer * run.model.n_head
    order = ", ".join(f"{layer}.{head} ({loss - full:+.4f})" for (layer, head), loss in pruned)
    after = pruned[-1][1] if pruned else full
    lines = [
        f"{name}: pruned {len(pruned)} of {total} heads, the least useful first"
        + (f" ({per_layer} a layer)" if per_layer else "")
        + f": {order}",
        f"{name}: loss {full:.4f} with every head -> {after:.4f} without them ({after - full:+.4f})",
    ]
    if f.out is not None:
        lines += saved_pruned_lines(name, workdir, f, run, params, val, [head for head, _ in pruned], after)
    return lines


def saved_pruned_lines(name: str, workdir: Path, f, run, params, val, removed: list, masked_loss: float) -> list[str]:
    """The heads `removed` cut out of the weights and the smaller run written to --out, with its
    size and its own loss (the masked model's, to float rounding: checked)."""
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab import pruning
    from jaxgpt.model.transformer import count_params

    _, _, tokenizer, step = load_latest(workdir, step=f.step, warn=lambda _: None)
    smaller, cut = pruning.pruned_params(run.model, jax.device_get(params), removed)
    loss = without_heads(smaller, cut, val, f.tokens, [])
    if not abs(loss - masked_loss) <= 1e-4 * max(1.0, abs(masked_loss)):
        raise AssertionError(f"the pruned model's loss {loss:.6f} is not the masked model's {masked_loss:.6f}")
    pruned_from = {"workdir": str(workdir), "step": step, "removed": [f"{layer}.{head}" for layer, head in removed]}
    smaller_run = dataclasses.replace(run, model=smaller)
    out = write_pruned_run(Path(f.out), smaller_run, cut, tokenizer, step, pruned_from)
    before, now = count_params(params), count_params(cut)
    return [
        f"{name}: the pruned model's own loss {loss:.4f}; {run.model.n_head} -> {smaller.n_head} heads a layer, "
        f"{before:,} -> {now:,} parameters ({now / before - 1:+.1%})",
        f"wrote {out} (weights alone; fine-tune it: python train.py --config ... --config.train.init_from={out} "
        "--workdir NEW_DIR)",
    ]


def head_table(name: str, full: float, losses: np.ndarray) -> list[str]:
    """The loss increase when each head is removed, a row per layer, a column per head."""
    lines = [f"{name}: loss {full:.4f} with every head; the increase with one head removed:"]
    lines.append("layer " + "".join(f"{f'head {h}':>9}" for h in range(losses.shape[1])))
    lines += [f"{layer:>5} " + "".join(f"{x - full:>+9.4f}" for x in row) for layer, row in enumerate(losses)]
    return lines


def lab_over_checkpoints(workdir: Path, lab: str, say=print) -> Path:
    """train.lab's measures `lab` at each kept checkpoint, said a line each and written to
    <workdir>/lab_over_checkpoints.jsonl (a record a step)."""
    import json

    from jaxgpt import data
    from jaxgpt.job.checkpoint import Checkpoints, load_latest
    from jaxgpt.lab.watch import Watch, refusal

    steps = Checkpoints(workdir / "checkpoints", read_only=True).steps() if (workdir / "checkpoints").is_dir() else []
    if not steps:
        raise UserError(f"no checkpoints in {workdir}; train first (python train.py --config ... --workdir {workdir})")
    run, _, _, _ = load_latest(workdir, step=steps[-1], warn=say)
    if why := refusal(dataclasses.replace(run, train=dataclasses.replace(run.train, lab=lab))):
        raise UserError(f"{workdir}: {why}")
    watch = Watch(run.model, lab, run.train.seed, np.asarray(data.prepare(run.data, progress=False).val))
    out = workdir / "lab_over_checkpoints.jsonl"
    with cli.writing(out), out.open("w") as file:
        for step in steps:
            _, params, _, _ = load_latest(workdir, step=step, warn=say)
            record = {"step": step} | watch.measure(params)
            file.write(json.dumps(record) + "\n")
            shown = [f"{name} {np.max(record['lab_' + name]):.3f}" for name in watch.names if name in PER_HEAD_NAMES]
            say(f"{workdir.name} step {step}: " + (", ".join(f"best {s}" for s in shown) or "measured"))
    return out


PER_HEAD_NAMES = ("induction", "previous_token", "dla", "entropy")


def load_run(workdir: Path, step: int | None, say=print, budget: int | None = None):
    """(run config, parameters, step, validation text) of a workdir's checkpoint; says so
    where the split holds fewer than the `budget` tokens asked to be scored."""
    from jaxgpt import data
    from jaxgpt.job.checkpoint import load_latest

    run, params, _, step = load_latest(workdir, step=step, warn=say)
    cli.refuse_unless_served(
        run.model,
        "evaluate",
        workdir,
        "it has no next-token loss to score by position (its val_loss is the masked-token loss)",
    )
    dataset = data.prepare(run.data, progress=False)
    val = ValidationText(np.asarray(dataset.val), data.validation_documents(dataset, run))
    if budget is not None and len(val) - 1 < budget:
        say(f"{workdir}: the validation split has {len(val):,} tokens, fewer than --tokens {budget:,}; all are scored")
    return run, params, step, val


def answers_line(name: str, workdir: Path, step: int | None, say=print) -> str:
    """A run trained on text pairs or conversations (jaxgpt/data/pairs.py, conversations.py),
    scored on every held-out one: the loss on the answers (a conversation's: the assistant's
    turns), the share of their tokens right, and the share written exactly right by greedy
    decoding (every answer token the most likely: objectives.exact_matches)."""
    from jaxgpt import data
    from jaxgpt.data.batches import example_splits
    from jaxgpt.data.pairs import pair_validation
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.job.trainer import mean_losses
    from jaxgpt.model.transformer import GPT
    from jaxgpt.training.train_step import eval_step

    run, params, _, step = load_latest(workdir, step=step, warn=say)
    dataset = data.prepare(run.data, progress=False)
    _, held_out = example_splits(dataset, run)
    seq_len, rows = run.model.block_size, 16
    encoder = bool(run.model.encoder_layers)
    validation = pair_validation(held_out, dataset.tokenizer.token_bytes(), seq_len, rows, len(held_out), encoder)
    model = GPT(run.model.replace(dtype="float32", remat="none"))
    score = jax.jit(lambda p, b: eval_step(p, b, model=model))
    first = range(0, validation.batches * rows, rows)
    got = mean_losses([score(params, {k: x[i : i + rows] for k, x in validation.rows.items()}) for i in first])
    line = (
        f"{name}: step {step}, {int(got['examples']):,} held-out {validation.kind}: answer loss {got['loss']:.4f}, "
        f"{got['accuracy']:.1%} of answer tokens and {got['exact_matches'] / got['examples']:.1%} of answers "
        "exactly right (greedy decoding)"
    )
    if not encoder:
        return line
    by_length = exact_by_source_length(model, params, validation.rows, rows)
    cells = ", ".join(f"{length}: {right / count:.0%} of {count}" for length, (right, count) in by_length.items())
    return line + f"\n{name}: exactly right by source length (tokens before its end): {cells}"


def pass_at_line(name: str, workdir: Path, f) -> str:
    """pass@1 ... pass@k of a chat run's model on its held-out first questions (--turns every:
    every turn's, as train.rl.turns=every asks them), scored by its
    train.rl.reward (exact, for a run trained without one): jaxgpt/lab/pass_at_k.py."""
    from jaxgpt import data
    from jaxgpt.data.batches import example_splits
    from jaxgpt.data.conversations import END
    from jaxgpt.data.rollouts import questions
    from jaxgpt.job.checkpoint import load_latest
    from jaxgpt.lab import pass_at_k
    from jaxgpt.model.sampling import decoding_model
    from jaxgpt.training.rewards import reward_function

    run, params, tokenizer, step = load_latest(workdir, step=f.step)
    if not run.data.chat:
        raise UserError(f"--pass_at samples answers to conversations' questions, and {workdir} was not trained on any")
    if f.pass_at < 1 or f.prompts < 1:
        raise UserError(f"--pass_at {f.pass_at} and --prompts {f.prompts} must be at least 1")
    _, held_out = example_splits(data.prepare(run.data, progress=False), run)
    rl = run.train.rl
    reward, max_tokens = (rl.reward, rl.max_tokens) if rl else ("exact", 32)
    prompts = questions(held_out, tokenizer, run.model.block_size + 1 - max_tokens, every_turn=f.turns == "every")
    got = pass_at_k.measure(
        decoding_model(run.model), params, tokenizer, prompts[: f.prompts],
        reward_function(reward, rl.tolerance if rl else 0.0), samples=f.pass_at, temperature=f.temperature,
        passing=f.passing, max_tokens=max_tokens, end=tokenizer.special_ids[END], seed=run.train.seed,
    )  # fmt: skip
    which = "first questions" if f.turns == "first" else "questions of every turn (each after the turns before it)"
    asked = f"{got.prompts:,} held-out {which}, {got.samples} answers each at temperature {f.temperature:g}"
    passes = ", ".join(f"pass@{k} {v:.1%}" for k, v in got.pass_at.items())
    said = [passes, f"greedy {got.greedy:.1%}", f"mean reward {got.mean_reward:.3f}", f"{got.answer_tokens:.1f} tokens"]
    return f"{name}: step {step}, {asked} ({reward} reward, passing at {f.passing:g}): " + "; ".join(said)


def exact_by_source_length(model, params, rows: dict, batch: int) -> dict[int, tuple[int, int]]:
    """{source length: (answers exactly right, answers)} over an encoder–decoder's packed
    validation rows: an answer is right where every scored token of its segment is the most
    likely one (what greedy decoding writes, each token given the right ones before it), and
    its source is the same segment on the encoder's side, less the end token."""
    from jaxgpt.training.batch import MODEL_INPUTS

    def predict(p, b):
        return model.apply({"params": p}, b["inputs"], **{k: b[k] for k in MODEL_INPUTS if k in b}).argmax(-1)

    predict = jax.jit(predict)
    tally: dict[int, list[int]] = {}
    for first in range(0, len(rows["inputs"]), batch):
        part = {k: x[first : first + batch] for k, x in rows.items()}
        right = np.asarray(predict(params, part)) == part["targets"]
        for r, segments in enumerate(part["segments"]):
            scored = part["weights"][r] > 0
            for segment in set(segments[scored].tolist()):
                mine = scored & (segments == segment)
                length = int((part["source_segments"][r] == segment).sum()) - 1
                counts = tally.setdefault(length, [0, 0])
                counts[0] += bool(right[r][mine].all())
                counts[1] += 1
    return {length: tuple(tally[length]) for length in sorted(tally)}


def evaluate_run(workdir: Path, lengths: list[int], budget: int, step: int | None, say=print):
    """(run config, step, results by length) of one workdir; refused lengths are said, skipped."""
    run, params, step, val = load_run(workdir, step, say, budget)
    results, skipped = [], {}
    for length in lengths:
        if reason := refusal(run.model, length, len(val)):
            skipped.setdefault(reason, []).append(str(length))
            continue
        results.append(losses_by_position(run.model, params, val, length, budget))
    for reason, which in skipped.items():
        say(f"{workdir}: length{'s' * (len(which) > 1)} {', '.join(which)} skipped: {reason}")
    if not results:
        raise UserError(f"no length of {lengths} can be evaluated for {workdir}; see the lines above")
    return run, step, results


def heads_of_run(workdir: Path, budget: int, step: int | None) -> tuple[float, np.ndarray]:
    run, params, _, val = load_run(workdir, step, budget=budget)
    if reason := refusal(run.model, run.model.block_size, len(val)) or headless(run.model):
        raise UserError(f"{workdir}: {reason}")
    return without_each_head(run.model, params, val, budget)


def headless(model: ModelConfig) -> str | None:
    """Why a head's measure cannot be taken of `model`, or None: a convolution has no heads."""
    if model.token_mixer != "attention":
        return f"its blocks mix positions by model.token_mixer={model.token_mixer!r}, which has no heads to measure"
    return None


def table(rows: list[tuple[str, int, int, LengthResult]]) -> list[str]:
    """rows: (run name, step, block_size, result) -> aligned lines."""
    width = max(len("run"), *(len(name) for name, *_ in rows))
    heading = f"{'step':>6}  {'length':>6}  {'windows':>7}  {'loss':>6}  {'<= block':>8}  {'> block':>7}"
    lines = [f"{'run':{width}}  {heading}"]
    for name, step, block, result in rows:
        beyond = result.mean(block)
        lines.append(
            f"{name:{width}}  {step:>6}  {result.length:>6}  {result.windows:>7}  {result.mean():>6.3f}  "
            f"{result.mean(0, block):>8.3f}  " + (f"{beyond:>7.3f}" if not np.isnan(beyond) else f"{'-':>7}")
        )
    return lines


def smoothed(by_position: np.ndarray, bins: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Means over log-spaced bins of positions: the early positions keep their detail, the
    later ones are averaged over more windows' noise."""
    edges = np.unique(np.geomspace(1, len(by_position) + 1, bins + 1).astype(int)) - 1
    middles = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    means = [by_position[a:b].mean() for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return np.asarray(middles), np.asarray(means)


def draw(runs: list[tuple[str, int, list[LengthResult]]], out: Path) -> Path:
    """runs: (name, block_size, results)."""
    figure, (by_position, by_length) = plt.subplots(1, 2, figsize=SIZE_INCHES, dpi=DPI)
    for i, (name, block, results) in enumerate(runs):
        colour = f"C{i % 10}"
        longest = results[-1]
        positions, losses = smoothed(longest.by_position)
        by_position.plot(positions + 1, losses, color=colour, label=f"{name} (length {longest.length})")
        by_position.axvline(block, color=colour, linestyle=":", alpha=0.6)
        by_length.plot([r.length for r in results], [r.mean() for r in results], "o-", color=colour, label=name)
    by_position.set_xscale("log", base=2)
    by_position.set_xlabel("tokens of context: position + 1 (dotted: the run's block_size)")
    by_length.set_xscale("log", base=2)
    by_length.set_xlabel("window length")
    for axes in (by_position, by_length):
        axes.set_ylabel("validation loss (nats per token)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    by_position.set_title("by position, in each run's longest windows", fontsize="small")
    by_length.set_title("mean over the window, by its length", fontsize="small")
    figure.suptitle("loss on the same validation text cut into windows of each length")
    return save_png(figure, out)


def _lengths(text: list[str]) -> list[int]:
    try:
        lengths = sorted({int(part) for part in text})
    except ValueError:
        raise UserError(f"--lengths {','.join(text)!r} is not a comma-separated list of whole numbers") from None
    if not lengths or lengths[0] < 1:
        raise UserError(f"--lengths {','.join(text)!r}: every length must be at least 1")
    return lengths


def trained_on_examples(workdir: Path) -> bool:
    """Whether the run's config.json names a pairs or chat source (without one, the checkpoint's
    own record is read later, and the run is evaluated as a stream)."""
    import json

    from jaxgpt.config import source_kind

    try:
        source = json.loads((workdir / "config.json").read_text())["data"]["source"]
        return source_kind(source) in ("pairs", "chat")
    except (OSError, ValueError, KeyError, TypeError):
        return False


def run_names(workdirs: list[Path]) -> list[str]:
    """Each workdir's name, with as many parent folders as it takes to tell them apart
    (compare's runs all end in seed0)."""
    for depth in range(1, max(len(w.parts) for w in workdirs) + 1):
        names = ["/".join(w.parts[-depth:]) for w in workdirs]
        if len(set(names)) == len(names):
            return names
    return [str(w) for w in workdirs]


OUT_HELP = "PNG to write (default: <first workdir>/loss_by_position.png); with --prune, a folder for the pruned model."


@cli.command()
def main(argv: list[str] | None = None) -> None:
    """The command's entry point: bad input exits 2 with one line."""
    argv, f = cli.command_flags(argv)
    flags.DEFINE_multi_string("workdir", [], "A run; repeat to compare.", flag_values=f)
    flags.DEFINE_integer("step", None, "A kept checkpoint's step (default: the newest).", flag_values=f)
    flags.DEFINE_list("lengths", ["64", "128", "256", "512", "1024"], "Window lengths.", flag_values=f)
    flags.DEFINE_integer("tokens", 32768, "Validation tokens scored at each length.", flag_values=f)
    flags.DEFINE_string("out", None, OUT_HELP, flag_values=f)
    flags.DEFINE_bool("mask_heads", False, "Instead: the loss at block_size with each head removed.", flag_values=f)
    flags.DEFINE_string("remove_heads", None, "Instead: the loss with heads LAYER.HEAD,... removed.", flag_values=f)
    flags.DEFINE_float("prune", None, "Instead: remove this share of heads, least useful first.", flag_values=f)
    flags.DEFINE_bool("induction", False, "Instead: each head's induction score on repeated tokens.", flag_values=f)
    flags.DEFINE_bool("over_checkpoints", False, "Instead: --lab's measures at every kept checkpoint.", flag_values=f)
    flags.DEFINE_string("lab", "all", "The measures --over_checkpoints takes (train.lab's names).", flag_values=f)
    flags.DEFINE_integer("pass_at", 0, "A chat run: also pass@k with this many answers a prompt.", flag_values=f)
    flags.DEFINE_float("temperature", 1.0, "The temperature --pass_at samples at.", flag_values=f)
    flags.DEFINE_integer("prompts", 500, "The held-out prompts --pass_at answers (the first ones).", flag_values=f)
    flags.DEFINE_enum("turns", "first", ["first", "every"], "--pass_at's prompts: whose questions.", flag_values=f)
    flags.DEFINE_float("passing", 1.0, "The reward at which --pass_at counts an answer right.", flag_values=f)
    cli.parse_flags(argv, __doc__, f)
    cli.require(f, "workdir", what="the run to evaluate (repeat --workdir to compare runs)")
    workdirs, lengths = [Path(w) for w in f.workdir], _lengths(f.lengths)
    names = run_names(workdirs)
    if any(trained_on_examples(w) for w in workdirs):  # examples, not a stream: their answers are scored
        if not all(trained_on_examples(w) for w in workdirs) or f.mask_heads or f.induction or f.prune is not None:
            raise UserError(
                "runs trained on text pairs are scored on their held-out answers alone; evaluate them apart from "
                "other runs and without --mask_heads, --remove_heads, --prune or --induction"
            )
        for name, workdir in zip(names, workdirs, strict=True):
            print(answers_line(name, workdir, f.step))
            if f.pass_at:
                print(pass_at_line(name, workdir, f))
        return
    if f.over_checkpoints:
        for workdir in workdirs:
            print(f"wrote {lab_over_checkpoints(workdir, f.lab)}")
        return
    if f.mask_heads:
        for name, workdir in zip(names, workdirs, strict=True):
            print("\n".join(head_table(name, *heads_of_run(workdir, f.tokens, f.step))))
        return
    if f.induction:
        for name, workdir in zip(names, workdirs, strict=True):
            print("\n".join(induction_lines(name, workdir, f.step)))
        return
    if f.remove_heads is not None or f.prune is not None:
        for name, workdir in zip(names, workdirs, strict=True):
            print("\n".join(removal_lines(name, workdir, f)))
        return
    rows, drawn = [], []
    for name, workdir in zip(names, workdirs, strict=True):
        run, step, results = evaluate_run(workdir, lengths, f.tokens, f.step)
        rows += [(name, step, run.model.block_size, r) for r in results]
        drawn.append((name, run.model.block_size, results))
    print("\n".join(table(rows)))
    print(f"wrote {draw(drawn, Path(f.out) if f.out else workdirs[0] / 'loss_by_position.png')}")


if __name__ == "__main__":
    main()
