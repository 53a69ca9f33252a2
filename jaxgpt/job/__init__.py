"""The training job around the pure step: the loop (trainer), what it keeps in a workdir
(checkpoints, metrics, the run's config), resuming, and stopping. Uses the core and the
fitting to hardware; never the commands."""
