"""Masking personal data before a query is logged (classifier.masking)."""

import copy

import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.masking import iban_ok, luhn_ok, mask_pii
from flywheel.classifier.protocols import HistoryEntry
from flywheel.classifier.settings.intents import parse_intents
from tests.support.docs import ALWAYS_SURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher


@pytest.mark.parametrize("text, masked", [
    ("mail me at ana.lopez@example.com please", "mail me at <EMAIL> please"),
    ("my card 4111 1111 1111 1111 expired", "my card <CARD> expired"),
    ("tarjeta 4111-1111-1111-1111", "tarjeta <CARD>"),
    ("IBAN ES91 2100 0418 4502 0005 1332 ok", "IBAN <IBAN> ok"),
    ("iban GB82WEST12345698765432", "iban <IBAN>"),
    ("call +34 612 345 678 or (555) 123-4567", "call <PHONE> or <PHONE>"),
    ("esto es mi teléfono 612345678", "esto es mi teléfono <PHONE>"),
])
def test_personal_data_becomes_typed_placeholders(text, masked):
    assert mask_pii(text) == masked


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1112 fails Luhn",      # not a card, and too long to be a phone
    "IBAN GB82WEST12345698765433 fails mod 97",
    "version 3.2.1 released on 2026-11-24",
    "order 12345678 and addVar(x, 3)",
    "",
])
def test_lookalikes_are_left_alone(text):
    assert mask_pii(text) == text


def test_checksums():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("DE89 3704 0044 0532 0130 00") and not iban_ok("DE89 3704 0044 0532 0130 01")


def test_the_log_gets_masked_text_and_the_teacher_the_raw_one():
    doc = copy.deepcopy(DOC)
    doc["thresholds"] = ALWAYS_SURE   # layer 2 always decides: audits
    emb = HashEmbedder()
    teacher = ScriptedTeacher(answer=lambda req: "PLATFORM")
    sink, audits = ListSink(), []
    clf = Classifier(fit_model(parse_intents(doc), embedder=emb), embedder=emb, teacher=teacher,
                     log_sink=sink, redact=mask_pii, audit_rate=1.0,
                     audit_callback=lambda rec, call: audits.append(call))
    raw = "send my invoices to ana@example.com"
    clf.classify(raw, history=[("PLATFORM", "my phone is +34 612 345 678")])
    clf.close()
    (rec,) = sink.records
    assert rec.text == "send my invoices to <EMAIL>"
    assert rec.history == (HistoryEntry("PLATFORM", "my phone is <PHONE>"),)
    assert teacher.requests and teacher.requests[0].text == raw
    assert "+34 612 345 678" in teacher.requests[0].history[0].snippet
    assert len(audits) == 1
