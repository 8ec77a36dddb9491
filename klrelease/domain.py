"""The public bound on the features: one type for a box or a centred Euclidean ball.

A record-level guarantee needs every row to lie in a set known without the private data: a
per-feature box ``lower <= x <= upper`` (``bounds=``, ``--lower/--upper``) or a ball
``||x||_2 <= B`` (``norm_bound=``, ``--norm-bound``). :class:`Domain` is that set, validated
once where it is given, with what the mechanisms need of it: clipping rows into it, its centre
and half-widths, its diameter (the quantity sensitivities scale with) and its JSON form.

A domain may be given before the number of features is known (the command line validates it
before reading any data); :meth:`Domain.for_features` then fixes the dimension, broadcasting a
scalar box.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .rows import clip_to_bounds, clip_to_norm

__all__ = ["Domain", "SCALES", "check_scales"]

#: Where a domain comes from, as recorded in artifacts.
SOURCES = ("public bounds", "public norm bound", "features")


@dataclass(frozen=True, eq=False)
class Domain:
    """A public box or a centred Euclidean ball that every (clipped) row lies in.

    Build one with :meth:`box`, :meth:`ball` or :meth:`from_public`; they validate.

    Attributes
    ----------
    kind : {"box", "ball"}
    d : int or None
        Number of features; ``None`` until :meth:`for_features` fixes it.
    lower, upper : ndarray or None
        The box (``kind == "box"``), of shape (d,) (or (1,) for a scalar box before ``d``
        is known).
    radius : float or None
        The ball ``||x||_2 <= radius`` (``kind == "ball"``).
    source : str
        Where it comes from: ``"public bounds"``, ``"public norm bound"``, or ``"features"``
        (the bounding box of features that are public under label flips).
    """

    kind: Literal["box", "ball"]
    d: int | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    radius: float | None = None
    source: str = "public bounds"

    # ----------------------------------------------------------------------- construction
    @classmethod
    def box(cls, lower, upper, d: int | None = None, *, source: str = "public bounds") -> Domain:
        """The box ``lower <= x <= upper`` (scalars or one value per feature).

        Raises
        ------
        ValueError
            If a bound is not finite, ``lower >= upper`` for some feature, or the lengths do
            not match ``d``.
        """
        try:
            lo = np.atleast_1d(np.asarray(lower, dtype=np.float64))
            hi = np.atleast_1d(np.asarray(upper, dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError("bounds must be numbers: a pair (lower, upper)") from None
        if lo.ndim != 1 or hi.ndim != 1:
            raise ValueError("bounds must be a pair (lower, upper) of numbers or vectors")
        n = max(lo.size, hi.size)
        if d is not None:
            n = d
        try:
            lo = np.broadcast_to(lo, (n,)).copy()
            hi = np.broadcast_to(hi, (n,)).copy()
        except ValueError:
            raise ValueError(
                f"bounds must give one value per feature ({n}), or one value for all"
            ) from None
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError("bounds must be finite")
        if np.any(lo >= hi):
            raise ValueError("bounds must satisfy lower < upper for every feature")
        if not np.all(np.isfinite(hi / 2 - lo / 2) & np.isfinite(2 * (hi / 2 - lo / 2))):
            raise ValueError("bounds must be finite and less than 1.7e308 apart")
        scalar = d is None and lo.size == 1 and np.ndim(lower) == 0 and np.ndim(upper) == 0
        return cls("box", None if scalar else n, lo, hi, None, source)

    @classmethod
    def ball(cls, radius, d: int | None = None, *,
             source: str = "public norm bound") -> Domain:
        """The centred ball ``||x||_2 <= radius``.

        Raises
        ------
        ValueError
            If ``radius`` is not a finite number > 0.
        """
        try:
            r = float(radius)
        except (TypeError, ValueError):
            raise ValueError(f"norm_bound must be a finite number > 0, got {radius!r}") from None
        if isinstance(radius, bool) or not np.isfinite(r) or r <= 0:
            raise ValueError(f"norm_bound must be a finite number > 0, got {radius!r}")
        return cls("ball", d, None, None, r, source)

    @classmethod
    def from_public(cls, bounds=None, norm_bound=None, d: int | None = None) -> Domain | None:
        """The domain of a box ``bounds=(lower, upper)`` or a ball ``norm_bound``; ``None``
        if neither is given. A :class:`Domain` passes through (its dimension fixed to ``d``).

        Raises
        ------
        ValueError
            If both are given, or the one given is invalid.
        """
        if isinstance(bounds, Domain):
            if norm_bound is not None:
                raise ValueError("give either bounds= (a box) or norm_bound= (a ball), not both")
            return bounds if d is None else bounds.for_features(d)
        if bounds is not None and norm_bound is not None:
            raise ValueError("give either bounds= (a box) or norm_bound= (a ball), not both")
        if bounds is not None:
            try:
                lower, upper = bounds
            except (TypeError, ValueError):
                raise ValueError("bounds must be a pair (lower, upper)") from None
            return cls.box(lower, upper, d)
        if norm_bound is not None:
            return cls.ball(norm_bound, d)
        return None

    def for_features(self, d: int) -> Domain:
        """This domain in dimension ``d`` (a scalar box broadcast; a mismatch is an error)."""
        if self.d == d:
            return self
        if self.kind == "ball":
            return Domain("ball", d, None, None, self.radius, self.source)
        if self.d is not None:
            raise ValueError(f"bounds give {self.d} values per side but the data have "
                             f"{d} features")
        return Domain.box(self.lower, self.upper, d, source=self.source)

    # ------------------------------------------------------------------------ geometry
    def _dim(self) -> int:
        if self.d is None:
            raise ValueError("the number of features of this domain is not known yet")
        return self.d

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(lower, upper)`` of a box; ``None`` for a ball."""
        return (self.lower, self.upper) if self.kind == "box" else None

    @property
    def norm_bound(self) -> float | None:
        """The radius of a ball; ``None`` for a box."""
        return self.radius if self.kind == "ball" else None

    @property
    def centre(self) -> np.ndarray:
        """Centre of the domain (the origin for a ball)."""
        if self.kind == "box":
            return self.lower / 2.0 + self.upper / 2.0  # no overflow near the float range
        return np.zeros(self._dim())

    @property
    def half_widths(self) -> np.ndarray:
        """Per-feature half-widths of the smallest box containing the domain."""
        if self.kind == "box":
            return self.upper / 2.0 - self.lower / 2.0
        return np.full(self._dim(), self.radius)

    @property
    def ranges(self) -> np.ndarray:
        """Per-feature ranges of the smallest box containing the domain."""
        if self.kind == "box":
            return self.upper - self.lower
        return np.full(self._dim(), 2.0 * self.radius)

    def diameter(self, norm: Literal["l1", "l2"] = "l2") -> float:
        """Diameter of the domain in the L1 or L2 norm (``D_1``, ``D_2``): the largest
        distance between two rows, which record-level sensitivities scale with."""
        if norm not in ("l1", "l2"):
            raise ValueError(f"norm must be 'l1' or 'l2', got {norm!r}")
        if self.kind == "box":
            r = self.ranges
            return float(r.sum() if norm == "l1" else np.linalg.norm(r))
        return float(2.0 * self.radius * (np.sqrt(self._dim()) if norm == "l1" else 1.0))

    def clip(self, X: np.ndarray) -> np.ndarray:
        """Rows moved into the domain (per-record clipping: a box clips each feature, a ball
        scales a row onto it)."""
        if self.kind == "box":
            return clip_to_bounds(X, self.lower, self.upper)
        return clip_to_norm(X, self.radius)

    # --------------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """The domain as plain JSON values (it is public)."""
        if self.kind == "box":
            return {"kind": "box", "lower": self.lower.tolist(), "upper": self.upper.tolist(),
                    "source": self.source}
        return {"kind": "ball", "radius": self.radius, "d": self.d, "source": self.source}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Domain:
        """Inverse of :meth:`to_json` (validated)."""
        source = obj.get("source", "public bounds")
        if source not in SOURCES:
            raise ValueError(f"unknown domain source {source!r}")
        if obj.get("kind") == "box":
            return cls.box(obj["lower"], obj["upper"], source=source)
        if obj.get("kind") == "ball":
            return cls.ball(obj["radius"], obj.get("d"), source=source)
        raise ValueError("a domain is {'kind': 'box', ...} or {'kind': 'ball', ...}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Domain):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(self.to_json()))


#: Public scales (feature standard deviations under label flip, the bound's half-widths under
#: replace-one) a release can work in: the covariances are their squares, in floating point.
SCALES = (1e-150, 1e150)


def check_scales(scales, what: str) -> None:
    """Refuse, before any noise, public scales whose squares leave the floating-point range
    (a function of public inputs: the features under label flip, the bound under replace-one;
    all-zero scales, a constant dataset, are fine)."""
    s = np.abs(np.asarray(scales, dtype=float))
    lo, hi = SCALES
    pos = s[s > 0]
    if not np.all(np.isfinite(s)) or (pos.size and (pos.max() > hi or pos.min() < lo)):
        raise ValueError(
            f"{what} must lie between {lo:g} and {hi:g} (the released "
            "covariances are their squares, in floating point); give the features in other "
            "units")
