"""The pure core of training: the batch contract every source hands the engine (batch.py), the
masked objective's corruption (masked.py), the loss and the step over a state pytree
(train_step.py), the optimizer (optimizer.py) and the program that binds them for a run
(program.py). Uses the model; knows nothing of devices, files or processes."""
