"""The training job around the pure step: the stages before the first step (setup), the loop
(trainer), what it keeps in a workdir (checkpoints, metrics, the run's config), resuming, and
stopping. Uses the model, the training core, the lab, the fitting to hardware and the data; never
the commands."""
