"""The privacy audit: estimator, exact components, noise densities, known failures and passes."""

import json
import re
from dataclasses import dataclass
from math import comb

import numpy as np
import pytest
from scipy import stats

import klrelease
from klrelease import as_labelled_data
from klrelease.audit import AuditReport, estimate_delta, hockey_stick_terms, select_neighbours
from klrelease.audit.exact import exact_weights_delta
from klrelease.audit.hockey_stick import chernoff_bounds, discrete_delta
from klrelease.cli import main
from klrelease.mechanisms import Guarantee, Mechanism, Plan, check_options, get_mechanism
from klrelease.privacy.calibration import analytic_gaussian_sigma, gaussian_delta
from klrelease.sampling import GaussianNoise, WishartNoise

# ----------------------------------------------------------------------------- estimator


@pytest.mark.parametrize("eps, sigma", [(0.5, 1.0), (1.0, 0.7), (2.0, 0.5)])
def test_estimator_matches_exact_gaussian_delta(eps, sigma):
    rng = np.random.default_rng(11)
    n = 40_000
    o = rng.normal(0.0, sigma, n)  # M(D) = N(0, sigma^2), M(D') = N(1, sigma^2)
    lp = stats.norm.logpdf(o, 0.0, sigma)
    lq = stats.norm.logpdf(o, 1.0, sigma)
    est = estimate_delta(hockey_stick_terms(lp, lq, eps), alpha=0.01)
    exact = gaussian_delta(sigma, eps, 1.0)
    assert est.lower <= exact <= est.upper
    assert abs(est.estimate - exact) < 0.1 * exact + 2e-3
    assert est.upper - est.lower < 0.1


def test_terms_handle_support_mismatch_exactly():
    t = hockey_stick_terms([0.0, 0.0, -np.inf, 1.0], [-np.inf, 0.0, 0.0, 1.0], 1.0)
    assert t[0] == 1.0 and t[1] == 0.0 and np.isnan(t[2]) and t[3] == 0.0
    with pytest.raises(ValueError, match="NaN"):
        estimate_delta(t, 0.05)


def test_confidence_bounds_cover_and_resolve():
    # all terms zero: the upper bound is the Chernoff value ln(1/alpha)/n, not zero
    lo, hi = chernoff_bounds(0.0, 1000, 0.05)
    assert lo == 0.0 and hi == pytest.approx(-np.expm1(np.log(0.05) / 1000), rel=1e-6)
    # coverage of Bernoulli(0.3) means, both bounds, over repetitions
    rng = np.random.default_rng(5)
    miss = 0
    for _ in range(400):
        e = estimate_delta((rng.random(200) < 0.3).astype(float), 0.05)
        miss += not (e.lower <= 0.3 <= e.upper)
    assert miss <= 400 * 0.1 * 1.5  # each side fails w.p. <= 0.05


def test_discrete_delta():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.25, 0.25, 0.5])
    assert discrete_delta(p, q, 0.0) == pytest.approx(0.5)
    assert discrete_delta(p, q, np.log(2.0)) == pytest.approx(0.0)


# ----------------------------------------------------------------------------- densities


def test_gaussian_noise_density_against_scipy():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 3))
    C = A @ A.T + 0.1 * np.eye(3)
    w = rng.normal(size=(50, 3))
    g = GaussianNoise(C)
    ref = stats.multivariate_normal(np.zeros(3), C).logpdf(w)
    assert np.allclose([g.logpdf(x) for x in w], ref, atol=1e-10)
    assert np.allclose(g.logpdf_many(w), ref, atol=1e-10)
    # singular: density on the range, -inf off it
    v = np.array([1.0, 2.0, 0.5])
    gs = GaussianNoise(np.outer(v, v))
    assert gs.logpdf(0.3 * v) == pytest.approx(stats.norm(0, np.linalg.norm(v)).logpdf(
        0.3 * np.linalg.norm(v)), abs=1e-10)
    assert gs.logpdf(np.array([1.0, 0.0, 0.0])) == -np.inf


def test_wishart_noise_density_against_scipy():
    rng = np.random.default_rng(1)
    for d, gamma in [(2, 3.0), (4, 22.2)]:
        wn = WishartNoise(d, gamma)
        W = wn.sample_many(rng, 20)
        ref = stats.wishart(df=d + 1, scale=np.eye(d) / gamma).logpdf(np.moveaxis(W, 0, -1))
        assert np.allclose([wn.logpdf(x) for x in W], ref, atol=1e-8)
        assert np.allclose(wn.logpdf_many(W), ref, atol=1e-8)
        off = W[0] - 10 * np.eye(d)
        assert wn.logpdf(off) == -np.inf and wn.logpdf_many(off[None])[0] == -np.inf


