"""The mechanism contract: typed options, the privacy claim as an object, loud uncertified
releases, validated artifacts, bounded resources and the CLI built on these declarations."""

from __future__ import annotations

import ast
import json
import time
import warnings
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

import klrelease as kr
from klrelease.artifact import Release
from klrelease.cli import main
from klrelease.mechanisms import Mechanism, get_mechanism, mechanisms
from klrelease.mechanisms.base import MechanismOptions, describe_options
from klrelease.neighbours import Adjacency
from klrelease.warnings_ import PrivacyLeakWarning

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- typed options, every option


def _bad_values(kind: str) -> tuple[list, list]:
    """(values of the right type but out of range, values of a wrong type) for an option."""
    if kind.startswith("true|false"):
        return [], ["no", "off", "yes", 1, 0]
    if "numbers" in kind:
        return [(1.0, -1.0, 2.0)], ["abc", True]
    if kind.startswith(("number", "integer")):
        return [-1e9], ["abc", True, [1.0]]
    return ["nonsense"], [3, True]  # a choice among names (or a relation)


CASES = [(name, opt, kind) for name in mechanisms()
         for opt, kind, _, _ in describe_options(get_mechanism(name))]


@pytest.mark.parametrize(("name", "opt", "kind"), CASES)
def test_every_option_rejects_a_bad_value_and_a_bad_type(name, opt, kind):
    mech = get_mechanism(name)
    values, types = _bad_values(kind)
    if opt == "adjacency":
        values = ["sideways"]
    assert values or kind.startswith("true|false"), f"{name}.{opt}: no bad value derived"
    for bad in values + types:
        with pytest.raises(ValueError, match=rf"{opt}.*{name}.*accepted"):
            mech.validate_options({opt: bad})
    # and the declared default is itself valid
    mech.validate_options({opt: mech.options[opt]})


@pytest.mark.parametrize("name", mechanisms())
def test_unknown_option_names_are_rejected_listing_what_is_accepted(name):
    mech = get_mechanism(name)
    with pytest.raises(ValueError, match="unknown option") as info:
        mech.validate_options({"no_such_option": 1})
    for opt in mech.options:
        assert opt in str(info.value)


@pytest.mark.parametrize("name", mechanisms())
def test_unsupported_relation_is_one_clear_error(name):
    mech = get_mechanism(name)
    other = [a for a in Adjacency if a not in mech.relations]
    if not other:
        pytest.fail(f"{name} supports every relation; the test needs one it does not")
    with pytest.raises(ValueError, match="unsupported adjacency") as info:
        mech.validate_options({"adjacency": other[0].value})
    assert all(a.value in str(info.value) for a in mech.relations)


def test_option_names_are_consistent_across_mechanisms():
    names = {o for n in mechanisms() for o in get_mechanism(n).options}
    assert "cov_floor" not in names and "covariance_floor" in names
    for n in mechanisms():
        assert "adjacency" in get_mechanism(n).options


def test_booleans_must_be_true_or_false_in_the_api(iris):
    with pytest.raises(ValueError, match="bounds_from_data"):
        kr.plan(iris, None, epsilon=1, delta=1e-5, bounds_from_data="no")


def test_base_class_validates_before_plan_runs():
    calls = []

    class Probe(Mechanism):
        name = "probe"
        summary = "probe"

        class Options(MechanismOptions):
            flag: bool = False

        def plan(self, data, *, epsilon, delta, **options):
            calls.append(options)
            raise RuntimeError("stop")

    with pytest.raises(ValueError, match="flag"):
        Probe().plan(None, epsilon=1.0, delta=1e-5, flag="off")
    assert calls == []
    with pytest.raises(RuntimeError, match="stop"):
        Probe().plan(None, epsilon=1.0, delta=1e-5, flag=True)
    assert calls == [{"adjacency": "label-flip", "flag": True}]


