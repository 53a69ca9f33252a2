"""What an answer is worth (train.rl.reward): a function of the prompt's text and the answer's,
called on the host, a batch of answers at a time, returning one float each.

  exact    1 where the answer is the reference answer (whitespace at its ends aside), else 0
  number   1 where the last number in the answer is the reference's last number, within
           train.rl.tolerance of its size (0: equal), else 0: "37 + 45 = 82" and "82" alike
  format   1 where the answer holds a number and ended its turn (was not cut off at
           train.rl.max_tokens), else 0: a rule about the answer's form, not its truth
  module:function
           your own, `def reward(prompt: str, completion: str) -> float`, imported once from
           the folder the command runs in or the Python path; one that names a third
           parameter `reference` (or takes **kwargs, as TRL's do) is given the reference
           answer too: the answer of a prompts:PATH line, or the conversation's first answer

A reward that raises, or returns NaN or what is not a number, stops the run with one line
naming the function and the prompt (jaxgpt/errors.py's UserError): nothing is trained on it.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Callable
from numbers import Real
from typing import NamedTuple

from jaxgpt.errors import UserError

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class Answer(NamedTuple):
    """One sampled answer and what it is judged against."""

    prompt: str
    completion: str
    reference: str
    finished: bool  # it ended its turn, not cut off at train.rl.max_tokens


def last_number(text: str) -> float | None:
    found = NUMBER.findall(text)
    return float(found[-1]) if found else None


def exact(answer: Answer, tolerance: float) -> float:
    return float(answer.completion.strip() == answer.reference.strip())


def number(answer: Answer, tolerance: float) -> float:
    said, wanted = last_number(answer.completion), last_number(answer.reference)
    if said is None or wanted is None:
        return 0.0
    return float(abs(said - wanted) <= tolerance * max(abs(wanted), 1.0))


def form(answer: Answer, tolerance: float) -> float:
    return float(answer.finished and last_number(answer.completion) is not None)


BUILTIN = {"exact": exact, "number": number, "format": form}


def reward_function(name: str, tolerance: float = 0.0) -> Callable[[list[Answer]], list[float]]:
    """train.rl.reward as a function of a batch of answers to their rewards, each checked."""
    if name in BUILTIN:
        builtin = BUILTIN[name]
        return lambda answers: [builtin(a, tolerance) for a in answers]
    yours = imported(name)
    wants_reference = takes_reference(yours)
    return lambda answers: [checked(name, a.prompt, _called(yours, name, a, wants_reference)) for a in answers]


def takes_reference(function: Callable) -> bool:
    """Whether a reward of your own asks for the reference answer: a parameter named
    `reference`, or **kwargs."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension callable without a signature
        return False
    return any(p.name == "reference" or p.kind is p.VAR_KEYWORD for p in parameters)


def imported(name: str) -> Callable:
    """`module:function`, imported; one line where it cannot be."""
    module_name, _, function_name = name.partition(":")
    # `python train.py` puts train.py's folder on the path, not the one the user is in (where
    # their my_rewards.py is): look there first, as uvicorn and gunicorn do for module:app.
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise UserError(
            f"train.rl.reward={name!r} cannot be imported ({error}); give module:function of a module in the "
            f"folder the command runs in ({here}) or on the Python path, or exact, number or format"
        ) from None
    if not callable(function):
        raise UserError(f"train.rl.reward={name!r} is not a function; give one of (prompt, completion) -> float")
    return function


def _called(function: Callable, name: str, answer: Answer, wants_reference: bool):
    try:
        if wants_reference:
            return function(answer.prompt, answer.completion, reference=answer.reference)
        return function(answer.prompt, answer.completion)
    except Exception as error:  # the user's code: whatever it raises stops the run in one line
        raise UserError(
            f"train.rl.reward {name} raised {type(error).__name__}: {error} on the prompt {answer.prompt!r}; "
            f"fix the function (it is called as reward(prompt, completion{', reference' * wants_reference}) -> float)"
        ) from None


def checked(name: str, prompt: str, value) -> float:
    """`value` as a float, or one line where it is not a finite number."""
    if not isinstance(value, Real) or not math.isfinite(float(value)):  # a bool is a number: True is 1
        raise UserError(
            f"train.rl.reward {name} returned {value!r} for the prompt {prompt!r}; a reward is a finite number "
            "(an int, a float or a bool)"
        )
    return float(value)
