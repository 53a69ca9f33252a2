"""Learning from rewards (train.rl): the rewards, the group-relative advantages, the policy
gradient against its definition, the batch of sampled answers, and runs through the engine
that learn from a reward, checkpoint and resume bit for bit."""

import json
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_run_config

from jaxgpt.config import ConfigError, ModelConfig
from jaxgpt.config_files import resolve
from jaxgpt.data.rollouts import group_advantages
from jaxgpt.errors import UserError
from jaxgpt.job.trainer import train_and_evaluate
from jaxgpt.model.transformer import GPT, init_params
from jaxgpt.training.objectives import NEXT_TOKEN, PolicyGradient
from jaxgpt.training.rewards import Answer, reward_function
from jaxgpt.training.train_step import scored, token_losses

pytestmark = pytest.mark.gpu  # also run on the GPU backend by bench/gpu_session.py


def answer(completion, reference="37 + 45 = 82", finished=True):
    return Answer("What is 37 + 45?", completion, reference, finished)


def test_the_builtin_rewards_score_what_they_say():
    exact, number, form = (reward_function(name) for name in ("exact", "number", "format"))
    answers = [
        answer(" 37 + 45 = 82 "),
        answer("82"),
        answer("37 + 45 = 83"),
        answer("eighty-two"),
        answer("82", finished=False),
    ]
    assert exact(answers) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert number(answers) == [1.0, 1.0, 0.0, 0.0, 1.0]  # the last number: 82, 82, 83, none, 82
    assert form(answers) == [1.0, 1.0, 1.0, 0.0, 0.0]  # a number, and the turn ended
    near = reward_function("number", tolerance=0.05)  # within 5% of 82: 77.9 to 86.1
    assert near([answer("85"), answer("87")]) == [1.0, 0.0]


def test_a_reward_of_your_own_is_called_and_its_faults_are_one_line(reward_module):
    reward_module(
        "my_rewards",
        """
            def length(prompt, completion):
                return len(completion) / 10
            def raises(prompt, completion):
                raise KeyError("oops")
            def nan(prompt, completion):
                return float("nan")
            def text(prompt, completion):
                return "1"
            def right(prompt, completion):
                return completion == "4"
            def matches(prompt, completion, reference):
                return completion.endswith(reference)
            def keywords(prompt, completion, **columns):
                return len(columns["reference"])
            """,
    )
    assert reward_function("my_rewards:length")([answer("12345")]) == [0.5]
    assert reward_function("my_rewards:right")([answer("4"), answer("5")]) == [1.0, 0.0]  # a bool is 1 or 0
    # A reward that names `reference` (or takes **kwargs, as TRL's do) is given the reference answer.
    matches = reward_function("my_rewards:matches")
    assert matches([answer("= 82", reference="82"), answer("82", reference="81")]) == [1.0, 0.0]
    assert reward_function("my_rewards:keywords")([answer("", reference="12345")]) == [5.0]
    for name, said in [("raises", "raised KeyError"), ("nan", "returned nan"), ("text", "returned '1'")]:
        with pytest.raises(UserError, match=f"my_rewards:{name} {said}.*What is 37 \\+ 45") as error:
            reward_function(f"my_rewards:{name}")([answer("82")])
        assert "\n" not in str(error.value)
    with pytest.raises(UserError, match="cannot be imported"):
        reward_function("no_such_module:reward")


def test_advantages_are_each_reward_against_its_group():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    centred = group_advantages(rewards, "group", scale=False)
    np.testing.assert_array_equal(centred, [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [-0.75, -0.75, -0.75, 2.25]])
    scaled = group_advantages(rewards, "group", scale=True)  # std 0.5, 0 (tied: 0, not 0/0), 1.299
    np.testing.assert_allclose(scaled, [[1, -1, -1, 1], [0, 0, 0, 0], [-1 / np.sqrt(3)] * 3 + [np.sqrt(3)]])
    np.testing.assert_array_equal(group_advantages(rewards, "none", scale=True), rewards)