TOY_MODULE = """
from __future__ import annotations

import dataclasses

from klrelease.mechanisms import register
from klrelease.mechanisms.baselines.gaussian_iid import GaussianIID


@register
class Toy(GaussianIID):
    name = "toy"
    summary = "gaussian-iid with one extra option, never certified"
    certified_relations = ()

    class Options(GaussianIID.Options):
        loud: bool = False

    def plan(self, data, *, epsilon, delta, loud=False, **options):
        p = GaussianIID.plan(self, data, epsilon=epsilon, delta=delta, **options)
        p.guarantee = dataclasses.replace(p.guarantee, certified=False)
        return p
"""


@pytest.fixture
def toy_module(monkeypatch, tmp_path):
    """A mechanism defined in a module outside the library, imported as a user would."""
    import importlib
    import sys

    from klrelease.mechanisms import unregister

    (tmp_path / "toy_mechanism.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "toy" not in mechanisms()
    try:
        yield importlib.import_module("toy_mechanism")
    finally:
        unregister("toy")
        sys.modules.pop("toy_mechanism", None)


def test_a_new_mechanism_in_one_module_is_listed_and_releases(toy_module, tmp_path, iris,
                                                              capsys):
    """A mechanism registers itself in its own module: importing it is the registration."""
    assert "toy" in mechanisms() and type(get_mechanism("toy")) is toy_module.Toy
    assert get_mechanism("toy").options["loud"] is False
    assert main(["mechanisms"]) == 0
    assert "toy" in capsys.readouterr().out
    assert main(["mechanisms", "toy"]) == 0
    assert "loud" in capsys.readouterr().out
    # release(): options validated like a built-in mechanism's
    with pytest.warns(PrivacyLeakWarning):
        rel = kr.release(iris, None, epsilon=1, delta=1e-5, mechanism="toy", loud=True)
    assert not rel.privacy.certified and rel.settings["loud"] is True
    assert Release.from_json(rel.to_json()).settings["loud"] is True
    for bad in ({"loud": "yes"}, {"loud": 1}, {"louder": True}):
        with pytest.raises(ValueError, match="loud"):
            kr.release(iris, None, epsilon=1, delta=1e-5, mechanism="toy", **bad)
    # the command line: --option parsed from the declaration, bad values exit 2
    out = tmp_path / "toy.json"
    args = ["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5",
            "--mechanism", "toy", "--out", str(out)]
    assert main([*args, "--option", "loud=maybe"]) == 2 and not out.exists()
    assert "loud" in capsys.readouterr().err
    assert main([*args, "--option", "loud=true"]) == 0
    doc = json.loads(out.read_text())
    assert doc["mechanism"] == "toy" and doc["settings"]["loud"] is True
    assert doc["privacy"]["certified"] is False
    assert main(["inspect", str(out)]) == 0
    assert "toy" in capsys.readouterr().out


def test_register_is_idempotent_for_a_class_and_refuses_a_taken_name(toy_module):
    from klrelease.mechanisms import register

    assert register(toy_module.Toy) is toy_module.Toy  # again: no-op
    clash = type("Clash", (toy_module.Toy,), {"name": "kl-certified"})
    with pytest.raises(ValueError, match="already registered"):
        register(clash)
    with pytest.raises(TypeError, match="Mechanism"):
        register(object)
    assert type(get_mechanism("kl-certified")).__name__ == "KLCertified"


def test_mechanisms_of_other_distributions_arrive_by_entry_point(toy_module, monkeypatch):
    import importlib.metadata

    from klrelease.mechanisms import ENTRY_POINT_GROUP, unregister
    from klrelease.mechanisms.registry import load_entry_points

    unregister("toy")
    ep = importlib.metadata.EntryPoint("toy", "toy_mechanism:Toy", ENTRY_POINT_GROUP)
    seen = []

    def fake_entry_points(*, group):
        seen.append(group)
        return [ep] if group == ENTRY_POINT_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    load_entry_points()
    assert seen == [ENTRY_POINT_GROUP] and "toy" in mechanisms()


def test_every_mechanism_of_the_mechanisms_package_is_registered():
    import inspect
    import pkgutil
    from importlib import import_module

    pkg = import_module("klrelease.mechanisms")

    defined = set()
    for info in pkgutil.walk_packages(pkg.__path__, prefix="klrelease.mechanisms."):
        module = import_module(info.name)
        defined |= {obj for obj in vars(module).values()
                    if isinstance(obj, type) and issubclass(obj, Mechanism)
                    and obj.__module__ == module.__name__ and not inspect.isabstract(obj)}
    assert len(defined) >= 7
    assert defined == {type(get_mechanism(n)) for n in mechanisms()}


# ---------------------------------------------------------------- the guarantee object


def test_guarantee_carries_relation_curve_and_dp_event(iris):
    p = kr.plan(iris, None, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid")
    g = p.guarantee
    assert g.certified and g.relation is Adjacency.LABEL_FLIP
    assert g.delta_at(1.0) == pytest.approx(1e-5, rel=1e-4)
    assert g.delta_at(2.0) < g.delta_at(1.0) < g.delta_at(0.5)
    assert isinstance(g.dp_event(), dp_accounting.GaussianDpEvent)
    lap = kr.plan(iris, None, epsilon=1.0, delta=1e-5, mechanism="laplace-iid",
                  variant="label-flip").guarantee
    assert lap.certified and lap.delta == 0 and lap.delta_at(1.0) == 0.0
    with pytest.raises(ValueError, match="not known"):
        lap.delta_at(0.5)
    with pytest.warns(PrivacyLeakWarning):
        rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="laplace-iid")
    assert not rel.privacy.certified
    paper = kr.plan(iris, None, epsilon=1.0, delta=1e-5, mechanism="laplace-iid").guarantee
    assert isinstance(paper.dp_event(), dp_accounting.NonPrivateDpEvent)
    with pytest.raises(ValueError, match="uncertified"):
        paper.delta_at(1.0)


def test_budget_accountant_refuses_overspending_and_uncertified(iris):
    acc = kr.BudgetAccountant(2.0, 1e-5)
    kr.release(iris, None, epsilon=1.0, delta=5e-6, mechanism="gaussian-iid", accountant=acc)
    kr.release(iris, None, epsilon=1.0, delta=5e-6, mechanism="gaussian-iid", accountant=acc)
    with pytest.raises(kr.BudgetExceeded, match="exceed"):
        # alone, this release has delta(2) = 1e-3 > 1e-5
        kr.release(iris, None, epsilon=3.0, delta=5e-6, mechanism="gaussian-iid",
                   accountant=acc)
    with pytest.raises(kr.BudgetExceeded, match="not certified"), warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        kr.release(iris, None, epsilon=0.1, delta=1e-6, mechanism="laplace-iid",
                   accountant=kr.BudgetAccountant(5.0, 1e-5))
    assert len(acc.spent) == 2 and acc.total_delta_at() <= 1e-5


def test_accountant_composes_gaussian_releases_tighter_than_summing():
    g = kr.plan(*_small(), epsilon=1.0, delta=1e-5, mechanism="gaussian-iid",
                bounds=(np.full(2, -3.0), np.full(2, 3.0))).guarantee
    acc = kr.BudgetAccountant(1.9, 1e-5)  # basic composition needs (2, 2e-5)
    acc.spend(g)
    acc.spend(g)
    assert acc.total_delta_at() <= 1e-5


def test_gaussian_releases_compose_exactly_and_agree_with_pld():
    """The accountant composes Gaussian curves in closed form; dp_accounting's PLD accountant
    (pessimistic) gives a delta at least as large and close to it."""
    from dp_accounting.pld import PLDAccountant

    from klrelease.privacy.guarantee import GaussianCurve

    mus = [0.27, 0.27, 0.5, 0.1]
    gs = [kr.Guarantee(1.0, 1e-5, "label-flip", True, "", curve=GaussianCurve(m)) for m in mus]
    acc = kr.BudgetAccountant(3.0, 1e-5)
    acc.spent = gs
    exact = acc.total_delta_at()
    assert exact == pytest.approx(GaussianCurve(sum(m * m for m in mus) ** 0.5).delta_at(3.0))
    pld = PLDAccountant(value_discretization_interval=1e-4)
    for m in mus:
        pld.compose(dp_accounting.GaussianDpEvent(1.0 / m))
    assert exact <= pld.get_delta(3.0) <= exact * 1.01 + 1e-15
    # with a curve that is not known, there is no composed curve (basic composition only)
    acc.spent = [*gs, kr.Guarantee(1.0, 1e-6, "label-flip", True, "")]
    with pytest.raises(ValueError, match="not known"):
        acc.total_delta_at()


PUBLIC_CLAIM_CASES = [(name, rel) for name in mechanisms()
                      for rel in get_mechanism(name).relations]


@pytest.mark.parametrize(("name", "relation"), PUBLIC_CLAIM_CASES)
def test_a_claim_known_before_the_data_is_the_plans_claim(iris, name, relation):
    """A ledger charges public_guarantee before the data is read: where a mechanism gives it,
    it must be the claim its plan makes (relation, flag, (epsilon, delta) and curve)."""
    mech = get_mechanism(name)
    opts = mech.validate_options({"adjacency": relation.value})
    bound = {"norm_bound": 12.0} if relation != Adjacency.LABEL_FLIP and not mech.uses_box \
        else {}
    for eps, dlt in ((0.5, 1e-6), (2.0, 1e-5)):
        g = mech.public_guarantee(epsilon=eps, delta=dlt, options=opts,
                                  n_samples=iris.n_samples, n_classes=iris.n_classes,
                                  n_features=iris.n_features)
        if g is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyLeakWarning)
            p = kr.plan(iris, None, epsilon=eps, delta=dlt, mechanism=name,
                        adjacency=relation.value, **bound).guarantee
        assert (g.epsilon, g.delta, g.neighbouring, g.certified) == (
            p.epsilon, p.delta, p.neighbouring, p.certified)
        assert type(g.curve) is type(p.curve)
        if g.curve is not None:
            assert g.curve == p.curve
    assert get_mechanism("kl-certified").public_guarantee(
        epsilon=1.0, delta=1e-5, options=get_mechanism("kl-certified").validate_options({}),
        n_samples=10, n_classes=2, n_features=1) is not None


