"""pass@k: does learning from rewards find answers the model could not, or sharpen the ones it could?

Each held-out conversation's first question (the prompts a train.rl run draws from its training
conversations: jaxgpt/data/rollouts.py `questions`, which the caller hands in) is answered
`samples` times at a temperature and once greedily, and every answer scored by a reward
(train.rl.reward's functions, jaxgpt/training/rewards.py). An answer passes where its reward
reaches `passing` (1 for the builtin rewards' right answers). With c of n answers to a prompt
passing, the chance that k answers drawn from those n hold at least one that passes is

    pass@k = 1 - C(n - c, k) / C(n, k)

(the unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on
Code"), averaged over the prompts: pass@1 is the mean share of passing answers, pass@n the
share of prompts answered right at least once. A model that RL only sharpens gains pass@1 and
keeps pass@n; one that learns answers it could not find raises pass@n too.
"""

from __future__ import annotations

import dataclasses
from math import comb

import jax
import numpy as np

from jaxgpt.model.sampling import SamplingConfig, answer_each
from jaxgpt.training.rewards import Answer

ROWS = 64  # the most rows a decoding call answers (answer_each)


@dataclasses.dataclass(frozen=True)
class PassAtK:
    prompts: int
    samples: int
    pass_at: dict[int, float]  # k -> pass@k, for k = 1, 2, 4, ... up to samples
    greedy: float  # the share of prompts whose greedy answer passes
    mean_reward: float  # over the sampled answers
    answer_tokens: float  # the sampled answers' mean length, their end-of-turn token counted


def pass_at(n: int, c: int, k: int) -> float:
    """The chance that k of n answers, c of which pass, drawn without replacement hold one that passes."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def answer_rewards(decoder, params, tokenizer, prompts, reward, sampling, samples, max_tokens, key, end: int):
    """(prompts, samples) rewards and answer lengths (the end-of-turn token counted): the
    prompts (each with .ids, .text and .reference) answered `samples` times by `answer_each`,
    each answer ending at the token `end` (the end of a turn)."""
    rewards, lengths = np.zeros((len(prompts), samples)), np.zeros((len(prompts), samples))
    answered = answer_each(
        decoder, params, [p.ids for p in prompts], samples, key, most_rows=ROWS, max_new_tokens=max_tokens,
        sampling=sampling, eot_id=end,
    )  # fmt: skip
    for i, (prompt, new) in enumerate(zip(prompts, answered, strict=True)):
        answers = []
        for s, tokens in enumerate(new):
            ends = np.flatnonzero(tokens == end)
            kept = tokens[: ends[0]] if len(ends) else tokens
            answers.append(Answer(prompt.text, tokenizer.decode(kept.tolist()), prompt.reference, bool(len(ends))))
            lengths[i, s] = len(kept) + bool(len(ends))
        rewards[i] = reward(answers)
    return rewards, lengths


def measure(decoder, params, tokenizer, prompts, reward, *, samples, temperature, passing, max_tokens, end, seed):
    """pass@k of the model on `prompts` (rollouts.questions' held-out first questions), each
    answer at most `max_tokens` long, ending at the token `end`, scored by `reward`
    (rewards.reward_function's)."""
    key = jax.random.key(seed)
    common = dict(max_tokens=max_tokens, key=key, end=end)
    sampled, lengths = answer_rewards(
        decoder, params, tokenizer, prompts, reward, SamplingConfig(temperature=temperature), samples, **common
    )
    greedy, _ = answer_rewards(decoder, params, tokenizer, prompts, reward, SamplingConfig(temperature=0), 1, **common)
    passed = (sampled >= passing).sum(axis=1)
    ks = [k for k in (2**i for i in range(samples.bit_length())) if k <= samples]
    return PassAtK(
        prompts=len(prompts),
        samples=samples,
        pass_at={k: float(np.mean([pass_at(samples, int(c), k) for c in passed])) for k in ks},
        greedy=float(np.mean(greedy[:, 0] >= passing)),
        mean_reward=float(sampled.mean()),
        answer_tokens=float(lengths.mean()),
    )