def tiny_model():
    config = ModelConfig(vocab_size=11, n_layer=1, n_head=2, d_model=16, block_size=8)
    return GPT(config), init_params(config, jax.random.key(0))


def test_the_policy_gradient_is_minus_advantage_times_the_gradient_of_log_probability():
    """The objective's gradient against REINFORCE's by the short road: -sum_t A_t grad log pi(x_t)
    over the scored positions, over their count, the log-probabilities from the model's logits."""
    model, params = tiny_model()
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 11, (3, 9)), jnp.int32)
    weights = jnp.asarray((np.arange(8) >= 3) & (np.arange(8) < np.array([[8], [6], [5]])), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(3, 1)), jnp.float32) * weights
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights, "advantages": advantages}

    def reinforce(p):
        logits = model.apply({"params": p}, batch["inputs"])
        log_pi = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
        return -(advantages * log_pi).sum() / weights.sum()

    def ours(p):
        return scored(model, p, batch, jax.random.key(1), objective=PolicyGradient())[0]

    expected, got = jax.jit(jax.grad(reinforce))(params), jax.jit(jax.grad(ours))(params)
    for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)  # float32 sums over <= 24 positions
    # without advantages (the held-out reference answers) it is the next-token objective's loss
    plain = {k: batch[k] for k in ("inputs", "targets", "weights")}
    rl_loss = scored(model, params, plain, jax.random.key(1), objective=PolicyGradient())[0]
    assert rl_loss == scored(model, params, plain, jax.random.key(1), objective=NEXT_TOKEN)[0]


def test_the_kl_term_is_k3_against_the_reference_and_zero_at_it():
    model, params = tiny_model()
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 11, (2, 9)), jnp.int32)
    weights = jnp.ones((2, 8), jnp.float32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights, "advantages": 0 * weights}
    own = token_losses(model, params, batch)
    at_itself = scored(
        model, params, batch | {"reference_losses": own}, jax.random.key(0), objective=PolicyGradient(kl=1.0)
    )
    assert float(at_itself[1]["kl"]) == pytest.approx(0.0, abs=1e-6) and float(at_itself[0]) == pytest.approx(
        0.0, abs=1e-6
    )
    reference = own + 0.3  # the reference gives each token e^-0.3 of the policy's probability
    loss, measured = scored(
        model, params, batch | {"reference_losses": reference}, jax.random.key(0), objective=PolicyGradient(kl=2.0)
    )
    k3 = np.exp(-0.3) + 0.3 - 1  # r - log r - 1 at r = e^-0.3
    assert float(measured["kl"]) == pytest.approx(k3, rel=1e-4) and float(loss) == pytest.approx(2 * k3, rel=1e-4)
    # with kl 0 it is measured (how far the policy has gone) and the loss is the policy gradient's alone
    untrained, said = scored(
        model, params, batch | {"reference_losses": reference}, jax.random.key(0), objective=PolicyGradient()
    )
    assert float(said["kl"]) == pytest.approx(k3, rel=1e-4) and float(untrained) == 0.0  # advantages all 0


