"""The memtok store against the served model: LLM1 salience ranks words, admission keeps
the rare ones, `hippo memtok rebuild` moves a store to this model (real Gemma 3 270M)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from injection_harness import MODEL_DIR
from memtok_fakes import BagEmbedder, FakeValues, close, obs, open_store

from hippo_injection.__main__ import open_store as open_real
from hippo_injection.adapters.engine import TransformersEngine
from hippo_injection.domain.memtok import salience
from hippo_injection.domain.memtok.models import StoreModelMismatch
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.values import EngineValues
from hippo_injection.settings import InjectionSettings

T0 = 1_760_000_000_000_000
FACT = "My daughter Ingrid is allergic to peanuts, so never order satay for her."


def test_salience_ranks_rare_words_above_function_words(engine: TransformersEngine) -> None:
    scored = salience.score_text(engine, FACT)
    ranked = {o.word: o for o in salience.observe(FACT, scored, Policy())}
    assert set(ranked) >= {"Ingrid", "satay", "to", "her"}
    for rare in ("Ingrid", "satay"):
        for common in ("to", "her"):
            assert ranked[rare].rank > ranked[common].rank
    assert ranked["Ingrid"].surprise > 10  # a rare name is surprising (nats)
    assert ranked["never"].conditional  # the sentence says "never": the bonus applies
    admitted = [o.word for o in ranked.values() if o.rank >= Policy().min_rank]
    assert "Ingrid" in admitted and "to" not in admitted and "her" not in admitted


def test_real_values_and_rebuild_from_another_model(
    engine: TransformersEngine, tmp_path: Path
) -> None:
    fake = FakeValues("another-model", layer=3, hidden=engine.info.hidden_size)
    store = open_store(tmp_path, values=fake)
    store.admit("t", "u", [obs("Ingrid", context="My daughter")], T0)
    close(store)
    settings = InjectionSettings(data_dir=str(tmp_path), model_dir=str(MODEL_DIR))
    with pytest.raises(StoreModelMismatch, match="another-model"):
        open_real(settings, engine, BagEmbedder())
    env = {
        **os.environ,
        "HIPPO_INJECTION_DATA_DIR": str(tmp_path),
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HF_HUB_OFFLINE": "1",
    }
    # `hippo memtok rebuild` runs the injection package's own console script.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "hippo"), "memtok", "rebuild"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"rebuilt 1 memtoks for {engine.info.model} at layer 3" in result.stdout
    store = open_real(settings, engine, BagEmbedder())  # accepted now
    try:
        (item,) = store.items.by_user("t", "u")
        want = EngineValues(engine, 3).values([item.source_words])[0]
        assert item.model_id == engine.info.model and item.value.shape == want.shape
        cos = float(item.value @ want / (np.linalg.norm(item.value) * np.linalg.norm(want)))
        assert cos > 0.999  # float16 storage
        assert np.linalg.norm(want) == pytest.approx(engine.info.layer_mean_norms[3], rel=1e-4)
    finally:
        store.keys.close()
        store.items.close()
