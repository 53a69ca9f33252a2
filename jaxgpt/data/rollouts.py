"""Learning from rewards: a training batch made of the model's own answers (train.rl;
the objective is jaxgpt/training/objectives.py's PolicyGradient).

A step is two compiled programs with the host between them, as TRL and nanochat run it:

  1. sample   train.rl.prompts prompts drawn from the training conversations by (seed, step),
              each answered train.rl.samples times with the KV cache by the current parameters
              (jaxgpt/model/sampling.py `answer_each`: every prompt's rows together, padded to
              the longest prompt, one compiled decoding loop for the whole run)
  2. score    on the host: each answer's reward (jaxgpt/training/rewards.py) and its
              advantage, the reward minus its group's mean (train.rl.baseline="group"),
              divided by the group's standard deviation (train.rl.scale)
  3. update   the engine's compiled step on the batch the answers make: row i is prompt +
              answer i, its answer's positions weighted 1 and given the answer's advantage
              (with train.rl.every_token, the prompt's too), padding after it weighted 0

The batch of step s is a pure function of the parameters at step s and (seed, s), so a resumed
run samples what the uninterrupted one sampled: resuming is exact as for any run. A prompt is a
conversation's first question and its reference answer the first answer (what "exact" and
"number" compare with), or with train.rl.turns="every" each of its questions, read after the
conversation before it as written (the earlier answers the references, as fine-tuning reads
them); prompts whose answer cannot fit the row are left out.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import jax
import numpy as np

from jaxgpt.data.conversations import ASSISTANT, END, USER
from jaxgpt.errors import UserError
from jaxgpt.model.sampling import SamplingConfig, answer_each, decoding_model
from jaxgpt.sharding import batch_sharding, rows_beside
from jaxgpt.training.rewards import Answer, exact, reward_function

ROLLOUT_STREAM = 3  # the stream the prompts and the answers' keys are drawn from (data's use 0-2)


@dataclasses.dataclass(frozen=True)
class Prompt:
    ids: np.ndarray  # what the model reads before answering: separator, user turn, assistant marker
    text: str  # the user's question, as a reward of your own is given it
    reference: str  # the first answer's text


class Rollouts:
    """Training batches of sampled answers (the module's docstring), and, for the evaluation's
    training loss, the teacher-forced batches of the conversations they come from (`batch`)."""

    def __init__(self, teacher_forced, run, tokenizer):
        rl, model = run.train.rl, run.model
        self.teacher_forced, self.run, self.rl, self.tokenizer = teacher_forced, run, rl, tokenizer
        self.end = tokenizer.special_ids[END]
        self.separator = teacher_forced.examples.separator
        self.length = run.row_length  # a row: one prompt and its answer
        self.prompts = questions(
            teacher_forced.examples, tokenizer, self.length + 1 - rl.max_tokens, every_turn=rl.turns == "every"
        )
        if not self.prompts:
            raise UserError(
                f"no training prompt leaves room for train.rl.max_tokens={rl.max_tokens} answer tokens in "
                f"rows of {self.length} tokens (train.rl.length, or model.block_size); lower max_tokens or raise length"
            )
        self.reward = reward_function(rl.reward, rl.tolerance)
        self.sampling = SamplingConfig(temperature=rl.temperature, top_p=rl.top_p)
        self.decoder = decoding_model(model, self.length)  # a cache of a row's positions, not the context's
        self.longest = max(len(p.ids) for p in self.prompts)  # every step's prompts padded to it: one program
        self.rows_a_call = (rl.draws or rl.prompts) * rl.samples  # the most rows answer_each decodes at once: all
        self.reference = None  # the starting model's parameters, the KL's reference (the trainer sets them)
        self._losses = jax.jit(partial(answer_losses, model=model))
        self.said: list[dict] = []  # each rollout's measurements, taken by the trainer's record

    def batch(self, run, mesh, index: int, stream: int) -> dict:
        return self.teacher_forced.batch(run, mesh, index, stream)

    def rollout(self, params, step: int, mesh) -> dict:
        """Step `step`'s batch (the batch contract's dict, sharded over `mesh`) of answers
        sampled by `params`, its measurements appended to `said`."""
        rl = self.rl
        groups, seconds = self.sample(params, step)
        answers = [self.answer(prompt, tokens) for prompt, new in groups for tokens in new]
        sampled = sum(len(tokens) for _, tokens in answers)  # each up to its end of turn: what was asked for
        rewards = np.asarray(self.reward([a for a, _ in answers]), np.float64).reshape(len(groups), rl.samples)
        tied = rewards.std(axis=1) == 0  # no signal in them
        kept = np.arange(rl.prompts)
        if len(groups) > rl.prompts:  # train.rl.draws: those with a signal first, in the order drawn
            kept = np.argsort(tied, kind="stable")[: rl.prompts]
        advantages = group_advantages(rewards[kept], rl.baseline, rl.scale)
        answers_kept = [answers[g * rl.samples + i] for g in kept for i in range(rl.samples)]
        batch = self.rows([groups[g] for g in kept], answers_kept, advantages)
        if self.reference is not None:  # the KL to the starting model: measured, and with train.rl.kl trained
            batch["reference_losses"] = np.asarray(self._losses(self.reference, batch))
        if rl.updates > 1:  # PPO's ratio's denominator: the policy that sampled them
            batch["sampling_losses"] = np.asarray(self._losses(params, batch))
        self.said.append(
            {
                "reward": float(rewards.mean()),
                "reward_spread": float(rewards.std(axis=1).mean()),  # within a group: the signal's size
                "exact_match": float(np.mean([exact(a, 0.0) for a, _ in answers])),
                "answer_tokens": float(np.mean([len(tokens) for _, tokens in answers])),
                "tied_groups": float(tied.mean()),
                "trained_tied_groups": float(tied[kept].mean()),  # below tied_groups where train.rl.draws drops some
                "sampled_tokens_per_sec": sampled / seconds,
                "sampling_sec": seconds,
            }
        )
        return jax.device_put(batch, batch_sharding(mesh))

    def sample(self, params, step: int) -> tuple[list[tuple[Prompt, np.ndarray]], float]:
        """([(prompt, its (samples, max_tokens) answer tokens)] for step `step`'s draws prompts,
        drawn by (seed, step), the seconds the sampling took), decoded where the parameters are:
        the rows split over the mesh they are laid out on (not the CPU cores' mesh an update's
        batch may be split over: the parameters are whole on one device there)."""
        rl = self.rl
        jax.block_until_ready(params)  # the update before it done: its time is not the sampling's
        started = time.perf_counter()
        drawn = rl.draws or rl.prompts
        chosen = np.random.default_rng((self.run.train.seed, ROLLOUT_STREAM, step)).choice(
            len(self.prompts), drawn, replace=len(self.prompts) < drawn
        )
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.run.train.seed), ROLLOUT_STREAM), step)
        prompts = [self.prompts[i] for i in chosen.tolist()]
        answered = answer_each(
            self.decoder, params, [p.ids for p in prompts], rl.samples, key, most_rows=self.rows_a_call,
            max_new_tokens=rl.max_tokens, sampling=self.sampling, eot_id=self.end, pad_to=self.longest,
            rows_on=rows_beside(params, self.rows_a_call),
        )  # fmt: skip
        return list(zip(prompts, answered, strict=True)), time.perf_counter() - started

    def answer(self, prompt: Prompt, new: np.ndarray) -> tuple[Answer, np.ndarray]:
        """(the answer as the reward reads it, its tokens: up to and with its end-of-turn token)."""
        ends = np.flatnonzero(new == self.end)
        finished = bool(len(ends))
        tokens = new[: ends[0] + 1] if finished else new
        text = self.tokenizer.decode(tokens[:-1].tolist() if finished else tokens.tolist())
        return Answer(prompt.text, text, prompt.reference, finished), tokens

    def rows(self, groups, answers, advantages: np.ndarray) -> dict:
        """The batch: each answer after its prompt, padded with the separator, scored on its
        own tokens (train.rl.every_token: on the prompt's too) with its advantage."""
        rows = len(answers)
        inputs = np.full((rows, self.length), self.separator, np.int32)
        targets = np.full((rows, self.length), self.separator, np.int32)
        weights = np.zeros((rows, self.length), np.float32)
        prompts = [prompt for prompt, new in groups for _ in new]
        for r, ((_, tokens), prompt) in enumerate(zip(answers, prompts, strict=True)):
            row = np.concatenate([prompt.ids, tokens])
            n = len(row) - 1
            inputs[r, :n], targets[r, :n] = row[:-1], row[1:]
            first = 0 if self.rl.every_token else len(prompt.ids) - 1  # position predicting the answer's first token
            weights[r, first:n] = 1.0
        return {
            "inputs": inputs,
            "targets": targets,
            "weights": weights,
            "advantages": (weights * advantages.reshape(rows, 1)).astype(np.float32),
        }


def questions(conversations, tokenizer, room_before: int, every_turn: bool = False) -> list[Prompt]:
    """Each conversation's first question (`every_turn`: each of its questions, after the
    conversation before it) as a prompt at most `room_before` tokens long, with its answer."""
    markers, prompts = conversations.markers, []
    for i in range(len(conversations)):
        unit = conversations.unit(i)
        assistants = np.flatnonzero(unit == markers[ASSISTANT])
        for at in assistants[: None if every_turn else 1].tolist():
            start = at + 1
            if start > room_before:
                break  # the later turns' prompts are longer still
            ends = np.flatnonzero(unit[start:] == markers[END])
            answer = unit[start : start + (ends[0] if len(ends) else len(unit) - start)]
            turn = unit[:at]
            users = np.flatnonzero(turn == markers[USER])
            question = turn[users[-1] + 1 :] if len(users) else turn[1:]
            question = question[question != markers[END]]
            prompts.append(
                Prompt(unit[:start].copy(), tokenizer.decode(question.tolist()), tokenizer.decode(answer.tolist()))
            )
    return prompts


def group_advantages(rewards: np.ndarray, baseline: str, scale: bool) -> np.ndarray:
    """(prompts, samples) rewards -> advantages: minus the group's mean (baseline "group"),
    then over its standard deviation (`scale`; a group whose rewards all tie gets 0, not 0/0);
    with baseline "none" the rewards themselves."""
    advantages = rewards - rewards.mean(axis=1, keepdims=True) if baseline == "group" else rewards.copy()
    if scale and baseline == "group":
        spread = rewards.std(axis=1, keepdims=True)
        advantages = np.where(spread > 0, advantages / np.where(spread > 0, spread, 1), 0.0)
    return advantages


def answer_losses(params, batch, *, model):
    """Each position's cross-entropy under `params` (the starting model's, or the sampling one's)."""
    from jaxgpt.model.transformer import GPT
    from jaxgpt.training.train_step import token_losses

    return token_losses(GPT(model), params, {"inputs": batch["inputs"], "targets": batch["targets"]})
