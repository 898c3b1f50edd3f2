"""AdamWSettings: the optimizer settings every training backend takes, declared once.

Each backend's config struct inherits them, so the keys a user writes (``learning_rate``,
``weight_decay``, ``betas``, ``eps``, ``grad_clip``) and their checks are the same on every
backend. A backend whose defaults differ redeclares only that field's default; one whose config
spells a key its own way renames it (msgspec's ``rename``, which applies to the fields the
subclass declares, so that field is redeclared too: verl's ``optim.lr``), and the problems below
name the key as that config spells it.
"""

from __future__ import annotations

import math

import msgspec

ADAMW_KEYS: tuple[str, ...] = ("learning_rate", "weight_decay", "betas", "eps", "grad_clip")


class AdamWSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """AdamW (decoupled weight decay) and global gradient-norm clipping."""

    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping

    def adamw_problems(self) -> list[tuple[str, str]]:
        """``(key, message)`` for each setting that cannot work, in field order; the key as this
        struct's config spells it. Each backend raises them its own way (one, or all at once)."""
        keys = {f.name: f.encode_name for f in msgspec.structs.fields(self)}
        checks = [
            (
                self.learning_rate > 0 and math.isfinite(self.learning_rate),
                "learning_rate",
                f"must be a finite number > 0, got {self.learning_rate}",
            ),
            (
                self.weight_decay >= 0 and math.isfinite(self.weight_decay),
                "weight_decay",
                f"must be a finite number >= 0, got {self.weight_decay}",
            ),
            (
                all(0.0 <= beta < 1.0 for beta in self.betas),
                "betas",
                f"each must be in [0, 1), got {list(self.betas)}",
            ),
            (self.eps > 0 and math.isfinite(self.eps), "eps", f"must be a finite number > 0, got {self.eps}"),
            (
                not math.isnan(self.grad_clip),
                "grad_clip",
                "must be a number (<= 0 disables clipping), got nan",
            ),
        ]
        return [(keys[field], message) for ok, field, message in checks if not ok]
