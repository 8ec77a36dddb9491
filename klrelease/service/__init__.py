"""The release service: a persistent privacy-budget ledger in front of the release mechanisms.

``klrelease serve`` runs it (FastAPI and uvicorn); ``klrelease service ...`` is the data
owner's side on the same data directory, ``klrelease remote ...`` and
:class:`klrelease.client.Client` the analyst's. Modules:

* :mod:`.ledger`    the ledger (SQLAlchemy on SQLite or PostgreSQL): datasets, tokens, the
  charges and the append-only audit log; the charge is committed in the transaction that
  checks the budget, before any data is read;
* :mod:`.datasets`  registration of a dataset (its public inputs) and its source at release time;
* :mod:`.releases`  one release request: validated, charged, run, signed;
* :mod:`.tokens`    random bearer tokens, stored as hashes;
* :mod:`.signing`   Ed25519 signatures of artifacts (``cryptography``);
* :mod:`.app`       the HTTP application and the page at ``/``.

Importing this package imports none of the service's dependencies; each module imports its
own when it is used.
"""