def test_later_updates_take_ppos_clipped_surrogate_and_the_first_is_the_policy_gradient():
    """With the sampling policy's cross-entropies in the batch (train.rl.updates > 1) each
    position's loss is -min(r A, clip(r, 1 - e, 1 + e) A), r = pi / pi_sampling, against numpy
    on the same log-probabilities; "clipped" is the share of scored tokens where the clipped side
    was taken; and at the sampling policy itself (r = 1, the first update) the gradient is the
    plain policy gradient's."""
    model, params = tiny_model()
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 11, (3, 9)), jnp.int32)
    weights = jnp.asarray(np.arange(8) >= np.array([[2], [3], [5]]), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(3, 1)), jnp.float32) * weights
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights, "advantages": advantages}
    own = token_losses(model, params, batch)
    ppo = PolicyGradient(clip=0.2)
    # the first update: the policy is the one that sampled, r = 1, and the gradient is REINFORCE's
    grads = [
        jax.jit(jax.grad(lambda p, b=b, o=o: scored(model, p, b, jax.random.key(1), objective=o)[0]))(params)
        for b, o in ((batch | {"sampling_losses": own}, ppo), (batch, PolicyGradient()))
    ]
    for a, b in zip(*map(jax.tree.leaves, grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # r = exp(0) exactly; sums over <= 18 positions
    # a later update: the sampling policy gave each token another probability, some beyond the clip
    shift = jnp.asarray(rng.normal(scale=0.3, size=(3, 8)), jnp.float32)
    loss, measured = scored(model, params, batch | {"sampling_losses": own + shift}, jax.random.key(1), objective=ppo)
    r, a, w = np.exp(np.asarray(shift, np.float64)), np.asarray(advantages, np.float64), np.asarray(weights)
    expected = -np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
    assert float(loss) == pytest.approx((expected * w).sum() / w.sum(), rel=1e-5)
    held = (r * a > np.clip(r, 0.8, 1.2) * a) & (w > 0)
    assert 0 < held.sum() < w.sum()  # the case has both sides
    assert float(measured["clipped"]) == pytest.approx(held.sum() / w.sum(), rel=1e-6)


def test_a_measurement_of_the_objective_adds_up_over_microbatches():
    """train_kl is a mean over the batch's scored tokens whether the batch is split or not: each
    piece's share is divided by the whole batch's weight, as the loss is (it was each piece's
    own mean, summed over the pieces)."""
    from jaxgpt.training.train_step import gradients

    model, params = tiny_model()
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, 11, (4, 9)), jnp.int32)
    weights = jnp.asarray(np.arange(8) >= np.array([[1], [2], [4], [6]]), jnp.float32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights, "advantages": 0.5 * weights}
    batch["reference_losses"] = token_losses(model, params, batch) + jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)
    whole, halves = (
        gradients(params, batch, jax.random.key(0), model=model, microbatches=m, objective=PolicyGradient(kl=0.1))[0]
        for m in (1, 2)
    )
    assert float(halves["kl"]) == pytest.approx(float(whole["kl"]), rel=1e-6)
    assert float(halves["loss"]) == pytest.approx(float(whole["loss"]), rel=1e-6)


def rl_config(steps=6, **rl):
    config = small_run_config(
        steps=steps, log_every=1, eval_every=3, eval_batches=1, checkpoint_every=3, warmup_steps=1
    )
    config.data.source = "builtin:arithmetic-chat"
    config.data.tokenizer = "byte"
    config.model.update(block_size=48, position="rope")
    config.train.rl.update(dict(samples=4, prompts=2, max_tokens=8) | rl)
    return config


