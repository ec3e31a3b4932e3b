"""The importer under mutation fuzzing: 2,000 mutated models (byte flips, truncations, splices and
protobuf-level edits of the project's real models and a synthetic net), every one imported into a
valid IR or refused with a one-line UserError. The long run is `python -m qcompiler.frontend.fuzz`."""
import warnings

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qcompiler.errors import UserError
from qcompiler.frontend import import_onnx
from qcompiler.frontend.fuzz import check_one, default_seeds, fuzz, mutate, synthetic_seed

SEEDS = default_seeds()


def test_two_thousand_mutated_models_give_no_crash(tmp_path):
    stats = fuzz(SEEDS, count=2000, seed=0, workdir=str(tmp_path))
    assert stats.total == 2000
    assert not stats.crashes, "\n".join(f"[{w}] {m}\n{tb}" for w, m, _, tb in stats.crashes[:5])
    assert stats.imported > 100 and stats.user_errors > 1000      # both outcomes are exercised


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.graph.node[0].attribute[0].ClearField("ints") or setattr(m.graph.node[0].attribute[0], "type", 0),
     "Attribute pads has incorrect size"),
    (lambda m: m.graph.input[0].type.tensor_type.__setattr__("elem_type", 99), r"code 99 \(not an ONNX type\)"),
])
def test_fuzz_findings_stay_fixed(tmp_path, edit, message):
    """Crashes the fuzzer found once, now clean errors."""
    m = onnx.ModelProto.FromString(synthetic_seed())
    edit(m)
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(UserError, match=message) as e:
        import_onnx(str(p))
    assert "\n" not in str(e.value)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, len(SEEDS) - 1), rng=st.randoms(use_true_random=False))
def test_hypothesis_driven_mutations_give_an_ir_or_one_clean_error(tmp_path, which, rng):
    """The same mutators driven by hypothesis (its random source, so a failure shrinks to the
    fewest, smallest mutation choices): an importable IR or a one-line UserError, never a crash."""
    name, data = mutate(rng, SEEDS[which])
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # e.g. "dynamic batch dimension; using 1"
        assert check_one(str(p)) in ("imported", "user-error"), name

