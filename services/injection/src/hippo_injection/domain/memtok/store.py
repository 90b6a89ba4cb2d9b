"""The memtok store: admission, merging, keep scores, eviction, the reply buffer,
consolidation, erasure and rebuild, and the key index kept as the item store's
projection (see ports.py for the change numbers). Blocking (the item store, the key
index, the model for value vectors): the service calls it on the model queue's thread."""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from hippo_injection.domain.memtok import policy as rules
from hippo_injection.domain.memtok.buffer import MemoryReplyBuffer
from hippo_injection.domain.memtok.models import (
    Memtok,
    Observation,
    Packing,
    Removed,
    Source,
    StoreModelMismatch,
    Vector,
    WriteReport,
    Written,
)
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.ports import (
    Embedder,
    ItemStore,
    KeyIndex,
    ReplyBuffer,
    StateMaker,
    ValueMaker,
)

log = logging.getLogger(__name__)

_NAMESPACE = uuid.UUID("9c1d7a52-0f0b-4b7e-8f7e-1d5e0b6c3a21")
ATTEND_LAYER = "attend_layer"  # meta: the first layer whose values the states keep
COST = {Packing.FLOAT16: 1.0, Packing.INT8: 0.5}  # slots an item takes by value packing
# Changes read per step when the key index catches up: bounds one read's size after a
# long absence (a step's items come with their vectors).
FEED_STEP = 1000


def normal(word: str) -> str:
    return "".join(ch for ch in word.casefold() if ch.isalnum())


def unit(v: npt.NDArray[np.floating[Any]]) -> Vector:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


def _operator_count(item: Memtok) -> int:
    return item.count if item.source is Source.OPERATOR else 0


