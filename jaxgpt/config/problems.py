"""How a config section reports what is wrong with it: every problem at once, each phrased
`section.field=value <what fixes it>`, raised together as one ConfigError line."""

from jaxgpt.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration that cannot describe a working model; the message says how to fix it."""


def is_whole_number(value) -> bool:
    """An int that is not a bool (True would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


class Problems:
    """What is wrong with one section. The checks below are the shapes most fields share; a
    field with a rule of its own calls `add` with its own requirement."""

    def __init__(self, section: str, values):
        self.section, self.values, self.found = section, values, []

    def add(self, field: str, requirement: str) -> None:
        self.found.append(f"{self.section}.{field}={getattr(self.values, field)!r} {requirement}")

    def positive_integers(self, *fields: str) -> None:
        for field in fields:
            value = getattr(self.values, field)
            if not is_whole_number(value) or value <= 0:
                self.add(field, "must be a positive integer")

    def whole_number(self, field: str, meaning: str) -> bool:
        """A count that may be 0 ("must be a whole number {meaning}"); whether it is one."""
        value = getattr(self.values, field)
        if is_whole_number(value) and value >= 0:
            return True
        self.add(field, f"must be a whole number {meaning}")
        return False

    def positive(self, *fields: str) -> None:
        for field in fields:
            if not getattr(self.values, field) > 0:
                self.add(field, "must be positive")

    def not_negative(self, *fields: str) -> None:
        for field in fields:
            if not getattr(self.values, field) >= 0:
                self.add(field, "must be >= 0")

    def below_one(self, *fields: str) -> None:
        """Rates and moments in [0, 1): dropout, Adam's betas, momentum."""
        for field in fields:
            if not 0 <= getattr(self.values, field) < 1:
                self.add(field, "must be in [0, 1)")

    def share(self, field: str, example: str = "") -> None:
        """A share strictly between 0 and 1 (a held-out fraction, a masking rate)."""
        if not 0 < getattr(self.values, field) < 1:
            self.add(field, "must be between 0 and 1 (exclusive)" + example)

    def one_of(self, field: str, allowed) -> None:
        if getattr(self.values, field) not in allowed:
            self.add(field, f"is not one of {', '.join(map(repr, allowed))}")

    def include(self, other: "Problems") -> None:
        """A nested section's problems (model.moe, model.rope_scaling) reported with this one's."""
        self.found.extend(other.found)

    def raise_if_any(self) -> None:
        if self.found:
            raise ConfigError("invalid config: " + "; ".join(self.found))
