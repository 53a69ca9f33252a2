"""Learning from rewards (docs/lab.md "Learning from rewards"): the chat model
configs/sft_arithmetic.py fine-tuned (train.init_from=runs/sft_arithmetic) answers the training
conversations' first questions itself, eight answers a question, and learns from which were
right: the reward is 1 for the exact answer ("37 + 45 = 82"), its advantage the reward minus
its group's mean over the group's spread (GRPO). Evaluated as the SFT run is, on the held-out
conversations (val_exact_match); logged beside it, rl_reward and rl_exact_match of the
sampled answers, the share of groups whose answers all tie (rl_tied_groups: no signal), and
the sampling's speed.

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
    config.train.rl.prompts = 4  # train.batch_size becomes 32 answers
    config.train.rl.max_tokens = 16  # "37 + 45 = 82" and the end of the turn are 13
    config.train.rl.temperature = 1.0
    config.train.rl.reward = "exact"
    config.train.steps = 200
    config.train.lr = 5e-5  # 2e-4 lowered the held-out exact match (docs/lab.md section 21)
    config.train.min_lr = 5e-6
    config.train.warmup_steps = 10
    config.train.log_every = 10
    config.train.eval_every = 50
    config.train.checkpoint_every = 50
    return config