def _small():
    rng = np.random.default_rng(0)
    return rng.normal(size=(60, 2)), np.repeat([0, 1, 2], 20)


# ---------------------------------------------------------------- loud and seeded


@pytest.mark.parametrize(("mechanism", "opts"), [
    ("kl-paper", {}),
    ("laplace-iid", {"variant": "paper"}),
    ("colored-gaussian", {"design": "data"}),
])
def test_uncertified_release_always_warns(iris, mechanism, opts):
    with pytest.warns(PrivacyLeakWarning):
        rel = kr.release(iris, None, epsilon=2.0, delta=1e-5, mechanism=mechanism, **opts)
    assert not rel.privacy.certified


@pytest.mark.parametrize("mechanism", ["gaussian-iid", "kl-certified"])
def test_seeded_release_is_never_certified(iris, mechanism):
    with pytest.warns(PrivacyLeakWarning, match="seeded"):
        rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism=mechanism, seed=4)
    assert not rel.privacy.certified and rel.randomness.seed == 4
    doc = json.loads(rel.to_json())
    doc["privacy"]["certified"] = True  # publish the seed AND claim a guarantee
    with pytest.raises(ValueError, match="tampered"):
        Release.from_json(json.dumps(doc))


def test_cli_seeded_release_prints_a_warning_line(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5",
               "--mechanism", "gaussian-iid", "--seed", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0 and "NOT certified" in err
    assert any(line.startswith("warning:") and "seeded" in line for line in err.splitlines())


# ---------------------------------------------------------------- artifacts validated on load


@pytest.fixture
def artifact(iris):
    rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid")
    return json.loads(rel.to_json())


def _load(doc):
    return Release.from_json(json.dumps(doc))


def test_artifact_round_trip_is_valid(artifact):
    assert _load(artifact).privacy.certified


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["privacy"].update(note="x"), "note"),
    (lambda d: d["privacy"].update(epsilon=-3), "epsilon"),
    (lambda d: d["privacy"].update(delta=1.5), "delta"),
    (lambda d: d["privacy"].update(neighbouring="sideways"), "neighbouring"),
    (lambda d: d["gmm"].update(weights=[0.5, 0.5, 0.5]), "weights"),
    (lambda d: d["gmm"]["covariances"][0][0].__setitem__(0, -5.0), "positive definite"),
    (lambda d: d["gmm"]["covariances"][1][0].__setitem__(1, 99.0), "symmetric"),
    (lambda d: d.update(feature_names=["a", "b"]), "feature_names"),
    (lambda d: d.update(mechanism="no-such"), "unknown mechanism"),
    (lambda d: d["settings"].update(bounds_from_data=True), "bounds_from_data"),
    (lambda d: d["randomness"].update(seed=3), "seed"),
    (lambda d: d.update(schema_version="1.0"), "schema"),
])
def test_invalid_artifacts_are_refused(artifact, edit, match):
    edit(artifact)
    with pytest.raises(ValueError, match=match):
        _load(artifact)


