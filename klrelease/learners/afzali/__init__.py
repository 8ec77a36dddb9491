"""A sample-and-aggregate learner after the privacy architecture of Afzali, Ashtiani & Liaw.

Importing this package registers ``afzali-style-sample-aggregate``: it approximates the
paper's architecture (blocks, candidate lists, private common-member selection) and does not
carry its utility guarantee. Privacy proof: ``AFZALI.md``.
"""

from __future__ import annotations

from . import aal_lite  # noqa: F401
