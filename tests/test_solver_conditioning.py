"""The native solver certifies ill-conditioned problems instead of handing them to Clarabel.

colored-gaussian's data design minimises tr(C) on the raw features: on breast cancer's first
20 columns (scales 1e-3 to 1e3) the working rows' singular values span six decades, and the
native interior-point iteration converges only linearly (231 iterations). With a cap of 200
it failed, and the fallback to Clarabel (one PSD cone per working row, all sharing H: a dense
KKT system of about 10^4 unknowns, 6 s per iteration) ran for over ten minutes.
"""

import time
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer

import klrelease as kr
from klrelease import solvers
from klrelease.neighbours import class_neighbour_vectors
from klrelease.statistics import class_statistics
from klrelease.warnings_ import PrivacyLeakWarning


def _breast_cancer_20():
    d = load_breast_cancer()
    return d.data[:, :20], d.target


def test_the_native_solver_certifies_the_ill_conditioned_class():
    X, y = _breast_cancer_20()
    st = class_statistics(X, y, 2)
    V = class_neighbour_vectors(X, y, 1, st.means[1], int(st.counts[1]), leavers=True,
                                joiners=True)
    res = solvers.mean_noise_sdp(np.eye(20), V, solver="native")
    assert res.solver == "native" and res.status == "optimal" and res.gap <= 1e-7
    assert res.max_violation <= 1e-9


def test_colored_gaussian_on_twenty_breast_cancer_features_takes_seconds():
    X, y = _breast_cancer_20()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        p = kr.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="colored-gaussian",
                    classes=[0, 1], bounds="features")
    assert p.solver.solver == "native" and p.solver.status == "optimal"  # no fallback
    assert time.perf_counter() - t0 < 60  # 1.1 s measured; over ten minutes before


def test_the_initial_working_set_holds_each_duplicated_row_once():
    """1e5 rows drawn from 30 points: the initial set's criteria pick indices (argpartition's
    order among tied copies is implementation-defined: numpy 2.4 returned a late copy of the
    row whose first copy the principal-direction extremes picked), so it held two copies of
    four points and the working set 31 rows for 30 points. Copies are now dropped by value."""
    from klrelease.solvers.canonical import canonicalise, whitened_frame
    from klrelease.solvers.reduction import initial_working_set

    rng = np.random.default_rng(11)
    points = rng.normal(size=(30, 20))
    V = points[rng.integers(0, 30, 100_000)]
    frame = whitened_frame(canonicalise(np.eye(20), V))
    rows = np.flatnonzero(frame.sq_norms > 0)
    working = initial_working_set(frame.U, rows, frame.sq_norms)
    assert len(np.unique(frame.U[working], axis=0)) == len(working)
    assert np.linalg.matrix_rank(frame.U[working]) == 20
