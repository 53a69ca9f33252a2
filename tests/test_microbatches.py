"""Microbatches chosen by the run: from XLA's memory analysis of the compiled step, against a
budget (the CPU's cache, an accelerator's memory)."""

import math

import pytest
from conftest import small_run_config

from jaxgpt import sharding
from jaxgpt.config import MeshConfig, with_train
from jaxgpt.config_files import resolve
from jaxgpt.hardware import step_choice as choice
from jaxgpt.hardware.mesh_step import state_layout
from jaxgpt.training.program import training_program


@pytest.mark.parametrize(
    "batch, parallel, expected",
    [(12, 1, [1, 2, 3, 4, 6, 12]), (12, 2, [1, 2, 3, 6]), (8, 8, [1]), (6, 4, [])],
)
def test_choices_give_every_device_whole_rows(batch, parallel, expected):
    assert choice.microbatch_choices(batch, parallel) == expected


def test_the_fewest_fitting_microbatches_are_chosen_from_the_ends_compiles():
    fixed, activations = 2.0, 120.0
    compiled = []

    def temp_bytes(m):
        compiled.append(m)
        return fixed + activations / m

    choices = [1, 2, 3, 4, 6, 12]
    # 2 + 120/m <= 32 first holds at m = 4 (2 + 30 = 32; m = 3 gives 42)
    assert choice.choose_microbatches(choices, 32, temp_bytes)[0] == 4
    assert compiled == [1, 12, 4]  # the ends, then the count the model predicts to fit, to confirm it
    compiled.clear()
    assert choice.choose_microbatches(choices, 200, temp_bytes)[0] == 1 and compiled == [1]
    assert choice.choose_microbatches(choices, 1, temp_bytes)[0] == 12  # nothing fits: the least memory


def test_a_count_predicted_to_fit_that_does_not_gives_way_to_the_next():
    """The interpolation's model is close, not exact (moe_tiny's step on a 32 MiB cache: 2
    microbatches predicted at 30.2 MiB, compiled at 32.8): the count it predicts is compiled and
    measured, and where it is over budget the next count predicted to fit is tried."""
    compiled = []

    def temp_bytes(m):  # the model's 2 + 120/m, but 4 microbatches cost 3 more than it says
        compiled.append(m)
        return 2.0 + 120.0 / m + (3.0 if m == 4 else 0.0)

    chosen, measured = choice.choose_microbatches([1, 2, 3, 4, 6, 12], 32, temp_bytes)
    assert chosen == 6 and compiled == [1, 12, 4, 6] and measured[4] == 35.0


def test_where_the_compiler_refuses_one_microbatch_the_counts_are_bisected():
    """An accelerator's compiler can refuse a step outright (inf: no figure to interpolate from):
    the fewest counts that fit are found by bisection, log2 of the choices compiles."""
    compiled = []

    def temp_bytes(m):
        compiled.append(m)
        return math.inf if m < 4 else 2.0 + 120.0 / m

    choices = [1, 2, 3, 4, 6, 12]
    assert choice.choose_microbatches(choices, 32, temp_bytes)[0] == 4  # 2 + 120/4 = 32 fits
    assert compiled == [1, 12, 3, 4]  # the ends, then the middle of [1, 12] and of [3, 12]
    compiled.clear()
    assert choice.choose_microbatches(choices, 12.5, temp_bytes)[0] == 12 and compiled == [1, 12, 3, 4, 6]
    compiled.clear()
    assert choice.choose_microbatches(choices, 1, temp_bytes)[0] == 12 and compiled == [1, 12]  # none fits


@pytest.mark.slow  # XLA's analysis against the rule's model; the rule itself is tested quick above
def test_temporaries_shrink_as_the_interpolation_assumes():
    """The rule's model, fixed + activations / m, checked against XLA's analysis of a real
    step: the prediction for a middle count from the two ends is within a tenth."""
    program = training_program(resolve(small_run_config(batch_size=12), vocab_size=96))
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=1, tensor=1))
    layout, _ = state_layout(program, mesh)
    temp = {m: choice.step_temp_bytes(program, mesh, layout, m) for m in (1, 3, 12)}
    assert temp[1] > temp[3] > temp[12]
    activations = (temp[1] - temp[12]) / (1 - 1 / 12)
    predicted = temp[1] - activations + activations / 3
    assert abs(predicted - temp[3]) <= 0.1 * temp[3], (temp, predicted)


def test_an_explicit_setting_is_kept_and_zero_is_filled():
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=1, tensor=1))
    program = training_program(resolve(small_run_config(batch_size=8, microbatches=2), vocab_size=96))
    layout, _ = state_layout(program, mesh)
    assert choice.fill_microbatches(program, mesh, layout) == (program, None, None, None)
    auto = program.with_train(microbatches=0)
    filled, line, compiled, why = choice.fill_microbatches(auto, mesh, layout)
    chosen = filled.run.train.microbatches
    assert chosen in choice.microbatch_choices(8, 1)
    assert filled.model is program.model and filled.optimizer is program.optimizer  # built once, not again
    assert line == f"train.microbatches=0 -> {chosen} ({why})" and "budget" in why
    assert compiled is not None  # the chosen step was compiled while choosing: the trainer reuses it
    one_way = sharding.make_mesh(MeshConfig(data=8, fsdp=1, tensor=1))  # 8 rows over 8 devices
    one_way_layout, _ = state_layout(auto, one_way)
    filled = choice.fill_microbatches(auto, one_way, one_way_layout)
    assert filled[1:] == (None, None, None) and filled.program.run == with_train(auto.run, microbatches=1)


def test_a_measured_choice_is_remembered_for_the_next_run_of_the_same_config(tmp_path, monkeypatch):
    """A choice measured by the caller's candidates (the per-core plan's: a tracing and a compile
    or two) is made once per config, machine, code and JAX: the next run reads the count and its
    reasons back, and compiles nothing to choose."""
    monkeypatch.setattr(choice, "choices_dir", lambda: tmp_path)
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=1, tensor=1))
    program = training_program(resolve(small_run_config(batch_size=8, microbatches=0), vocab_size=96))
    layout, _ = state_layout(program, mesh)
    compiles = []

    def candidate(of):
        return lambda m: compiles.append(m) or choice.compile_step(of.with_train(microbatches=m), mesh, layout)

    first = choice.fill_microbatches(program, mesh, layout, candidate=candidate(program))
    assert compiles and "remembered" not in first.why and len(list(tmp_path.glob("*.json"))) == 1
    assert first.compiled is not None  # the chosen candidate, kept for the step
    compiles.clear()
    again = choice.fill_microbatches(program, mesh, layout, candidate=candidate(program))
    assert compiles == [] and again.program.run == first.program.run and again.compiled is None
    assert again.why == f"{first.why}; remembered from an earlier run's measuring"

    other = program.with_train(batch_size=4)  # any field differing: measured anew, remembered apart
    choice.fill_microbatches(other, mesh, layout, candidate=candidate(other))
    assert compiles and len(list(tmp_path.glob("*.json"))) == 2

    compiles.clear()
    for memo in tmp_path.glob("*.json"):
        memo.write_text('{"microbatches": 3')  # cut short: read as never written, measured again
    damaged = choice.fill_microbatches(program, mesh, layout, candidate=candidate(program))
    assert compiles and damaged.program.run == first.program.run and "remembered" not in damaged.why

    monkeypatch.setattr(choice, "choices_dir", lambda: None)  # the compilation cache off: nothing kept
    assert choice.choice_file(repr(program.run), mesh, 2**20) is None