def test_a_config_says_in_one_line_what_learning_from_rewards_needs():
    config = rl_config()
    config.data.source = "builtin:shakespeare_char"
    with pytest.raises(ConfigError, match="train.rl samples answers to a chat source's prompts"):
        resolve(config)
    with pytest.raises(ConfigError, match="train.rl.samples=1 must be at least 2"):
        resolve(rl_config(samples=1))
    with pytest.raises(ConfigError, match="train.rl.reward=.nearly. is one of exact, number, format"):
        resolve(rl_config(reward="nearly"))
    # several updates a batch of answers: a run stops and resumes between batches alone
    with pytest.raises(ConfigError, match="train.steps=6 must be a multiple of train.rl.updates=4"):
        resolve(rl_config(updates=4))
    config = rl_config(steps=8, updates=4)
    config.train.checkpoint_schedule = "log"
    with pytest.raises(ConfigError, match="checkpoint_every=3 must be a multiple .*checkpoint_schedule='log' must be"):
        resolve(config)
    with pytest.raises(ConfigError, match="train.rl.clip=0.0 must be positive"):
        resolve(rl_config(clip=0))
    with pytest.raises(ConfigError, match="train.rl.draws=1 must be 0 or at least train.rl.prompts=2"):
        resolve(rl_config(draws=1))
    with pytest.raises(ConfigError, match="train.rl.turns='last' is not one of 'first', 'every'"):
        resolve(rl_config(turns="last"))
    with pytest.raises(ConfigError, match="train.rl.length=8 must leave room for a prompt"):
        resolve(rl_config(length=8))
    with pytest.raises(ConfigError, match="train.rl.length=64 is longer than model.block_size=48"):
        resolve(rl_config(length=64))
    assert resolve(rl_config()).train.batch_size == 8  # 2 prompts x 4 answers


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """write(module, source): a module of rewards of your own in the folder the user runs
    train.py in (the test's own, wherever train.py is), importable as `module:function`; the
    folder put on sys.path and the module imported go with the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    written = []

    def write(module: str, source: str) -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        written.append(module)

    yield write
    for module in written:
        sys.modules.pop(module, None)


@pytest.fixture
def digits_reward(reward_module):
    """A reward a model from scratch finds signal in: the share of the answer that is digits."""
    reward_module(
        "digit_rewards",
        "def digits(prompt, completion):\n    return sum(c.isdigit() for c in completion) / max(len(completion), 1)\n",
    )
    return "digit_rewards:digits"


def test_the_batch_is_each_answer_after_its_prompt_scored_on_the_answer(tmp_path, digits_reward):
    from jaxgpt import data, sharding
    from jaxgpt.data.rollouts import Rollouts
    from jaxgpt.job.setup import with_vocabulary

    run = resolve(rl_config(reward=digits_reward))
    dataset = data.prepare(run.data, progress=False)
    run = with_vocabulary(run, dataset.tokenizer)
    rollouts, _ = data.batch_sources(dataset, run)  # a run with train.rl draws its batches from rollouts
    assert isinstance(rollouts, Rollouts)
    params = init_params(run.model, jax.random.key(3))
    mesh = sharding.make_mesh(run.mesh, jax.devices()[:1])
    batch = jax.device_get(rollouts.rollout(params, 5, mesh))
    again = jax.device_get(rollouts.rollout(params, 5, mesh))  # a pure function of (params, seed, step)
    for name in batch:
        np.testing.assert_array_equal(batch[name], again[name])
    inputs, weights, advantages = batch["inputs"], batch["weights"], batch["advantages"]
    assert inputs.shape == (8, 48) and set(batch) == {"inputs", "targets", "weights", "advantages"}
    within = np.arange(47) < (weights * np.arange(48)).max(axis=1, keepdims=True)  # before the answer's last
    np.testing.assert_array_equal(batch["targets"][:, :-1][within], inputs[:, 1:][within])  # the next tokens
    assistant = dataset.tokenizer.special_ids["<|assistant|>"]
    for row in range(8):
        marker = int(np.flatnonzero(inputs[row] == assistant)[0])
        scored_positions = np.flatnonzero(weights[row])
        assert scored_positions[0] == marker  # the position reading the marker predicts the answer's first token
        assert 1 <= len(scored_positions) <= 8 and np.all(np.diff(scored_positions) == 1)
        assert len(set(advantages[row][scored_positions].tolist())) == 1  # one advantage an answer
        assert not advantages[row][weights[row] == 0].any()
    for group in advantages.max(axis=1).reshape(2, 4) + advantages.min(axis=1).reshape(2, 4):
        assert abs(group.sum()) < 1e-5  # each group's advantages sum to 0 (baseline: its mean)
    said = rollouts.said[-1]
    assert set(said) >= {"reward", "reward_spread", "exact_match", "answer_tokens", "tied_groups"}


def test_drawing_more_prompts_trains_on_the_groups_with_a_signal_first(reward_module):
    """train.rl.draws=8 of prompts=2: of the 8 groups answered, those whose rewards all tie are
    dropped and the first 2 of the rest, in the order drawn, make the batch; the measurements
    are of all 8 (a reward that ties for every question but those written with a "+")."""
    from jaxgpt import data, sharding
    from jaxgpt.job.setup import with_vocabulary

    reward_module(
        "parity_rewards",
        "def parity(prompt, completion):\n    return sum(map(ord, completion)) % 2 if '+' in prompt else 1.0\n",
    )
    run = resolve(rl_config(reward="parity_rewards:parity", draws=8, length=40))
    dataset = data.prepare(run.data, progress=False)
    run = with_vocabulary(run, dataset.tokenizer)
    rollouts, _ = data.batch_sources(dataset, run)
    params = init_params(run.model, jax.random.key(3))
    mesh = sharding.make_mesh(run.mesh, jax.devices()[:1])
    groups, _ = rollouts.sample(params, 1)
    rewards = [rollouts.reward([rollouts.answer(prompt, t)[0] for t in new]) for prompt, new in groups]
    signal = [g for g, r in enumerate(rewards) if len(set(r)) > 1]
    assert 2 <= len(signal) < 8, rewards  # the case has both kinds
    batch = jax.device_get(rollouts.rollout(params, 1, mesh))
    assert batch["inputs"].shape == (8, 40)  # 2 groups of 4 answers, rows of train.rl.length
    for row in range(8):
        prompt = groups[signal[row // 4]][0].ids
        np.testing.assert_array_equal(batch["inputs"][row, : len(prompt)], prompt)
    said = rollouts.said[-1]
    assert said["tied_groups"] == 1 - len(signal) / 8 and said["trained_tied_groups"] == 0


def test_every_turn_of_a_conversation_is_a_prompt_read_after_the_turns_before_it():
    """train.rl.turns="every": each question of a training conversation is a prompt, read after
    the conversation before it with its reference answers; the first turns' prompts are
    turns="first"'s, and each reference is its own question's sum, written out."""
    import re

    from jaxgpt import data
    from jaxgpt.job.setup import with_vocabulary

    def prompts(turns):
        config = rl_config(turns=turns, max_tokens=16)
        config.model.block_size = 128  # a third turn's prompt fits
        run = resolve(config)
        dataset = data.prepare(run.data, progress=False)
        rollouts, _ = data.batch_sources(dataset, with_vocabulary(run, dataset.tokenizer))
        return rollouts.prompts, dataset.tokenizer

    first, tokenizer = prompts("first")
    every, _ = prompts("every")
    end = tokenizer.special_ids["<|end|>"]
    starts = [i for i, p in enumerate(every) if (tokenizer.special_ids["<|user|>"] == p.ids).sum() == 1]
    assert len(starts) == len(first)  # each conversation's first prompt, in order
    for i, prompt in zip(starts, first, strict=True):
        np.testing.assert_array_equal(every[i].ids, prompt.ids)
        assert (every[i].text, every[i].reference) == (prompt.text, prompt.reference)
    turn_counts = np.diff(starts + [len(every)])
    assert set(turn_counts.tolist()) == {1, 2, 3} and len(every) == turn_counts.sum()
    for i, j in zip(starts, starts[1:] + [len(every)], strict=True):
        for before, after in zip(every[i : j - 1], every[i + 1 : j], strict=True):  # turn k, then k + 1
            answered = np.concatenate([before.ids, tokenizer.encode(before.reference), [end]])
            np.testing.assert_array_equal(after.ids[: len(answered)], answered)
            assert tokenizer.decode(after.ids[len(answered) :].tolist()).count(after.text) == 1
    for prompt in every:
        numbers = [int(n) for n in re.findall(r"\d+", prompt.text)]
        assert prompt.reference == " + ".join(map(str, numbers)) + f" = {sum(numbers)}", prompt


def metrics(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_learning_from_a_reward_raises_it_and_resumes_bit_for_bit(tmp_path, digits_reward):
    """A model from scratch rewarded for digits writes more of them (the policy gradient does
    what it is for), and a run stopped and resumed logs what the uninterrupted one logs: its
    KL measured against step 0's model, not the one it resumed from."""
    config = rl_config(steps=40, reward=digits_reward, temperature=1.0)
    config.train.update(lr=1e-2, eval_every=20, checkpoint_every=20)
    config.train.rl.kl = 0.01
    whole = metrics(tmp_path / "whole") if train_and_evaluate(config, tmp_path / "whole", progress=False) else None
    rewards = [m["rl_reward"] for m in whole]
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.2, rewards
    train_and_evaluate(config, tmp_path / "resumed", progress=False, stop_at=20)
    train_and_evaluate(config, tmp_path / "resumed", progress=False)
    resumed = metrics(tmp_path / "resumed")
    assert whole[0]["train_kl"] == 0 < whole[-1]["train_kl"]  # at step 1 the policy is the reference
    for key in ("train_loss", "grad_norm", "rl_reward", "rl_answer_tokens", "train_kl"):
        assert [m[key] for m in resumed] == [m[key] for m in whole], key
    assert [m["val_loss"] for m in resumed if "val_loss" in m] == [m["val_loss"] for m in whole if "val_loss" in m]


