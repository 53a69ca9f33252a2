"""The three private APIs jaxgpt reads, each where nothing public does the job, and what breaks
when a release moves them. Every caller falls back quietly (a slower CPU save; JAX's own choice
of platform; the interpreter's own exit), so without this test a move would go unnoticed: it
fails and says what moved."""

import importlib


def test_orbax_s_array_metadata_store_is_where_the_cpu_checkpoint_writer_finds_it():
    """jaxgpt/job/checkpoint.py registers orbax's ArrayHandler without the replica-parallel
    split for CPU devices, with orbax's default metadata store (which keeps a PRNG key's type);
    the store is not exported. If this fails, orbax moved it: find it in the installed orbax
    (its ArrayHandler's default argument) and import it from there, or CPU saves fall back to
    orbax's default handler (correct, and a slicing program compiled per replica per array)."""
    module = importlib.import_module("orbax.checkpoint._src.metadata.array_metadata_store")
    assert callable(module.Store), "orbax.checkpoint._src.metadata.array_metadata_store.Store moved"


def test_jax_s_look_at_the_pci_bus_is_where_the_platform_choice_finds_it():
    """jaxgpt/hardware/runtime.py asks JAX's own hardware_utils whether a TPU chip or an NVIDIA
    GPU is present, the look JAX makes before starting libtpu, to choose the CPU where libtpu is
    installed without a TPU. If this fails, JAX moved it: find the two functions in the
    installed jax (jax._src.xla_bridge calls them) and import them from there, or the choice
    falls back to JAX's own (with libtpu installed, it then tries a TPU that is not there first)."""
    hardware_utils = importlib.import_module("jax._src.hardware_utils")
    chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
    assert isinstance(chips, int) and isinstance(hardware_utils.has_visible_nvidia_gpu(), bool)


def test_atexit_s_run_of_the_exit_handlers_is_where_a_finished_command_calls_it():
    """jaxgpt/commands/cli.py's run_as_the_process runs the exit handlers itself, then ends the
    process without the interpreter's teardown (0.23-0.33 s of a one-step run). If this fails,
    Python moved the call: find it in the installed Python, or every command ends through the
    interpreter's own exit again (correct, and that much slower). What it does is tested where
    it is used (tests/test_train_cli.py): called here, it would run this process's own handlers,
    JAX's among them."""
    import atexit

    assert callable(getattr(atexit, "_run_exitfuncs", None)), "atexit._run_exitfuncs moved"