def test_tampered_claim_is_reported(iris, tmp_path, capsys):
    with pytest.warns(PrivacyLeakWarning):
        rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="kl-paper")
    doc = json.loads(rel.to_json())
    doc["privacy"]["certified"] = True
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tampered privacy claim" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- the CLI on the declarations


def _release_cli(tmp_path, *args):
    out = tmp_path / "r.json"
    rc = main(["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5",
               "--out", str(out), *args])
    return rc, out


def test_cli_boolean_option_no_is_an_error(tmp_path, capsys):
    rc, out = _release_cli(tmp_path, "--option", "bounds_from_data=no")
    assert rc == 2 and not out.exists()
    assert "true or false" in capsys.readouterr().err


def test_cli_norm_bound_option_and_bounds_features_work(tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        rc, out = _release_cli(tmp_path, "--mechanism", "kl-paper", "--option",
                               "adjacency=change-one-record", "--option", "norm_bound=10",
                               "--option", "max_iter=2")
    assert rc == 0, capsys.readouterr().err
    assert Release.load(out).options["norm_bound"] == 10.0
    out.unlink()
    rc, out = _release_cli(tmp_path, "--mechanism", "gaussian-iid", "--option",
                           "bounds=features")
    assert rc == 0 and Release.load(out).options["domain"] == "features"


def test_cli_box_with_a_mechanism_that_ignores_it_is_an_error(tmp_path, capsys):
    rc, out = _release_cli(tmp_path, "--mechanism", "kl-paper", "--lower", "0", "--upper", "9")
    assert rc == 2 and not out.exists()
    assert "does not use a public box of feature bounds (bounds=, --lower/--upper)" in \
        capsys.readouterr().err


def test_cli_declares_classes(tmp_path, capsys):
    X, y = _small()
    npz = tmp_path / "data.npz"
    np.savez(npz, X=X, y=y)
    for args in (["--classes", "0,1,2,3"], ["--option", "classes=0,1,2,3"]):
        out = tmp_path / "r.json"
        rc = main(["release", "--npz", str(npz), "--epsilon", "1", "--delta", "1e-5",
                   "--mechanism", "gaussian-iid", "--lower", "-4,-4", "--upper", "4,4",
                   "--option", "min_class_size=3", "--out", str(out), *args])
        # a declared class without rows: gaussian-iid's public class-size bound refuses it
        assert rc == 2 and not out.exists()
    rc = main(["release", "--npz", str(npz), "--epsilon", "1", "--delta", "1e-5",
               "--mechanism", "gaussian-iid", "--lower", "-4,-4", "--upper", "4,4",
               "--classes", "2,0,1", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert set(Release.load(out).gmm.classes) == {0, 1, 2}
    rc, out = _release_cli(tmp_path, "--classes", "a,b", "--force")
    assert rc == 2 and "bundled dataset declares its classes" in capsys.readouterr().err


def test_readme_record_level_example_runs(tmp_path, capsys):
    text = (ROOT / "README.md").read_text()
    assert "adjacency=replace-one --norm-bound 10" in text
    X, y = _small()
    npz = tmp_path / "data.npz"
    np.savez(npz, X=X, y=y)
    out = tmp_path / "r.json"
    rc = main(["release", "--npz", str(npz), "--epsilon", "1", "--delta", "1e-5",
               "--classes", "0,1,2", "--option", "adjacency=replace-one",
               "--norm-bound", "10", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert Release.load(out).privacy.neighbouring == "replace-one"


def test_cli_lists_a_mechanisms_options(capsys):
    assert main(["mechanisms", "kl-certified"]) == 0
    text = capsys.readouterr().out
    for opt, _kind, _, _ in describe_options(get_mechanism("kl-certified")):
        assert opt in text
    assert "true|false" in text and "label-flip" in text


def test_cli_names_the_public_bounds_a_mechanism_takes(capsys):
    said = {}
    for name in ("kl-certified", "randomized-response", "rr-with-prior"):
        assert main(["mechanisms", name]) == 0
        said[name] = " ".join(capsys.readouterr().out.split())
    assert "--lower/--upper (a box) or --norm-bound (a ball)" in said["kl-certified"]
    for name in ("randomized-response", "rr-with-prior"):
        assert "public bounds: none (label flip only" in said[name]


def test_cli_option_help_is_built_from_the_declarations(capsys):
    assert main(["release", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in mechanisms():
        assert f"{name}:" in text


def test_cli_version(capsys):
    assert main(["--version"]) == 0
    assert kr.__version__ in capsys.readouterr().out


# ---------------------------------------------------------------- bounded resources


def test_output_paths_are_checked_before_any_computation(tmp_path, monkeypatch, capsys):
    import klrelease.cli.release as cli_release

    def boom(*a, **k):
        raise AssertionError("computed before checking the output path")

    monkeypatch.setattr(cli_release, "_load_input", boom)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (".", str(tmp_path), str(blocker / "r.json"), str(tmp_path / "no" / "r.json")):
        rc = main(["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5",
                   "--out", out])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: cannot write") and err.count("\n") == 1


def test_sample_streams_in_blocks_and_refuses_bad_names(iris, tmp_path, monkeypatch):
    import klrelease.cli.release as cli_release

    rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid")
    art = tmp_path / "r.json"
    art.write_text(rel.to_json())
    sizes = []
    original = kr.GMM.sample_blocks

    def spy(self, n, seed=None, *, block):
        for X, comp in original(self, n, seed, block=block):
            sizes.append(len(X))
            yield X, comp

    monkeypatch.setattr(cli_release, "SAMPLE_CHUNK", 100)
    monkeypatch.setattr(kr.GMM, "sample_blocks", spy)
    out = tmp_path / "s.csv"
    assert main(["sample", str(art), "-n", "1050", "--out", str(out)]) == 0
    assert max(sizes) == 100 and sum(sizes) == 1050
    lines = out.read_text().splitlines()
    assert len(lines) == 1051 and all(len(x.split(",")) == 5 for x in lines)
    doc = json.loads(rel.to_json())
    doc["feature_names"] = ["only", "three", "names"]
    art.write_text(json.dumps(doc))
    out.unlink()
    assert main(["sample", str(art), "-n", "10", "--out", str(out)]) == 2
    assert not out.exists()


@pytest.mark.parametrize("mechanism", ["gaussian-iid", "laplace-iid", "colored-gaussian"])
def test_huge_epsilon_costs_no_more_than_a_small_one(mechanism):
    X, y = _small()
    box = (np.full(2, -4.0), np.full(2, 4.0))
    opts = {"variant": "label-flip"} if mechanism == "laplace-iid" else (
        {"design": "public"} if mechanism == "colored-gaussian" else {})
    t0 = time.perf_counter()
    rel = kr.release(X, y, epsilon=1e4, delta=1e-5, mechanism=mechanism, bounds=box, **opts)
    assert time.perf_counter() - t0 < 5.0 and rel.privacy.certified


def test_kl_paper_at_huge_epsilon_releases_quickly():
    """The weight mapping's column is computed in log space (it was NaN at eps = 1e4)."""
    X, y = _small()
    t0 = time.perf_counter()
    with pytest.warns(PrivacyLeakWarning):
        rel = kr.release(X, y, epsilon=1e4, delta=1e-5, mechanism="kl-paper")
    assert time.perf_counter() - t0 < 10.0
    assert np.all(np.isfinite(rel.gmm.weights))


def test_accountant_grid_does_not_grow_with_epsilon():
    X, y = _small()
    box = (np.full(2, -4.0), np.full(2, 4.0))
    g = kr.plan(X, y, epsilon=1e3, delta=1e-5, mechanism="gaussian-iid", bounds=box).guarantee
    acc = kr.BudgetAccountant(1e3, 1e-5)
    acc.spend(g)
    t0 = time.perf_counter()
    with pytest.raises(kr.BudgetExceeded):
        acc.check(g)  # (2e3, 2e-5) by summing: needs the PLD accountant, which stays small
    assert time.perf_counter() - t0 < 10.0


# ---------------------------------------------------------------- structure


def test_cli_modules_import_one_way():
    """Command modules import only the shared app; nothing outside the CLI imports it."""
    pkg = ROOT / "klrelease"
    commands = {p.stem for p in (pkg / "cli").glob("*.py")} - {"__init__", "app"}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                mod, names = "", [a.name for a in node.names]
            else:
                continue
            text = mod + " " + " ".join(names)
            if rel.parts[0] != "cli" and rel.name != "__main__.py":
                assert "cli" not in mod.split(".") and "klrelease.cli" not in text, rel
            elif rel.stem in commands:
                assert not any(c in mod.split(".") for c in commands - {rel.stem}), rel
                assert not any(n in commands for n in names if mod in (".", "")), rel


def test_nothing_imports_the_test_suite_or_edits_sys_path():
    for folder in ("klrelease", "benchmarks", "experiments"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "sys.path.insert" not in text, path
            assert "from conftest" not in text, path


def test_one_generator_of_the_synthetic_setting():
    """Tests, the solver study and the figure experiments draw the same data for one seed."""
    from conftest import synthetic_gmm_data

    from klrelease.experiments import SyntheticSetting, draw_synthetic
    from klrelease.solvers.synthetic import gmm_data

    a = draw_synthetic(SyntheticSetting(n_samples=300, n_classes=4, n_features=2),
                       np.random.default_rng(11))
    X1, y1 = synthetic_gmm_data(N=300, K=4, d=2, seed=11)
    X2, y2 = gmm_data(300, 2, 4, seed=11)
    for X, y in ((X1, y1), (X2, y2)):
        assert np.array_equal(X, a.X) and np.array_equal(y, a.y)


def test_cited_proof_paths_are_the_shipped_files(iris):
    """Every certified claim cites its proof by path: the file is there, beside the code."""
    import re

    cited = set()
    for name in ("kl-certified", "ppe-gaussian"):
        g = kr.plan(iris, None, epsilon=1.0, delta=1e-5, mechanism=name,
                    **({"adjacency": "replace-one"} if name == "ppe-gaussian" else {}),
                    ).guarantee
        assert g.certified or name == "kl-certified"
        cited |= set(re.findall(r"klrelease/[\w/]+\.md", " ".join((g.statement, *g.reasons))))
    assert cited == {"klrelease/mechanisms/kl_certified/kl_certified.md",
                     "klrelease/mechanisms/ppe_gaussian/ppe_gaussian.md"}
    for path in cited:
        assert (ROOT / path).is_file(), path
