"""The harder task of docs/lab.md section 21 ("Learning from rewards"): the chat model of
configs/sft_arithmetic.py, fine-tuned on sums of three numbers (builtin:arithmetic-chat-3,
"What is 37 + 45 + 12?" -> "37 + 45 + 12 = 94") from the base model that read sums of two.
Supervised fine-tuning alone stays far from every answer right; configs/rl_arithmetic_3.py
goes on from here with a reward.

    python train.py --config configs/arithmetic.py --workdir runs/arithmetic
    python train.py --config configs/sft_arithmetic_3.py --workdir runs/sft_arithmetic_3
    python train.py --config configs/rl_arithmetic_3.py --workdir runs/rl_arithmetic_3"""

from configs import sft_arithmetic


def get_config():
    config = sft_arithmetic.get_config()
    config.data.source = "builtin:arithmetic-chat-3"
    return config
