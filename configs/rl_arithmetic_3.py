"""Learning from rewards on the harder task (docs/lab.md section 21): the chat model
configs/sft_arithmetic_3.py fine-tuned on sums of three numbers answers their first questions
itself, eight answers a question, and learns from which were exactly right, as
configs/rl_arithmetic.py does on sums of two.

    python train.py --config configs/arithmetic.py --workdir runs/arithmetic
    python train.py --config configs/sft_arithmetic_3.py --workdir runs/sft_arithmetic_3
    python train.py --config configs/rl_arithmetic_3.py --workdir runs/rl_arithmetic_3

From the 1,000-step SFT model RL gains 1-2 points; from inside the phase change of a longer SFT
run (--config.train.init_from=runs/sft_arithmetic_3_long --config.train.init_step=3000, or its
newest checkpoint) it gained 11-16 points in 300 steps on the seeds that had begun one (section 21)."""

from configs import rl_arithmetic


def get_config():
    config = rl_arithmetic.get_config()
    config.data.source = "builtin:arithmetic-chat-3"
    config.train.init_from = "runs/sft_arithmetic_3"
    config.train.rl.max_tokens = 24  # "98 + 21 + 94 = 213" and the end of the turn are 19
    config.train.rl.length = 56  # the longest question (25 tokens) and the longest answer
    config.train.lr = 1e-4  # 3e-4, rl_arithmetic's, drifted: 3.7% -> 2.5% exact by step 100 (docs/lab.md section 21)
    config.train.min_lr = 1e-5
    return config