def test_laplace_and_discrete_laplace_densities_against_scipy():
    from klrelease.mechanisms.baselines.common import BlockNoise
    from klrelease.privacy.discrete import DiscreteLaplace

    z = np.linspace(-3, 3, 7)
    lap = BlockNoise("laplace", 0.7, (7,))
    assert lap.logpdf(z) == pytest.approx(stats.laplace(0, 0.7).logpdf(z).sum(), abs=1e-10)
    gau = BlockNoise("gaussian", 0.7, (7,))
    assert gau.logpdf(z) == pytest.approx(stats.norm(0, 0.7).logpdf(z).sum(), abs=1e-10)
    k = np.arange(-6, 7)
    dl = DiscreteLaplace(0.8)
    assert np.allclose(dl.log_pmf(k), stats.dlaplace(0.8).logpmf(k), atol=1e-12)


def test_kl_paper_vectorised_densities_match_the_plan(iris):
    m = get_mechanism("kl-paper")
    p = m.plan(iris, epsilon=2, delta=1e-5)
    codes = iris.codes.copy()
    codes[0] = 2
    q = m.plan(iris.with_labels(codes), epsilon=2, delta=1e-5)
    outs = p.sample_many(np.random.default_rng(2), 200)
    many = q.log_density_many(outs)
    one = [q.log_density(o) for o in outs]
    for c in ("weights", "means", "covariances"):
        ref = np.array([v[c] for v in one])
        assert np.array_equal(np.isneginf(ref), np.isneginf(many[c]))
        fin = np.isfinite(ref)
        assert np.allclose(ref[fin], many[c][fin], atol=1e-9)
    assert np.isneginf(many["covariances"]).any()  # the Wishart support moves


# ----------------------------------------------------------------------------- known failures


def _data_with_counts(counts, d=3, seed=3):
    rng = np.random.default_rng(seed)
    means = rng.uniform(-10, 10, size=(len(counts), d))
    X = np.vstack([rng.normal(means[k], 1.0, size=(c, d)) for k, c in enumerate(counts)])
    return as_labelled_data(X, np.repeat(np.arange(len(counts)), counts))


def test_weight_mapping_failure_is_exactly_0_618():
    """F8a: counts (335, 299, 317, 35, 14), exact enumeration of the finite support."""
    data = _data_with_counts([335, 299, 317, 35, 14])
    m = get_mechanism("kl-paper")
    expected = (1 - 1e-3) * 13 / 21  # f' puts its (1 - lambda) mass on 21 points, 13 not shared
    for eps in (1.0, 2.0, 5.0):
        p = m.plan(data, epsilon=eps, delta=1e-5)
        filler = p.sample(np.random.default_rng(0))
        for a, b in [(4, 0), (1, 3)]:
            codes = data.codes.copy()
            codes[np.flatnonzero(codes == a)[0]] = b
            q = m.plan(data.with_labels(codes), epsilon=eps, delta=1e-5)
            value, _ = exact_weights_delta(p, q, eps, filler)
            assert value == pytest.approx(0.618, abs=1e-3)
            assert value == pytest.approx(expected, rel=1e-6)
            back, _ = exact_weights_delta(q, p, eps, q.sample(np.random.default_rng(1)))
            assert back == pytest.approx(expected, rel=1e-6)


def test_audit_flags_kl_paper_on_iris(iris):
    r = klrelease.audit("kl-paper", iris, epsilon=2, delta=1e-5, max_pairs=6, n_samples=300,
                        seed=0)
    assert r.violation and r.verdict.startswith("VIOLATION")
    assert r.neighbouring == "label-flip" and r.search == "extreme-point search"
    assert {"weights", "covariances"} <= set(r.leaking_components)
    w = r.worst_pair
    exact = [d.exact_components["weights"].estimate for d in w.directions]
    # f' is uniform on 7 points, 3 of them outside the neighbour's support (2K - 2 shared);
    # there the neighbour has only the uniform floor lambda / C(N - 1, K - 1)
    floor = 1e-3 / comb(149, 2)
    expected = (1 - 1e-3) * 3 / 7 + 3 * floor * (1 - np.exp(2.0))
    assert exact == pytest.approx([expected] * 2, rel=1e-9)
    assert max(d.components["covariances"].support_mismatch for d in w.directions) > 0.05
    assert max(d.joint.lower for d in w.directions) > 0.5
    assert AuditReport.from_json(r.to_json()) == r


