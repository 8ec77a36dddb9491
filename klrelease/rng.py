"""Random number generation for releases.

A release must not be predictable by anyone who does not hold the data. Unseeded calls
therefore draw from a ChaCha20 stream cipher (20 rounds, a cryptographically secure generator)
keyed with 256 bits from the operating system's CSPRNG (:mod:`secrets`). A seed gives a
reproducible run for experiments and tests only: such a release is marked ``secure_rng=False``
in its artifact, because anyone who learns the seed can subtract the noise.

Floating-point caveat: the noise samplers work on IEEE doubles (idealised real arithmetic).
Like every floating-point DP implementation, they do not defend against attacks on the low-order
bits of the released values (Mironov 2012).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
import randomgen

__all__ = ["RandomSource", "make_rng"]


@dataclass(frozen=True)
class RandomSource:
    """A numpy ``Generator`` together with how it was seeded."""

    generator: np.random.Generator
    secure: bool
    seed: int | None


def make_rng(seed: int | None | np.random.Generator | np.random.RandomState = None
             ) -> RandomSource:
    """Return the generator for one release.

    Parameters
    ----------
    seed : int, numpy Generator, numpy RandomState or None
        ``None`` (the default) gives a ChaCha20 generator keyed from the OS CSPRNG. An integer,
        an existing ``Generator`` or a ``RandomState`` (scikit-learn's ``random_state``
        forms; a ``RandomState`` seeds a new generator from its next draws, so it advances)
        gives a reproducible, *not secure* stream for experiments.
    """
    if seed is None:
        key = secrets.randbits(256)
        gen = np.random.Generator(randomgen.ChaCha(key=key, counter=0, rounds=20))
        return RandomSource(gen, secure=True, seed=None)
    if isinstance(seed, np.random.Generator):
        return RandomSource(seed, secure=False, seed=None)
    if isinstance(seed, np.random.RandomState):  # scikit-learn's random_state: draws from it
        words = seed.randint(0, 2**32, size=8, dtype=np.uint64)
        return RandomSource(np.random.default_rng(words), secure=False, seed=None)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError("seed must be a non-negative integer, a numpy Generator or RandomState, "
                         f"or None, got {seed!r}")
    return RandomSource(np.random.default_rng(int(seed)), secure=False, seed=int(seed))