class MemtokStore:
    def __init__(
        self,
        items: ItemStore,
        keys: KeyIndex,
        embedder: Embedder,
        values: ValueMaker,
        policy: Policy,
        *,
        buffer: ReplyBuffer | None = None,
        verify_model: bool = True,
        attend: StateMaker | None = None,
    ) -> None:
        """`verify_model=False` only for `rebuild`: the store may belong to another model.
        `buffer`: where reply words wait (default: this process's memory). `attend`: new
        items keep their source words' attendable states too (issue 20), made by it."""
        if attend is not None and attend.model_id != values.model_id:
            raise ValueError("attendable states and value vectors must come from one model")
        self.items = items
        self.keys = keys
        self.embedder = embedder
        self.values = values
        self.attend = attend
        self.policy = policy
        self.buffer: ReplyBuffer = buffer if buffer is not None else MemoryReplyBuffer()
        if verify_model:
            self._check_model()
        self.sync()

    # -- model identity ---------------------------------------------------------

    def _identity(self) -> dict[str, str]:
        """What the store's vectors and states were made with (its meta)."""
        want = {"model_id": self.values.model_id, "layer": str(self.values.layer)}
        if self.attend is not None:
            want[ATTEND_LAYER] = str(self.attend.from_layer)
        return want

    def _check_model(self) -> None:
        want = self._identity()
        meta = self.items.claim_meta(want)  # a new store becomes this model's
        if meta.get("model_id") != want["model_id"] or meta.get("layer") != want["layer"]:
            raise StoreModelMismatch(
                f"the memtok store holds value vectors of {meta.get('model_id')} at layer "
                f"{meta.get('layer')}, this service runs {want['model_id']} at layer "
                f"{want['layer']}; run `hippo memtok rebuild`"
            )
        if ATTEND_LAYER in want and meta.get(ATTEND_LAYER) != want[ATTEND_LAYER]:
            raise StoreModelMismatch(
                f"the memtok store holds attendable states from layer {meta.get(ATTEND_LAYER)}, "
                f"this service attends from layer {want[ATTEND_LAYER]}; run `hippo memtok rebuild`"
            )

    def rebuild(self) -> int:
        """Value vectors again from the source words, for the current model and layer;
        then the store is marked as that model's. Returns the items rebuilt."""
        done = 0
        for tenant, user in self.items.users():
            with self.items.writing(tenant, user):
                batch = self.items.by_user(tenant, user)
                if not batch:
                    continue
                sources = [m.source_words for m in batch]
                vectors = self.values.values(sources)
                states = self.attend.states(sources) if self.attend is not None else None
                fresh = [
                    replace(
                        m,
                        value=vectors[i],
                        layer=self.values.layer,
                        model_id=self.values.model_id,
                        states=states[i] if states is not None else None,
                    )
                    for i, m in enumerate(batch)
                ]
                self._follow(self.items.put(fresh), fresh)
                done += len(fresh)
        self.items.set_meta(self._identity())
        log.info("memtok rebuild: %d items for %s", done, self.values.model_id)
        return done

    # -- the key index as the item store's projection ----------------------------

    def reindex_keys(self) -> None:
        """The key index again from the item store (its source of truth)."""
        # The head is read first: a change another replica makes meanwhile is replayed
        # by the next sync (replaying one is harmless: it reads the item as it is).
        head = self.items.head()
        self.keys.clear()
        n = 0
        for tenant, user in self.items.users():
            items = self.items.by_user(tenant, user)
            self.keys.upsert(items, 0)
            n += len(items)
        self.keys.upsert([], head)
        log.info("memtok key index rebuilt: %d items, up to change %d", n, head)

    def sync(self) -> int:
        """Bring the key index up to the item store's last change; the items it touched
        (-1: it was rebuilt). With one writer this only happens at open, after a crash
        between a write and its index update; with several, before every search."""
        head = self.items.head()
        applied = self.keys.applied_seq()
        if applied == head:
            return 0
        if applied > head:
            # The store went back (restored, or another store): not this index's source.
            self.reindex_keys()
            return -1
        touched = 0
        while applied < head:
            upto = min(head, applied + FEED_STEP)
            changes = self.items.changes(applied, upto)
            if changes is None:
                self.reindex_keys()
                return -1
            gone: dict[str, list[str]] = {}
            for tenant, memtok_id in changes.gone:
                gone.setdefault(tenant, []).append(memtok_id)
            # Deletions keep the old mark: a crash before the upsert below (which moves
            # the mark to `upto`) replays the whole step.
            for tenant, ids in gone.items():
                self.keys.delete(tenant, ids, applied)
            self.keys.upsert(changes.live, upto)
            touched += len(changes.live) + len(changes.gone)
            applied = upto
        return touched

    def _follow(
        self, seq: int, written: Sequence[Memtok] = (), tenant: str = "", gone: Sequence[str] = ()
    ) -> None:
        """The key index after our write numbered `seq`: applied directly when the
        index holds every earlier change (always, with one writer), else from the
        change feed, which holds ours too (another replica wrote in between)."""
        if seq <= 0:
            return
        applied = self.keys.applied_seq()
        if applied == seq - 1:
            if gone:
                self.keys.delete(tenant, gone, seq)
            else:
                self.keys.upsert(written, seq)
        elif applied < seq:
            self.sync()

    # -- admission --------------------------------------------------------------

    def admit(
        self,
        tenant: str,
        user: str,
        observations: Sequence[Observation],
        now_us: int,
        source: Source = Source.OPERATOR,
    ) -> WriteReport:
        p = self.policy
        report = WriteReport()
        ranked = [o for o in observations if o.rank >= p.min_rank]
        if not ranked and source is Source.OPERATOR and observations:
            best = max(observations, key=lambda o: o.rank)
            if best.rank >= p.min_rank_best:
                ranked = [best]  # the statement's best word (Policy.min_rank_best)
        for o in observations:
            if not any(o is r for r in ranked):
                report.written.append(Written(o.word, "rejected", reason="below_min_rank"))
        if not ranked:
            return report
        keys = self.embedder.embed([o.source_words for o in ranked])
        values = self.values.values([o.source_words for o in ranked])
        with self.items.writing(tenant, user):
            if self.items.shared:
                self.sync()  # merge targets another replica wrote are candidates too
            for i, obs in enumerate(ranked):
                key = unit(np.asarray(keys[i], dtype=np.float32))
                target = self._merge_target(tenant, user, obs, key)
                if target is not None:
                    merged = self._merge(target, obs, key, values[i], now_us, source)
                    report.written.append(merged)
                    continue
                if not self._make_room(tenant, user, now_us, report):
                    report.written.append(Written(obs.word, "rejected", reason="store_full"))
                    continue
                item = self._new(tenant, user, obs, key, values[i], now_us, source)
                if self.attend is not None:
                    item.states = self.attend.states([obs.source_words])[0]
                self._follow(self.items.put([item]), [item])
                report.written.append(Written(obs.word, "new", item.id, count=item.count))
        return report

    def _merge_target(self, tenant: str, user: str, obs: Observation, key: Vector) -> Memtok | None:
        hits = self.keys.search(tenant, user, key, 8)
        near = {i: s for i, s in hits if s >= self.policy.merge_similarity}
        if not near:
            return None
        word = normal(obs.word)
        same = [m for m in self.items.get(tenant, user, list(near)) if normal(m.word) == word]
        return max(same, key=lambda m: near[m.id]) if same else None

    def _merge(
        self,
        item: Memtok,
        obs: Observation,
        key: Vector,
        value: Vector,
        now_us: int,
        source: Source,
    ) -> Written:
        if source is not Source.OPERATOR:
            # The model may not reinforce its own wording: no count, no mean, no date.
            return Written(obs.word, "seen", item.id, count=item.count)
        n = item.count
        item.key = unit((item.key * n + key) / (n + 1))
        item.value = ((item.value * n + value) / (n + 1)).astype(np.float32)
        item.count = n + 1
        item.rank_max = max(item.rank_max, obs.rank)
        item.surprise = max(item.surprise, obs.surprise)
        item.emphasis = max(item.emphasis, obs.emphasis)
        item.stakes = max(item.stakes, obs.stakes)
        item.conditional = item.conditional or obs.conditional
        item.keep = rules.keep_for(item, self.policy)
        item.source = Source.OPERATOR
        item.last_seen_us = max(item.last_seen_us, now_us)
        self._follow(self.items.put([item]), [item])
        return Written(obs.word, "merged", item.id, count=item.count)

    def _new(
        self,
        tenant: str,
        user: str,
        obs: Observation,
        key: Vector,
        value: Vector,
        now_us: int,
        source: Source,
    ) -> Memtok:
        name = f"{tenant}\x1f{user}\x1f{normal(obs.word)}\x1f{obs.source_words}\x1f{now_us}"
        grace = int(self.policy.grace_days * rules.US_PER_DAY)
        return Memtok(
            id=str(uuid.uuid5(_NAMESPACE, name)),
            tenant=tenant,
            user=user,
            word=obs.word,
            source_words=obs.source_words,
            key=key,
            value=np.asarray(value, dtype=np.float32),
            layer=self.values.layer,
            model_id=self.values.model_id,
            count=1,
            keep=rules.keep_of(obs, self.policy),
            rank_max=obs.rank,
            surprise=obs.surprise,
            emphasis=obs.emphasis,
            stakes=obs.stakes,
            conditional=obs.conditional,
            source=source,
            created_us=now_us,
            last_seen_us=now_us,
            grace_until_us=now_us + grace,
        )

    # -- capacity ---------------------------------------------------------------

    def _make_room(self, tenant: str, user: str, now_us: int, report: WriteReport) -> bool:
        """Free one slot if the user's store is full: first pack weak items to int8
        (half a slot each), then delete the lowest keep score (count breaks ties). Items
        in their grace period are never touched. False: no room could be made."""
        p = self.policy
        if self.items.count(tenant, user) + 1 <= p.capacity:
            return True  # room even if every item took a whole slot: no need to read them
        items = self.items.by_user(tenant, user)
        used = sum(COST[m.packing] for m in items)
        if used + 1.0 <= p.capacity:
            return True
        evictable = sorted((m for m in items if m.grace_until_us <= now_us), key=rules.eviction_key)
        packed: list[Memtok] = []
        for m in evictable:
            if used + 1.0 <= p.capacity:
                break
            if m.packing is Packing.FLOAT16 and m.keep < p.compress_below:
                m.packing = Packing.INT8
                used -= 0.5
                packed.append(m)
                report.removed.append(Removed(m.id, m.word, "compressed", m.keep, m.count))
        if packed:
            self._repack_states(tenant, user, packed)
            self._follow(self.items.put(packed), packed)
        victims: list[Memtok] = []
        for m in evictable:
            if used + 1.0 <= p.capacity:
                break
            victims.append(m)
            used -= COST[m.packing]
            report.removed.append(Removed(m.id, m.word, "evicted", m.keep, m.count))
        if victims:
            ids = [m.id for m in victims]
            self._follow(self.items.delete(tenant, user, ids), tenant=tenant, gone=ids)
        return used + 1.0 <= p.capacity

    # -- reply buffer -----------------------------------------------------------

    def buffer_reply(
        self, tenant: str, user: str, observations: Sequence[Observation], now_us: int
    ) -> int:
        """The reply's ranked words wait here (a short, per-user buffer, in memory) until
        the next operator query: only the words it echoes are stored."""
        buffer: OrderedDict[str, tuple[Observation, int]] = OrderedDict()
        for obs in observations:
            if obs.rank >= self.policy.min_rank and normal(obs.word):
                buffer[normal(obs.word)] = (obs, now_us)
                while len(buffer) > self.policy.reply_buffer:
                    buffer.popitem(last=False)
        with self.items.writing(tenant, user):
            # A new reply replaces the previous one's words.
            self.buffer.replace(tenant, user, list(buffer.values()))
        return len(buffer)

    def promote(self, tenant: str, user: str, query: str, now_us: int) -> WriteReport:
        """Store the buffered reply words that `query` echoes (as model items); discard
        the rest."""
        with self.items.writing(tenant, user):
            buffer = self.buffer.take(tenant, user)
            if not buffer:
                return WriteReport()
            words = {normal(w) for w in query.split()}
            echoed = [obs for obs, _ in buffer if normal(obs.word) in words]
            report = (
                self.admit(tenant, user, echoed, now_us, Source.MODEL) if echoed else WriteReport()
            )
        report.promoted = [o.word for o in echoed]
        return report

    def buffered(self, tenant: str, user: str) -> list[str]:
        return [obs.word for obs, _ in self.buffer.peek(tenant, user)]

    # -- reads ------------------------------------------------------------------

    def search(self, tenant: str, user: str, key: Vector, limit: int) -> list[tuple[Memtok, float]]:
        if self.items.shared:
            # One read of the feed's head when nothing changed: what any replica wrote
            # before this call is found (read-your-writes whichever replica answers).
            self.sync()
        hits = self.keys.search(tenant, user, unit(np.asarray(key, dtype=np.float32)), limit)
        # Items are read back from the store: an index entry whose item is gone (erased
        # by another replica, not yet applied here) never reaches a caller.
        found = {m.id: m for m in self.items.get(tenant, user, [i for i, _ in hits])}
        return [(found[i], s) for i, s in hits if i in found]

    def forget(self, tenant: str, user: str) -> int:
        """Erase the user: items, recorded mode and buffered reply words, in the store
        (scrubbed as far as its engine allows) and in this process's key index; other
        replicas' indexes drop the keys at their next sync. Returns the items erased."""
        with self.items.writing(tenant, user):
            ids, seq = self.items.erase(tenant, user)
            self.buffer.drop(tenant, user)
            self._follow(seq, tenant=tenant, gone=ids)
        return len(ids)

    # -- scheduled work -----------------------------------------------------------

    def consolidate(self, tenant: str, user: str) -> WriteReport:
        """Merge near-duplicates (same word, keys within the merge distance: counts add,
        vectors average by count) and pack weak items to int8. Never deletes for age."""
        with self.items.writing(tenant, user):
            return self._consolidate(tenant, user)

    def _consolidate(self, tenant: str, user: str) -> WriteReport:
        p = self.policy
        report = WriteReport()
        # Operator items survive a merge before model items, higher counts first.
        items = sorted(
            self.items.by_user(tenant, user),
            key=lambda m: (m.source is not Source.OPERATOR, -m.count, m.created_us),
        )
        gone: set[str] = set()
        changed: dict[str, Memtok] = {}
        for m in items:
            if m.id in gone:
                continue
            for other in items:
                if other.id == m.id or other.id in gone or normal(other.word) != normal(m.word):
                    continue
                if float(m.key @ other.key) < p.merge_similarity:
                    continue
                total = m.count + other.count
                m.key = unit((m.key * m.count + other.key * other.count) / total)
                m.value = ((m.value * m.count + other.value * other.count) / total).astype(
                    np.float32
                )
                # Only operator items raise counts: a model item adds its vector, not a count.
                m.count = max(1, _operator_count(m) + _operator_count(other))
                m.rank_max = max(m.rank_max, other.rank_max)
                m.surprise = max(m.surprise, other.surprise)
                m.emphasis = max(m.emphasis, other.emphasis)
                m.stakes = max(m.stakes, other.stakes)
                m.conditional = m.conditional or other.conditional
                m.keep = rules.keep_for(m, p)
                m.last_seen_us = max(m.last_seen_us, other.last_seen_us)
                m.created_us = min(m.created_us, other.created_us)
                if other.source is Source.OPERATOR:
                    m.source = Source.OPERATOR
                gone.add(other.id)
                changed[m.id] = m
                report.removed.append(
                    Removed(other.id, other.word, "merged", other.keep, other.count)
                )
        packed: list[Memtok] = []
        for m in items:
            if m.id not in gone and m.packing is Packing.FLOAT16 and m.keep < p.compress_below:
                m.packing = Packing.INT8
                changed[m.id] = m
                packed.append(m)
                report.removed.append(Removed(m.id, m.word, "compressed", m.keep, m.count))
        self._repack_states(tenant, user, packed)
        if changed:
            kept = list(changed.values())
            self._follow(self.items.put(kept), kept)
        if gone:
            ids = sorted(gone)
            self._follow(self.items.delete(tenant, user, ids), tenant=tenant, gone=ids)
        return report

    def _repack_states(self, tenant: str, user: str, items: list[Memtok]) -> None:
        """Items compressed: their stored states go back with them, to be packed as the
        items now are (int8)."""
        if not items:
            return
        stored = self.items.states(tenant, user, [m.id for m in items])
        for m in items:
            m.states = stored.get(m.id)

    def mark_resurface(self, tenant: str, user: str, memtok_id: str, at_us: int) -> bool:
        with self.items.writing(tenant, user):
            found = self.items.get(tenant, user, [memtok_id])
            if not found:
                return False
            found[0].resurface_at_us = at_us
            self._follow(self.items.put(found), found)
        return True

    def resurface(self, tenant: str, user: str, now_us: int) -> list[Memtok]:
        """Marked items whose time has come: they count as seen now (full influence
        again) and their mark is cleared."""
        with self.items.writing(tenant, user):
            due = [
                m
                for m in self.items.by_user(tenant, user)
                if m.resurface_at_us and m.resurface_at_us <= now_us
            ]
            for m in due:
                m.last_seen_us = now_us
                m.resurface_at_us = 0
            if due:
                self._follow(self.items.put(due), due)
        return due

    def trim_feed(self, now_us: int, retention_us: int) -> int:
        """The change feed's records of items deleted longer than `retention_us` ago are
        dropped (cluster mode; nothing to do with one writer). A replica whose index
        is further behind rebuilds it from the items."""
        return self.items.trim_changes(now_us - retention_us)