def test_audit_finds_wishart_support_failure():
    """BASELINES 5.3 protocol: overlapping classes, N_k = 100, d = 2, standardised."""
    rng = np.random.default_rng(20240607)
    X = np.vstack([rng.normal([2.5 * k, 0.0], 1.0, size=(100, 2)) for k in range(3)])
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    y = np.repeat(np.arange(3), 100)
    r = klrelease.audit("kl-paper", X, y, epsilon=1, delta=1e-5, max_pairs=8, n_samples=400,
                        seed=1)
    assert r.violation and "covariances" in r.leaking_components
    cov = [d.components["covariances"] for p in r.confirmed_pairs for d in p.directions]
    assert max(b.support_mismatch for b in cov) > 0.015
    assert max(b.lower for b in cov) > 1e-2


# ----------------------------------------------------------------------------- known valid


@dataclass
class _SumsPlan(Plan):
    """Gaussian noise of fixed covariance on class counts and class sums (test fixture)."""

    counts: np.ndarray = None
    sums: np.ndarray = None
    sigma_w: float = 1.0
    sigma_m: float = 1.0

    def sample(self, rng):
        return {"weights": self.counts + self.sigma_w * rng.standard_normal(self.counts.shape),
                "means": self.sums + self.sigma_m * rng.standard_normal(self.sums.shape),
                "covariances": np.zeros((len(self.counts), 1, 1))}

    @staticmethod
    def _normal(x, mean, sd):
        z = (np.asarray(x) - mean) / sd
        return float(np.sum(-0.5 * z**2 - np.log(sd) - 0.5 * np.log(2 * np.pi)))

    def log_density(self, o):
        lw = self._normal(o["weights"], self.counts, self.sigma_w)
        lm = self._normal(o["means"], self.sums, self.sigma_m)
        lc = 0.0 if np.all(o["covariances"] == 0) else -np.inf
        return {"weights": float(lw), "means": float(lm), "covariances": lc}

    def finalize(self, o):  # pragma: no cover - not used by the audit
        raise NotImplementedError


class _SumsMechanism(Mechanism):
    """Label flip moves two counts by 1 and two sums by x_n (||x_n|| <= R on the public box):
    joint L2 sensitivity sqrt(2/sigma_w^2 + 2 R^2/sigma_m^2) = s*(eps, delta) by construction,
    so the release is (eps, delta)-DP (Balle & Wang); ``shrink`` < 1 breaks it on purpose."""

    name = "test-sums"
    summary = "test fixture"
    options = {"shrink": 1.0}

    def plan(self, data, *, epsilon, delta, **options):
        opts = check_options(self, options)
        lower, upper = data.bounds
        X = np.clip(data.X, lower, upper)
        R = float(np.linalg.norm(np.maximum(np.abs(lower), np.abs(upper))))
        K = data.n_classes
        s_star = 1.0 / analytic_gaussian_sigma(epsilon, delta, 1.0)
        sigma_w = np.sqrt(2.0) / (s_star * np.sqrt(0.5)) * opts["shrink"]
        sigma_m = np.sqrt(2.0) * R / (s_star * np.sqrt(0.5)) * opts["shrink"]
        counts = np.bincount(data.codes, minlength=K).astype(float)
        sums = np.stack([X[data.codes == k].sum(axis=0) for k in range(K)])
        g = Guarantee(epsilon, delta, "label-flip", True, "test fixture")
        return _SumsPlan(self.name, g, data.classes, counts=counts, sums=sums,
                         sigma_w=sigma_w, sigma_m=sigma_m)


@pytest.fixture
def sums_mechanism(monkeypatch):
    from klrelease.mechanisms.registry import _REGISTRY

    monkeypatch.setitem(_REGISTRY, "test-sums", _SumsMechanism())
    return "test-sums"


def test_audit_passes_a_valid_fixture_and_flags_its_broken_variant(iris, sums_mechanism):
    r = klrelease.audit(sums_mechanism, iris, epsilon=1, delta=1e-5, max_pairs=20,
                        n_samples=1000, seed=2)
    assert not r.violation and r.verdict.startswith("no violation found")
    assert r.worst_pair.worst_lower <= 1e-5
    assert max(d.joint.upper for d in r.worst_pair.directions) < 0.02
    bad = klrelease.audit(sums_mechanism, iris, epsilon=1, delta=1e-5, max_pairs=20,
                          n_samples=1000, seed=2, shrink=0.1)
    assert bad.violation and bad.worst_pair.worst_lower > 0.05


