"""Learning from rewards (docs/lab.md "Learning from rewards"): the chat model
configs/sft_arithmetic.py fine-tuned (train.init_from=runs/sft_arithmetic) answers the training
conversations' first questions itself, eight answers a question, 64 questions a step, and learns
from which were right: the reward is 1 for the exact answer ("37 + 45 = 82"), its advantage the
reward minus its group's mean over the group's spread (GRPO), the step trained on 16 groups,
those whose answers differ first (a group all right or all wrong carries no signal). Evaluated
as the SFT run is, on the held-out conversations (val_exact_match); logged beside it, rl_reward
and rl_exact_match of the sampled answers, the share of groups whose answers all tie
(rl_tied_groups), train_kl to the SFT model, and the sampling's speed.

    python train.py --config configs/arithmetic.py --workdir runs/arithmetic
    python train.py --config configs/sft_arithmetic.py --workdir runs/sft_arithmetic
    python train.py --config configs/rl_arithmetic.py --workdir runs/rl_arithmetic

--config.train.rl.baseline=none drops the group baseline, --config.train.rl.kl=0.05 keeps the
policy near the SFT model, --config.train.rl.every_token=true puts the loss on the prompt's
tokens too (the ablations); --config.train.rl.reward=mymodule:reward your own."""

from configs import sft_arithmetic


def get_config():
    config = sft_arithmetic.get_config()
    config.train.init_from = "runs/sft_arithmetic"
    config.train.rl.samples = 8
    config.train.rl.draws = 64  # questions answered a step; the groups with a signal are kept first
    config.train.rl.prompts = 16  # groups trained a step: train.batch_size becomes 128 answers
    config.train.rl.max_tokens = 16  # "37 + 45 = 82" and the end of the turn are 13
    config.train.rl.length = 40  # the longest question (20 tokens) and its answer: rows of 40, not 128
    config.train.rl.temperature = 1.0
    config.train.rl.reward = "exact"
    config.train.steps = 300
    config.train.lr = 3e-4
    config.train.min_lr = 3e-5
    config.train.beta2 = 0.999  # a steadier second moment: each step's groups are few and differ
    config.train.warmup_steps = 30
    config.train.log_every = 10
    config.train.eval_every = 100
    config.train.checkpoint_every = 100
    return config