@pytest.mark.slow
def test_several_updates_a_batch_with_adapters_and_microbatches_resume_bit_for_bit(tmp_path, digits_reward):
    """train.rl.updates=2 with low-rank adapters and 2 microbatches: the answers are sampled at
    steps 0, 2, 4, 6 alone (logged there), the clip is measured, a stop asked for within a batch
    of answers is refused in one line, and a run stopped at step 4 and resumed logs what the
    uninterrupted one logs, bit for bit."""
    config = rl_config(steps=8, reward=digits_reward, updates=2, prompts=4)  # 16 rows: 8 a piece, one a device
    config.train.update(lr=1e-2, eval_every=4, checkpoint_every=4, microbatches=2)
    config.model.lora_rank = 2
    train_and_evaluate(config, tmp_path / "whole", progress=False)
    whole = metrics(tmp_path / "whole")
    assert [m["step"] for m in whole if "rl_reward" in m] == [1, 3, 5, 7]  # a batch of answers every 2 steps
    assert all(0 <= m["train_clipped"] <= 1 for m in whole)
    with pytest.raises(UserError, match="--stop_at 3 is within a batch of answers"):
        train_and_evaluate(config, tmp_path / "resumed", progress=False, stop_at=3)
    train_and_evaluate(config, tmp_path / "resumed", progress=False, stop_at=4)
    train_and_evaluate(config, tmp_path / "resumed", progress=False)
    resumed = metrics(tmp_path / "resumed")
    for key in ("train_loss", "grad_norm", "train_clipped", "val_loss"):
        assert [m.get(key) for m in resumed] == [m.get(key) for m in whole], key


def test_a_chat_run_fine_tunes_from_a_chat_run_whose_rows_hold_the_template_already():
    """train.init_from a base (256 byte rows: the template's 4 tokens grown after them) or a chat
    run (260 rows: grown before); any other count reads other tokens' rows and is refused."""
    import dataclasses

    from jaxgpt.data.conversations import chat_tokenizer
    from jaxgpt.job.setup import with_source_vocabulary
    from jaxgpt.tokenizers import ByteTokenizer

    tokenizer = chat_tokenizer(ByteTokenizer())
    run = resolve(rl_config())
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, init_from="/nonexistent/hub-name"))
    for rows in (256, 260):
        sized = dataclasses.replace(run, model=run.model.replace(vocab_size=rows))
        assert with_source_vocabulary(sized, tokenizer).model.vocab_size == 260
    with pytest.raises(UserError, match="weights have 300 token rows"):
        with_source_vocabulary(dataclasses.replace(run, model=run.model.replace(vocab_size=300)), tokenizer)