def test_audit_passes_gaussian_iid(iris):
    r = klrelease.audit("gaussian-iid", iris, epsilon=2, delta=1e-5, max_pairs=10,
                        n_samples=400, seed=3)
    assert r.certified_claim and not r.violation
    r = klrelease.audit("gaussian-iid", iris, epsilon=2, delta=1e-5, max_pairs=6,
                        n_samples=200, seed=3, adjacency="replace-one")
    assert r.neighbouring == "replace-one" and not r.violation
    assert "replaced by box vertex" in r.worst_pair.description


# ----------------------------------------------------------------------------- neighbours


def test_neighbour_selection(iris):
    every = select_neighbours(iris, "label-flip", 1000)
    assert len(every) == 300 and len({(n.row, n.description) for n in every}) == 300
    scores = [n.score for n in every]
    assert scores == sorted(scores, reverse=True)
    some = select_neighbours(iris, "label-flip", 24)
    assert len(some) == 24
    moves = {re.sub(r"^row \d+: ", "", n.description) for n in some}
    assert len(moves) == 6  # every ordered pair of classes is represented
    rec = select_neighbours(iris, "replace-one", 40)
    assert len(rec) == 40
    for n in every[:20] + rec:
        assert not re.search(r"\d+\.\d", n.description)  # never a feature value
    with pytest.raises(ValueError, match="public bound"):
        select_neighbours(as_labelled_data(iris.X, iris.codes), "replace-one", 5)


# ----------------------------------------------------------------------------- CLI


def test_cli_exit_codes(tmp_path, capsys, sums_mechanism):
    out = tmp_path / "report.json"
    args = ["--dataset", "iris", "--epsilon", "2", "--delta", "1e-5", "--max-pairs", "4",
            "--samples", "200", "--seed", "0"]
    assert main(["audit", "--mechanism", "kl-paper", *args, "--out", str(out)]) == 1
    report = AuditReport.from_json(out.read_text())
    assert report.violation and report.mechanism == "kl-paper"
    assert "VIOLATION" in capsys.readouterr().out
    assert main(["audit", "--mechanism", sums_mechanism, *args]) == 0
    assert "no violation found" in capsys.readouterr().out
    for bad in (["--epsilon", "0"], ["--mechanism", "nope"], ["--samples", "3"],
                ["--option", "shrink"]):
        argv = ["audit", "--mechanism", sums_mechanism, *args, *bad]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:")
    assert main(["audit", "--mechanism", "kl-paper", "--csv", str(tmp_path / "x.csv"),
                 "--epsilon", "1", "--delta", "1e-5"]) == 2
    json.loads(out.read_text())


def test_time_limit_cuts_the_audit_short_and_says_so(iris):
    r = klrelease.audit("kl-paper", iris, epsilon=2, delta=1e-5, n_samples=5000, seed=4,
                        time_limit=0.5)
    assert r.stopped_by_time_limit and 1 <= r.pairs_examined < 300
    assert "reached in time" in r.search
    n = [d.joint.n_samples for p in r.confirmed_pairs for d in p.directions]
    assert n and min(n) >= 25 and max(n) < 5000
    assert r.violation  # the exact weights and the Wishart support still show


def test_record_level_audit_of_kl_paper(iris):
    """remove-one: the total changes, so D's uniform floor is impossible under D' (mass lambda),
    and 3 of the 4 points of f' (uniform on pi(D) and its K removals) are not in the
    neighbour's design either."""
    r = klrelease.audit("kl-paper", iris.X, iris.codes, epsilon=2, delta=1e-5, norm_bound=10,
                        adjacency="remove-one", max_pairs=3, n_samples=100, seed=0)
    assert r.neighbouring == "remove-one" and r.violation
    d = r.worst_pair.directions[0]
    # the two points c - e_j (j != a) keep the neighbour's own floor lambda / C(N - 2, K - 1)
    expected = (1 - 1e-3) * 3 / 4 + 1e-3 - 2 * np.exp(2.0) * 1e-3 / comb(148, 2)
    assert d.exact_components["weights"].estimate == pytest.approx(expected, rel=1e-9)
    assert d.exact_components["weights"].support_mismatch == pytest.approx(
        (1 - 1e-3) / 4 + 1e-3, abs=1e-6)  # the point pi(D) itself has total N
