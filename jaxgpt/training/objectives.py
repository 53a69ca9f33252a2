"""What a run trains its model to predict, as a value the engine reads: for a batch, what the
model reads, what it predicts and how much each position weighs, what an evaluation reports,
and which commands can use a run of it. Chosen once for a run (`objective_of`; the program
holds it, jaxgpt/training/program.py) and read by the step, the evaluation, the trainer's
record, `check`, `export` and the commands, so none of them asks which objective a run has.

  NEXT_TOKEN  each token from the ones before it (a decoder). Every position of a window is
              scored, or, in a batch of examples that says what it scores (text pairs'
              answers, conversations' assistant turns: weights and segments, jaxgpt/training/
              batch.py), those positions by their weights; an evaluation of examples adds the
              scored tokens' accuracy and how many whole answers greedy decoding writes.
  MASKED      the tokens a random share hides, read from both sides (an encoder, BERT's
              objective: jaxgpt/training/masked.py): each example's hidden positions drawn from
              the step's key and its place in the batch; the accuracy on them is measured, and
              no bits per byte (the loss is not a rate of compressing the text).
  CLASSIFIED  each labelled text's class (jaxgpt/data/labels.py), read by a classifier at one
              position of each text: the weighted case of the next-token objective over
              classes; its evaluation reports the accuracy and the confusion matrix.

Every objective's loss is the same sum: each scored position's cross-entropy times its weight,
divided by what the whole batch scores (`weight`), so the pieces a batch is split into
(microbatches, CPU cores, devices) each give their share and the shares add up to the batch's.
Terms beside it (`auxiliary_terms`: a mixture of experts' router losses, multi-token
prediction's) are added the same way whatever the objective. A new objective is one more value
here (docs/model.md, "Adding an objective").
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgpt.config import ModelConfig
from jaxgpt.training.batch import length_of, rows_of, scored_weight
from jaxgpt.training.masked import example_keys, hidden_count, mask_examples

MAX_EXP = math.log(sys.float_info.max)  # math.exp of more overflows: the perplexity is then inf


@dataclasses.dataclass(frozen=True)
class Objective:
    """The next-token objective; Masked below overrides what differs."""

    name: str = "next_token"
    reads_the_past: bool = True  # predicts each token from the ones before it, as generation does
    draws_each_step: bool = False  # what it scores is drawn from the step's key
    exports_as: str | None = None  # the Hugging Face family its models export as, where it decides it
    commands: tuple[str, ...] = ("sample", "chat", "evaluate", "logit-lens", "patch", "export")  # that need it
    described: str = "a decoder (model.objective=next_token), which predicts each next token and never sees a blank"
    instead: str = "python -m jaxgpt sample --workdir ... shows its continuations"  # what suits a run of it
    own_fields: tuple[str, ...] = ()  # model fields it sets over train.init_from's: a head of its own

    def example_ids(self, rows: int, given: jax.Array | None) -> jax.Array | None:
        """Each row's place in the batch, where it decides what the row is shown: nowhere here
        (a row is scored alike wherever it is), so none."""
        return None

    def read(self, config: ModelConfig, batch: dict, rng: jax.Array, example_ids) -> tuple:
        """(what the model reads, what it predicts, each position's weight or None for 1)."""
        return batch["inputs"], batch["targets"], batch.get("weights")

    def weight(self, config: ModelConfig, rng: jax.Array, batch: dict, batch_rows: int | None = None):
        """What the whole batch scores, what every piece's share of its loss is divided by: the
        sum of its weights, or rows x seq where it has none (a piece of a batch without weights
        counts `batch_rows` rows without the others' rows; with weights it needs them all)."""
        if "weights" in batch:
            assert batch_rows in (None, rows_of(batch)), "a piece of a batch with weights is told the batch's weight"
            return scored_weight(batch)
        return float((batch_rows or rows_of(batch)) * length_of(batch))

    def position_losses(self, losses: jax.Array, scores: jax.Array | None, batch: dict) -> tuple[jax.Array, dict]:
        """(each position's share of the loss before the division by the batch's weight, what
        is measured of it, each a sum over the positions that the caller divides by the batch's
        weight too, so that the shares of any split of the batch add up to the batch's): its
        cross-entropy times its weight here, and nothing measured."""
        return (losses if scores is None else losses * scores), {}

    def predicts(self, batch: dict, evaluating: bool) -> bool:
        """Whether the model's most likely tokens are measured: in an evaluation of examples."""
        return evaluating and "weights" in batch and "segments" in batch

    def measured(
        self, config: ModelConfig, predictions: jax.Array | None, targets, scores, batch: dict, weight
    ) -> dict:
        """What is measured of the predictions (each position's most likely token, where
        `predicts`): the scored tokens' accuracy, and whole answers right (`exact_matches`)."""
        if predictions is None:
            return {}
        right = predictions == targets
        return {"accuracy": (right * scores).sum() / weight} | exact_matches(right, scores, batch["segments"])

    def counts_scored(self, batch: dict) -> bool:
        """Whether an evaluation's batches score unequal numbers of positions (their mean is then
        over every position scored, not over the batches: the trainer weighs them so)."""
        return "weights" in batch

    def record(self, val: dict, train: dict, bits_per_nat: float) -> dict:
        """An evaluation's record from the mean measurements of the validation and training
        batches (bits_per_nat: the split's tokens per byte / ln 2, so the loss as bits per byte
        of text, comparable across tokenizers)."""
        record = {
            "val_loss": val["loss"],
            "val_bpb": val["loss"] * bits_per_nat,
            "val_perplexity": math.exp(val["loss"]) if val["loss"] < MAX_EXP else math.inf,  # not an OverflowError
            "eval_train_loss": train["loss"],
        }
        if "examples" in val:  # text pairs: the answers' tokens right, and whole answers greedy decoding writes
            record |= {"val_token_accuracy": val["accuracy"], "val_exact_match": val["exact_matches"] / val["examples"]}
        if "ahead_loss" in val:  # multi-token prediction's guess at the token after next
            record["val_ahead_loss"] = val["ahead_loss"]
        if "past_only_loss" in val:  # causal=False: the score a language model can be judged by
            past = val["past_only_loss"]
            record |= {"val_loss_past_only": past, "val_bpb_past_only": past * bits_per_nat}
        return record


@dataclasses.dataclass(frozen=True)
class Masked(Objective):
    name: str = "masked"
    reads_the_past: bool = False
    draws_each_step: bool = True
    exports_as: str | None = "bert"
    commands: tuple[str, ...] = ("fill", "export")
    described: str = "an encoder (model.objective=masked), which fills in blanks rather than predicting the next token"
    instead: str = "python -m jaxgpt fill --workdir ... --prompt '... [MASK] ...' shows its guesses"

    def example_ids(self, rows: int, given: jax.Array | None) -> jax.Array:
        return jnp.arange(rows) if given is None else given

    def read(self, config, batch, rng, example_ids) -> tuple:
        tokens, weights = batch["inputs"], batch.get("weights")
        inputs, hidden = mask_examples(tokens, example_keys(rng, self.example_ids(len(tokens), example_ids)), config)
        scores = hidden.astype(jnp.float32)
        return inputs, tokens, scores if weights is None else scores * weights

    def weight(self, config, rng, batch, batch_rows=None):
        """The whole batch's hidden positions (weighted, where it has weights), drawn from each
        example's key: a piece of a batch without weights counts the batch's without its rows."""
        rows, length = batch_rows or rows_of(batch), length_of(batch)
        keys = example_keys(rng, jnp.arange(rows))
        if "weights" in batch:
            assert rows == rows_of(batch), "a piece of a batch with weights is told the batch's weight"
            count = (mask_examples(jnp.zeros((rows, length), jnp.int32), keys, config)[1] * batch["weights"]).sum()
        else:
            count = hidden_count(keys, length, config)
        return jnp.maximum(count, 1).astype(jnp.float32)

    def predicts(self, batch: dict, evaluating: bool) -> bool:
        return True  # the accuracy on the hidden tokens, in training too

    def measured(self, config, predictions, targets, scores, batch, weight) -> dict:
        return {"accuracy": ((predictions == targets) * scores).sum() / weight}

    def counts_scored(self, batch: dict) -> bool:
        return True  # each batch hides its own number of tokens

    def record(self, val: dict, train: dict, bits_per_nat: float) -> dict:
        # not a rate of compressing the text: no bits per byte, no perplexity
        return {"val_loss": val["loss"], "val_accuracy": val["accuracy"], "eval_train_loss": train["loss"]}


@dataclasses.dataclass(frozen=True)
class Classified(Objective):
    """Each labelled text's class (jaxgpt/data/labels.py), read by the model's classifier at the
    one position of each example the batch weighs 1 (its last token, or an encoder's first),
    the target there the class: the weighted case of the next-token objective, over classes
    instead of tokens. Measured: the accuracy over examples and the confusion matrix (row: the
    true class, column: the one predicted; in training too, a classes x classes sum the step's
    metrics carry at no cost worth a branch), which the evaluation's record reports."""

    name: str = "classification"
    reads_the_past: bool = False
    commands: tuple[str, ...] = ()
    described: str = "a classifier (model.objective=classification), whose outputs are classes, not tokens"
    instead: str = "its evaluations (metrics.jsonl's val_accuracy and val_confusion) are what it reports"
    own_fields: tuple[str, ...] = ("objective", "classes")  # a classifier over the weights' body

    def predicts(self, batch: dict, evaluating: bool) -> bool:
        return True

    def measured(self, config, predictions, targets, scores, batch, weight) -> dict:
        accuracy = ((predictions == targets) * scores).sum() / weight
        classes = jnp.arange(config.classes)
        said = (targets[..., None] == classes) * scores[..., None]  # (rows, seq, classes): the true class, scored
        chosen = (predictions[..., None] == classes).astype(jnp.float32)
        return {"accuracy": accuracy, "confusion": jnp.einsum("btc,btd->cd", said, chosen)}

    def counts_scored(self, batch: dict) -> bool:
        return True

    def record(self, val: dict, train: dict, bits_per_nat: float) -> dict:
        confusion = np.asarray(val["confusion"])
        return {
            "val_loss": val["loss"],
            "val_accuracy": float(np.trace(confusion) / max(confusion.sum(), 1)),
            "val_confusion": confusion.astype(int).tolist(),
            "eval_train_loss": train["loss"],
        }


@dataclasses.dataclass(frozen=True)
class PolicyGradient(Objective):
    """Learning from rewards (train.rl; jaxgpt/data/rollouts.py). A training batch is the
    model's own answers, each token it chose weighted 1 (batch "weights") and its answer's
    advantage A (batch "advantages"): the loss at a position is A x cross-entropy, i.e.
    -A log pi(token), whose gradient is the policy gradient (REINFORCE; with group-relative
    advantages, GRPO's at one update per batch of answers, where its ratio is 1). With several
    updates per batch (train.rl.updates), the batch holds "sampling_losses", the cross-entropy
    of the parameters that sampled it, and the loss is PPO's clipped surrogate
    -min(r A, clip(r, 1 - clip, 1 + clip) A), r = pi / pi_sampling (Schulman et al. 2017),
    the share of tokens whose ratio the clip held measured as "clipped". Divided by the batch's
    answer tokens, as every objective's loss by its weight. With the batch's "reference_losses"
    (the starting model's cross-entropy of the same tokens) the k3 estimate of KL(pi ||
    reference), r - log r - 1 for r = pi_ref / pi (Schulman 2020), is measured as "kl" (how far
    the policy has gone), and with `kl` above 0 each position adds kl times it. A batch without
    advantages (the held-out conversations' reference answers) is scored as the next-token
    objective scores it: an evaluation of the policy is the decoder's."""

    name: str = "policy_gradient"
    kl: float = 0.0
    clip: float = 0.2

    def position_losses(self, losses, scores, batch):
        if "advantages" not in batch:
            return super().position_losses(losses, scores, batch)
        scores = jnp.ones_like(losses) if scores is None else scores
        advantages, measured = batch["advantages"], {}
        if "sampling_losses" in batch:
            ratio = jnp.exp(batch["sampling_losses"] - losses)  # pi / pi_sampling
            clipped = jnp.clip(ratio, 1 - self.clip, 1 + self.clip)
            per_position = -jnp.minimum(ratio * advantages, clipped * advantages)
            measured["clipped"] = ((ratio * advantages > clipped * advantages) * scores).sum()  # the clip's side taken
        else:
            per_position = losses * advantages
        if "reference_losses" in batch:  # measured whatever `kl`; trained on where it is above 0
            log_ratio = losses - batch["reference_losses"]  # log pi_ref - log pi
            kl = jnp.exp(log_ratio) - log_ratio - 1
            measured["kl"] = (kl * scores).sum()
            if self.kl:
                per_position = per_position + self.kl * kl
        return per_position * scores, measured


NEXT_TOKEN, MASKED, CLASSIFIED = Objective(), Masked(), Classified()
OBJECTIVES = {objective.name: objective for objective in (NEXT_TOKEN, MASKED, CLASSIFIED)}


def objective_of(config: ModelConfig) -> Objective:
    """The objective a model is trained with (model.objective)."""
    return OBJECTIVES[config.objective]


def training_objective(run) -> Objective:
    """What a run (a RunConfig) trains its model to do: learn from rewards where train.rl says
    so, else its model's objective."""
    if run.train.rl:
        return PolicyGradient(kl=run.train.rl.kl, clip=run.train.rl.clip)
    return objective_of(run.model)


class Scored(NamedTuple):
    """What a term beside the objective's loss reads of a piece of a batch: what the objective
    predicts and how it weighs each position (None: 1), the rows' segments (or None), the whole
    batch's weight, the piece's share of the batch's rows, and `losses_of(features, targets)`,
    each position's cross-entropy of the LM head reading `features` (as the objective's)."""

    targets: jax.Array
    scores: jax.Array | None
    segments: jax.Array | None
    weight: jax.Array | float
    share: float
    losses_of: Callable


def sown_collections(config: ModelConfig, evaluating: bool) -> list[str]:
    """The collections the model sows for the terms beside the objective: a mixture of
    experts' "router" in training (an evaluation reports no router statistics), and
    multi-token prediction's "ahead" (its loss is reported in evaluations too)."""
    return [
        name for name, on in (("router", config.moe is not None and not evaluating), ("ahead", config.mtp_weight)) if on
    ]


def router_term(config: ModelConfig, sown: dict, scored: Scored) -> tuple[jax.Array | float, dict]:
    """A mixture of experts' load-balancing and z-losses, the mean over its MoE layers times
    their coefficients (jaxgpt/model/moe.py), and its router's statistics, each the piece's
    share of the batch's (each sequence a routing group of its own)."""
    if "router" not in sown:
        return 0.0, {}
    router = jax.tree.map(lambda x: x * scored.share, router_statistics(sown["router"], config))
    added = config.moe.aux_loss * router["aux_loss"].mean() + config.moe.z_loss * router["z_loss"].mean()
    return added, {"router": router}


def token_after_next_term(config: ModelConfig, sown: dict, scored: Scored) -> tuple[jax.Array | float, dict]:
    """Multi-token prediction's loss (config.mtp_weight; jaxgpt/model/transformer.py
    TokenAfterNext): the cross-entropy of each position's guess at the token after next,
    weighted as the objective weighs that token (so a pair's answer is what is scored), over
    the batch's weight; a position whose token after next is outside the window or in another
    sequence of the row is not scored. Logged as "ahead_loss", added times mtp_weight."""
    if "ahead" not in sown:
        return 0.0, {}

    def shifted(x, last):  # position t: x at t + 1
        return jnp.concatenate([x[:, 1:], jnp.full_like(x[:, :1], last)], axis=1)

    weights = jnp.ones(scored.targets.shape, jnp.float32) if scored.scores is None else scored.scores
    weights = shifted(weights, 0)
    if scored.segments is not None:
        weights = weights * (shifted(scored.segments, -1) == scored.segments)  # tokens t and t + 1 in one sequence
    losses = scored.losses_of(sown["ahead"]["features"][0], shifted(scored.targets, 0))
    loss = (losses * weights).sum() / scored.weight
    return config.mtp_weight * loss, {"ahead_loss": loss}


AUXILIARY_TERMS = (router_term, token_after_next_term)  # each (config, sown, Scored) -> (added, measured)


def auxiliary_terms(config: ModelConfig, sown: dict, scored: Scored) -> tuple[jax.Array | float, dict]:
    """(what to add to the objective's loss, what was measured) of every term beside it
    (AUXILIARY_TERMS), whatever the objective: nothing where the model sowed nothing."""
    added, measured = 0.0, {}
    for term in AUXILIARY_TERMS:
        more, said = term(config, sown, scored)
        added, measured = added + more, measured | said
    return added, measured


def router_statistics(router: dict, config: ModelConfig) -> dict[str, jax.Array]:
    """What each MoE layer sowed in the "router" collection (jaxgpt/model/moe.py: its two losses, the
    load per expert, the dropped fraction, the routing entropy), each stacked over the MoE
    layers in order (config.moe_layers)."""
    if config.scan_layers:  # one stack of identical layers: already (n_layer, ...)
        return {name: value[0] for name, value in router["blocks"]["moe"].items()}
    layers = [router[f"block_{i}"]["moe"] for i in config.moe_layers]
    return {name: jnp.stack([layer[name][0] for layer in layers]) for name in layers[0]}


def exact_matches(right: jax.Array, weights: jax.Array, segments: jax.Array) -> dict[str, jax.Array]:
    """{"exact_matches": how many examples have every scored token right, "examples": how many
    have a scored token}, of rows (b, t) whose examples are their segments. Every scored
    token's most likely continuation right is what greedy decoding needs to write the whole
    answer, so this is greedy decoding's exact match, read off one forward pass."""
    rows, length = segments.shape
    ids = (jnp.arange(rows)[:, None] * (length + 1) + segments).ravel()  # (row, segment): one id each
    scored = weights.ravel() > 0
    wrong = jax.ops.segment_sum((scored & ~right.ravel()).astype(jnp.int32), ids, rows * (length + 1))
    has_answer = jax.ops.segment_sum(scored.astype(jnp.int32), ids, rows * (length + 1)) > 0
    return {
        "exact_matches": jnp.sum(has_answer & (wrong == 0)).astype(jnp.float32),
        "examples": jnp.sum(has_answer).astype(jnp.float32),
    }
