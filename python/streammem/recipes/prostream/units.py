"""Entity- and attribute-keyed memory units: the current value of every (entity, attribute) the stream
stated, with supersession only under the same key."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MemoryUnit", "KeyedUnits", "statement"]


def statement(entity: str, attribute: str, value: str) -> str:
    """A fact's canonical sentence, "Marlow's car is Fiat.": what a unit's embedding encodes, so that every
    unit is matched against a question in the same words whatever the turn's phrasing."""
    return f"{entity.strip()}'s {attribute.strip()} is {value.strip()}."


@dataclass
class MemoryUnit:
    """One fact kept by the memory: the newest statement of its (entity, attribute) key.

    ``key`` is :func:`fact_key` of entity and attribute; ``turn`` the index
    (from 0) of the turn that stated it and ``node`` that turn's leaf in the
    dialogue tree (evicted with the turn's other words long before the unit,
    as a rule); ``text`` the fact's canonical :func:`statement` ("Marlow's car
    is Fiat."): the distillate the memory keeps of the turn, what the unit
    costs and what a recall quotes; ``embedding`` the normalised (E,)
    embedding of that statement.  ``uses`` counts the statements of the
    key (the first, every restatement and update) and the recalls answered
    with the unit; ``last_use`` is the stream time of the latest of them.
    """

    unit_id: int
    entity: str
    attribute: str
    value: str
    key: tuple[str, str]
    turn: int
    node: int
    t: float
    speaker: str
    text: str
    embedding: torch.Tensor
    uses: int = 1
    last_use: float = 0.0

    @property
    def cost(self) -> int:
        """Tokens the unit puts in a prompt: its words + 1 (as a turn is priced)."""
        return len(self.text.split()) + 1


_SCALARS = ("unit_id", "entity", "attribute", "value", "turn", "node", "t", "speaker", "text", "uses", "last_use")


class KeyedUnits:
    """The units, one per (entity, attribute) key, with an entity index and an embedding matrix.

    :meth:`state` adds the newest statement of a key: a newer value of the
    same key supersedes the older unit (the newer inherits its uses plus one),
    the same value again adds a use to it; statements under different keys
    never touch each other, however similar their texts.  :meth:`remove` drops units (eviction).
    :meth:`nearest` is the recall's exact scan: the embeddings live in one
    matrix whose rows are reused as units come and go (its size is bounded by
    the most units ever held at once, so by the token budget).  Not
    thread-safe (ProStream's single thread owns it).
    """

    def __init__(self):
        self.units: dict[int, MemoryUnit] = {}
        self.by_key: dict[tuple[str, str], int] = {}
        self.by_entity: dict[str, set[int]] = {}
        self.cost = 0
        self._next_id = 0
        self._rows = torch.zeros(0, 0)  # (capacity, E) unit embeddings, one row per slot
        self._live = torch.zeros(0, dtype=torch.bool)  # (capacity,) whether a slot holds a unit
        self._slot_unit: list[int] = []  # slot -> unit id (-1: free)
        self._slot_of: dict[int, int] = {}  # unit id -> slot
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self.units)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def state(self, unit: MemoryUnit) -> tuple[MemoryUnit, MemoryUnit | None]:
        """Add the newest statement of ``unit.key``; returns (the key's current unit, the unit superseded).

        A new key: (``unit``, None).  The same value again (case aside): the
        older unit stays current with one more use, (older, None).  Another
        value: ``unit`` replaces the older unit and inherits its uses plus one,
        (``unit``, older).
        """
        old = self.units.get(self.by_key.get(unit.key, -1))
        if old is not None and old.value.lower() == unit.value.lower():
            old.uses += 1
            old.last_use = max(old.last_use, unit.last_use)
            return old, None
        if old is not None:
            self._pop(old.unit_id)
            unit.uses = old.uses + 1
        self._put(unit)
        return unit, old

    def remove(self, unit_ids) -> list[MemoryUnit]:
        return [self._pop(i) for i in unit_ids]

    def _put(self, unit: MemoryUnit) -> None:
        self.units[unit.unit_id] = unit
        self.by_key[unit.key] = unit.unit_id
        self.by_entity.setdefault(unit.key[0], set()).add(unit.unit_id)
        self.cost += unit.cost
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._slot_unit)
            self._slot_unit.append(-1)
            if slot == self._rows.shape[0]:
                grown = torch.zeros(max(16, 2 * slot), unit.embedding.shape[0])
                if slot:
                    grown[:slot] = self._rows[:slot]
                self._rows = grown
                self._live = torch.cat([self._live, torch.zeros(grown.shape[0] - slot, dtype=torch.bool)])
        self._rows[slot] = unit.embedding
        self._live[slot] = True
        self._slot_unit[slot] = unit.unit_id
        self._slot_of[unit.unit_id] = slot

    def _pop(self, unit_id: int) -> MemoryUnit:
        unit = self.units.pop(unit_id)
        del self.by_key[unit.key]
        ids = self.by_entity[unit.key[0]]
        ids.discard(unit_id)
        if not ids:
            del self.by_entity[unit.key[0]]
        self.cost -= unit.cost
        slot = self._slot_of.pop(unit_id)
        self._live[slot] = False
        self._slot_unit[slot] = -1
        self._free.append(slot)
        return unit

    def of_entities(self, entities) -> list[MemoryUnit]:
        """Units keyed on any of ``entities`` (normalised names), oldest first."""
        ids = sorted({i for e in entities for i in self.by_entity.get(e, ())})
        return [self.units[i] for i in ids]

    def nearest(self, query: torch.Tensor, k: int) -> list[int]:
        """Ids of the units whose embedding has one of the ``k`` highest dot products with ``query`` (every
        unit tied with the k-th best included, so the answer does not depend on the rows' order)."""
        if not self.units:
            return []
        n = len(self._slot_unit)
        scores = torch.where(self._live[:n], self._rows[:n] @ query, torch.tensor(float("-inf")))
        kth = torch.topk(scores, min(k, len(self.units))).values[-1]
        return sorted(self._slot_unit[i] for i in (scores >= kth).nonzero()[:, 0].tolist())

    # ---- checkpoints ---------------------------------------------------------
    def state_dict(self) -> dict:
        units = [self.units[i] for i in sorted(self.units)]
        state = {name: [getattr(u, name) for u in units] for name in _SCALARS}
        state["embedding"] = torch.stack([u.embedding for u in units]) if units else None
        state["next_id"] = self._next_id
        return state

    def load_state_dict(self, state: dict) -> None:
        from .extract import fact_key

        self.__init__()
        for i in range(len(state["unit_id"])):
            fields = {name: state[name][i] for name in _SCALARS}
            unit = MemoryUnit(**fields, key=fact_key(fields["entity"], fields["attribute"]),
                              embedding=state["embedding"][i].clone())
            if unit.key in self.by_key:
                raise ValueError(f"state holds two units under the key {unit.key}")
            self._put(unit)
        self._next_id = int(state["next_id"])
