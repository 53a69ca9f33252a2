"""configs/tiny.py as an encoder: no causal mask, trained by BERT's masked-token prediction
(15% of the characters hidden, 80% of those shown as the mask token, 10% as a random one, 10%
unchanged; jaxgpt/training/masked.py), with RoPE. Its val_loss is the loss on the hidden characters
alone, read from both sides: not comparable with tiny's next-token loss. Then

    python -m jaxgpt fill --workdir runs/encoder_tiny --prompt "def __init__(se[MASK]f, x):"
"""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.model.causal = False
    config.model.objective = "masked"
    config.model.mask_rate = 0.15
    config.model.position = "rope"
    return config
