"""The trainer's state in a checkpoint: one protocol, one registry, one reload path.

Every part of the loop that carries state across steps is a `Stateful` (`state_dict()` /
`load_state_dict()`): the step counters, early stopping, the spike detector, the rollback record
(which also holds the data position, gptforge.train.rollback), the W&B logger's run id, the
non-finite streak. Each is registered once, with the `Checkpointer`, into a `StateRegistry`;
the registry writes them all into trainer_state.pt and reloads them all from it, for `--resume`
and for a spike rollback alike. What a rollback keeps instead of reloading (the wall time spent,
the rollback record itself, the logger's run id) is said at registration, not in a second copy
of the reload code.

Saved layout: a component registered without a key puts its keys at the top level of
trainer_state.pt (`step`, `tokens_seen`, `elapsed_seconds`, `skipped_steps`, `best_val_loss`, ...,
as checkpoints have always had them); one registered under a key (`spikes`, `rollback`, `wandb`)
is saved under it. The engine adds model, optimizer, loss scaler and RNG states beside them
(gptforge.train.parallel.backend); the checkpointer adds the `data` record that --resume checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Stateful(Protocol):
    """A part of the training loop whose state a checkpoint carries."""

    def state_dict(self) -> dict[str, Any]:
        """Plain data (numbers, strings, lists, dicts) for trainer_state.pt."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned (from a checkpoint that may predate some keys)."""


class Fields:
    """Named entries of a plain dict (e.g. the trainer's step counters) as a `Stateful`.

    Args:
        values: the dict the trainer reads and updates; it is changed in place on a load.
        keys: the entries this component saves and restores (keys absent from a checkpoint keep
            their current value).
    """

    def __init__(self, values: dict[str, Any], keys: tuple[str, ...]):
        self.values, self.keys = values, keys

    def state_dict(self) -> dict[str, Any]:
        return {k: self.values[k] for k in self.keys}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values.update({k: state[k] for k in self.keys if k in state})


@dataclass
class _Entry:
    key: str | None
    component: Stateful
    on_rollback: bool


class StateRegistry:
    """The registered `Stateful` components of a run, saved and reloaded together."""

    def __init__(self):
        self._entries: list[_Entry] = []

    def register(self, key: str | None, component: Stateful, *, on_rollback: bool = True) -> None:
        """Add `component`.

        Args:
            key: its entry in trainer_state.pt, or None to put its own keys at the top level.
            on_rollback: whether a spike rollback reloads it from the checkpoint rolled back to
                (False: it is kept across the rollback and reloaded only on --resume).

        Raises:
            ValueError: `key` is registered already.
        """
        if key is not None and any(e.key == key for e in self._entries):
            raise ValueError(f"StateRegistry: {key!r} is registered already")
        self._entries.append(_Entry(key, component, on_rollback))

    def state_dict(self) -> dict[str, Any]:
        """Every component's state, in the saved layout (see the module docstring).

        Raises:
            ValueError: two top-level components save the same key.
        """
        out: dict[str, Any] = {}
        for e in self._entries:
            part = e.component.state_dict()
            if e.key is not None:
                part = {e.key: part}
            clash = out.keys() & part.keys()
            if clash:
                raise ValueError(f"StateRegistry: {sorted(clash)} saved by two components")
            out.update(part)
        return out

    def load_state_dict(self, saved: dict[str, Any], *, rollback: bool = False) -> None:
        """Reload every component from `saved` (trainer_state.pt as the engine loaded it).

        Args:
            rollback: a spike rollback (only components registered with on_rollback reload),
                else a --resume (all of them).

        A component saved under a key that `saved` lacks or holds empty (a checkpoint written
        before it existed, or with it switched off) keeps its current state.
        """
        for e in self._entries:
            if rollback and not e.on_rollback:
                continue
            if e.key is None:
                e.component.load_state_dict(saved)
            elif saved.get(e.key):
                e.component.load_state_dict(saved[e.key])
