"""Fitting a run to the machine it runs on: what the process may use (machine), process start-up
(runtime), hosts (distributed), one program per CPU core (core_parallel) or one over a mesh
(mesh_step), the training step chosen from those with its microbatches (step_choice), peak
FLOP/s for MFU, memory, and compiling for TPUs ahead of time. Uses the model and the training
core, never the lab or hf beside it."""
