"""The harder task of docs/lab.md section 21 ("Learning from rewards"): the chat model of
configs/sft_arithmetic.py, fine-tuned on sums of three numbers (builtin:arithmetic-chat-3,
"What is 37 + 45 + 12?" -> "37 + 45 + 12 = 94") from the base model that read sums of two.
In these 1,000 steps supervised fine-tuning stays far from every answer right (3.5-4.5% of
held-out conversations over three seeds); configs/rl_arithmetic_3.py goes on from here with a
reward. Longer (--config.train.steps=4000) it can pass a phase change and learn the task, or
not yet: seed 0 jumps from 4.7% at step 2,500 to 87.3% at 3,500, seeds 1 and 2 end at 13.5% and
6.0% (docs/lab.md section 21).

    python train.py --config configs/arithmetic.py --workdir runs/arithmetic
    python train.py --config configs/sft_arithmetic_3.py --workdir runs/sft_arithmetic_3
    python train.py --config configs/rl_arithmetic_3.py --workdir runs/rl_arithmetic_3"""

from configs import sft_arithmetic


def get_config():
    config = sft_arithmetic.get_config()
    config.data.source = "builtin:arithmetic-chat-3"
    return config
