"""The library's small linear algebra: inverses of covariances, precision combination, and
the BLAS thread policy of the d x d work."""

import numpy as np
import pytest

from klrelease._threads import THREADED_FROM, blas_single_thread
from klrelease.linalg import combine_one, precision_combine, spd_inverse


def _spd(rng, d, cond=10.0):
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (Q * np.geomspace(1.0, cond, d)) @ Q.T


@pytest.mark.parametrize("d", [1, 3, 40])
def test_spd_inverse_is_the_inverse_of_a_positive_definite_matrix(d):
    C = _spd(np.random.default_rng(d), d, cond=1e4)
    A = spd_inverse(C)
    np.testing.assert_allclose(A, A.T, rtol=0, atol=0)
    np.testing.assert_allclose(A @ C, np.eye(d), atol=1e-9)


def test_spd_inverse_is_the_pseudo_inverse_where_there_is_no_factor():
    rng = np.random.default_rng(1)
    B = rng.normal(size=(5, 2))
    singular = B @ B.T  # rank 2: no Cholesky factor (or a diagonal spanning 1e8 and more)
    np.testing.assert_allclose(spd_inverse(singular), np.linalg.pinv(singular, hermitian=True),
                               atol=1e-10)
    indefinite = np.diag([2.0, -1.0, 3.0])
    np.testing.assert_allclose(spd_inverse(indefinite), np.diag([0.5, -1.0, 1 / 3]))
    # singular, with features in very different units: LAPACK factors it, and the factor's
    # diagonal spans less than 1e-6 (a test on the unscaled factor took the "inverse", with
    # entries of 2.7e17 against the pseudo-inverse's 9.7e5); the scaled factor's test sees it
    other = np.random.default_rng(8)
    other.normal(size=(5, 4))
    B = other.normal(size=(300, 299)) * np.geomspace(1e-3, 1e3, 300)[:, None]
    ref = np.linalg.pinv(B @ B.T, hermitian=True)
    np.testing.assert_allclose(spd_inverse(B @ B.T), 0.5 * (ref + ref.T), rtol=0, atol=0)
    # a near-singular matrix that has a factor: the pseudo-inverse drops the null direction
    near = singular + 1e-15 * np.eye(5)
    ref = np.linalg.pinv(near, hermitian=True)
    np.testing.assert_allclose(spd_inverse(near), 0.5 * (ref + ref.T), rtol=0, atol=0)


def test_precision_combination_weights_each_estimate_by_its_precision():
    rng = np.random.default_rng(2)
    K, d = 3, 4
    m1, m2 = rng.normal(size=(K, d)), rng.normal(size=(K, d))
    C1 = np.stack([_spd(rng, d) for _ in range(K)])
    C2 = np.stack([_spd(rng, d) for _ in range(K)])
    m, C = precision_combine(m1, C1, m2, C2)
    for k in range(K):
        A1, A2 = np.linalg.inv(C1[k]), np.linalg.inv(C2[k])
        ref = np.linalg.inv(A1 + A2)
        np.testing.assert_allclose(C[k], ref, rtol=1e-10)
        np.testing.assert_allclose(m[k], ref @ (A1 @ m1[k] + A2 @ m2[k]), rtol=1e-10)
        # given precisions: the same combination
        mk, Ck = combine_one(m1[k], m2[k], A1=A1, C2=C2[k])
        np.testing.assert_allclose(mk, m[k], rtol=1e-9)
        assert combine_one(m1[k], m2[k], C1[k], C2[k], want_cov=False)[1] is None


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_blas_runs_on_one_thread_below_the_width_where_threads_pay():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = {}

    @blas_single_thread(width=lambda d: d)
    def work(d):
        seen[d] = _blas_threads()

    with threadpoolctl.threadpool_limits(2, user_api="blas"):  # two threads outside, anywhere
        outside = _blas_threads()
        work(THREADED_FROM - 1)
        work(THREADED_FROM)
        assert _blas_threads() == outside == 2
    assert seen[THREADED_FROM - 1] == 1
    assert seen[THREADED_FROM] == 2
