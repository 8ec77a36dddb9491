"""Signed artifacts: Ed25519 over the canonical JSON; any edit, another key or no signature is
refused when a trusted key is given, and unsigned artifacts still load without one."""

from __future__ import annotations

import json
import os
import stat

import pytest

pytest.importorskip("cryptography")

import klrelease as kr  # noqa: E402
from klrelease.artifact import Release, read_document  # noqa: E402
from klrelease.service.signing import (  # noqa: E402
    KEY_FILE,
    SignatureError,
    Signer,
    canonical,
    load_public_key,
    verify_document,
)


@pytest.fixture(scope="module")
def signer(tmp_path_factory):
    s, created = Signer.load_or_create(tmp_path_factory.mktemp("key"))
    assert created
    return s


@pytest.fixture(scope="module")
def signed(signer):
    rel = kr.release(kr.load_dataset("iris"), None, epsilon=1.0, delta=1e-6)
    return signer.sign(rel.model_dump(mode="json", exclude={"signature"}))


def test_key_is_made_once_owner_only_and_reloaded(tmp_path):
    a, made = Signer.load_or_create(tmp_path)
    b, again = Signer.load_or_create(tmp_path)
    assert made and not again and a.key_id == b.key_id
    assert stat.S_IMODE(os.stat(tmp_path / KEY_FILE).st_mode) == 0o600
    assert list(tmp_path.iterdir()) == [tmp_path / KEY_FILE]  # no temporary file left


def test_signed_artifact_verifies_and_round_trips(signer, signed):
    text = json.dumps(signed)
    rel = Release.from_json(text, public_key=signer.public_pem)
    assert rel.signature.key_id == signer.key_id and rel.privacy.certified
    # the model's own JSON is the same document: it verifies again
    again = Release.from_json(rel.to_json(), public_key=signer.public_pem)
    assert again.gmm.means.tolist() == rel.gmm.means.tolist()
    # and a key given as the service's /v1/key document works too
    key_doc = json.dumps({"algorithm": "Ed25519", "key_id": signer.key_id,
                          "public_key_pem": signer.public_pem})
    assert Release.from_json(text, public_key=key_doc).signature.key_id == signer.key_id


def _edits():
    def eps(d):
        d["privacy"]["epsilon"] = 0.5

    def delta(d):
        d["privacy"]["delta"] = 1e-9

    def certified(d):
        d["privacy"]["certified"] = False

    def consistent_claim(d):  # a multi-field edit: the recorded design catches it too
        d["privacy"]["epsilon"] = 0.1
        d["privacy"]["statement"] = d["privacy"]["statement"].replace("(1,", "(0.1,")

    def mean(d):
        d["gmm"]["means"][0][0] += 1e-9

    def weights(d):
        w = d["gmm"]["weights"]
        w[0], w[1] = w[1], w[0]

    def classes(d):
        d["gmm"]["classes"][0] = "renamed"

    def added(d):
        d["options"]["note"] = "added"

    return [eps, delta, certified, consistent_claim, mean, weights, classes, added]


@pytest.mark.parametrize("edit", _edits(), ids=lambda f: f.__name__)
def test_every_edit_fails_verification(signer, signed, edit):
    doc = json.loads(json.dumps(signed))
    edit(doc)
    text = json.dumps(doc)
    if edit.__name__ == "consistent_claim":
        # without a key the claim is checked against the budget recorded beside it
        with pytest.raises(ValueError, match="tampered"):
            Release.from_json(text)
    with pytest.raises(ValueError, match="modified after it was signed|tampered"):
        Release.from_json(text, public_key=signer.public_pem)


def test_other_key_unsigned_and_forged_signatures_are_refused(signer, signed, tmp_path):
    other, _ = Signer.load_or_create(tmp_path)
    with pytest.raises(SignatureError, match="signed by key"):
        verify_document(signed, other.public_pem)
    # a signature block copied onto another document, with the right key id: forged
    forged = other.sign({k: v for k, v in signed.items() if k != "signature"})
    forged["signature"]["key_id"] = signer.key_id
    with pytest.raises(SignatureError, match="modified"):
        verify_document(forged, signer.public_pem)
    unsigned = {k: v for k, v in signed.items() if k != "signature"}
    with pytest.raises(SignatureError, match="not signed"):
        Release.from_json(json.dumps(unsigned), public_key=signer.public_pem)
    with pytest.raises(SignatureError, match="PEM"):
        load_public_key("not a key")


def test_unsigned_artifacts_load_as_before_and_write_no_signature():
    rel = kr.release(kr.load_dataset("iris"), None, epsilon=1.0, delta=1e-6)
    doc = json.loads(rel.to_json())
    assert "signature" not in doc and rel.signature is None
    assert Release.from_json(rel.to_json()).gmm.n_components == 3


def test_canonical_form_ignores_layout_and_key_order(signed):
    shuffled = json.loads(json.dumps(signed, indent=4, sort_keys=False))
    reordered = dict(reversed(list(shuffled.items())))
    assert canonical(reordered) == canonical(signed)
    assert b'"signature"' not in canonical(signed)


def test_read_document_checks_the_signature(signer, signed, tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(signed))
    assert read_document(path, public_key=signer.public_pem).signature is not None
    doc = json.loads(path.read_text())
    doc["privacy"]["delta"] = 1e-7
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="modified"):
        read_document(path, public_key=signer.public_pem)
