"""What a run is: the model (model.py), the data, the training and the device mesh (run.py), each
a frozen dataclass validated when it is built, in one way (problems.py): every problem listed as
`section.field=value` and what would fix it, raised together as one ConfigError line. So a model
can never be built from an inconsistent description, and a user sees every mistake at once.

Config files and the command line reach these through jaxgpt/config_files.py; what a resumed run
may change is in jaxgpt/job/resume.py. The names below are the ones the rest of jaxgpt imports.
"""

from jaxgpt.config.model import (
    ACTIVATIONS,
    ATTENTION_KERNELS,
    DTYPES,
    NORM_POSITIONS,
    NORMS,
    OBJECTIVES,
    POSITIONS,
    REMAT_POLICIES,
    ROPE_PAIRINGS,
    ROPE_SCALINGS,
    MixtureOfExperts,
    ModelConfig,
    RopeScaling,
    default_mlp_hidden,
)
from jaxgpt.config.problems import ConfigError
from jaxgpt.config.run import (
    BUILTIN_SOURCES,
    DataConfig,
    MeshConfig,
    Reinforcement,
    RunConfig,
    TrainConfig,
    run_config_from_dict,
    source_kind,
    with_train,
)

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_KERNELS",
    "BUILTIN_SOURCES",
    "DTYPES",
    "NORMS",
    "NORM_POSITIONS",
    "OBJECTIVES",
    "POSITIONS",
    "REMAT_POLICIES",
    "ROPE_PAIRINGS",
    "ROPE_SCALINGS",
    "ConfigError",
    "DataConfig",
    "Reinforcement",
    "MeshConfig",
    "MixtureOfExperts",
    "ModelConfig",
    "RopeScaling",
    "RunConfig",
    "TrainConfig",
    "default_mlp_hidden",
    "run_config_from_dict",
    "source_kind",
    "with_train",
]
