"""A deep, narrow model for the question the teaching texts ask of post-norm: does a deep stack
of post-norm blocks need a learning-rate warmup where pre-norm does not? 12 blocks of 64 wide
on configs/tiny.py's text, its learning rate (2e-3) and everything else fixed before any run
(docs/lab.md measures it):

    python -m jaxgpt compare --config configs/deep.py --vary model.norm_position=pre,post \\
        --vary train.warmup_steps=0,100 --seeds 3 --steps 600 --out runs/deep-norms
"""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.model.n_layer = 12
    config.model.d_model = 64
    config.model.n_head = 4
    return config
