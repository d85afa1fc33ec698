"""``flywheel eval`` reports how often the out-of-scope gate throws an in-scope query away
(issue 43): ``gate`` in the JSON (layer 2's sure rejections and what was served out of scope,
overall and by language) and a table in the text report. The encoder is a fake."""

from __future__ import annotations

import json

from tests.support.docs import OOS_WORDS, TOPICS, topic_examples, toy_train_file, write_jsonl


def test_eval_reports_the_gates_in_scope_rejections_by_language(tmp_path, fake_encoder, capsys):
    from flywheel.cli import main

    weather, off_topic = topic_examples(TOPICS["weather"]), topic_examples(OOS_WORDS, 20)
    rows = [{"text": weather[0], "label": "weather", "lang": "en"},
            {"text": weather[1], "label": "weather", "lang": "en"},
            # labelled in scope, worded out of scope: the gate throws it away
            {"text": off_topic[15], "label": "weather", "lang": "de"},
            {"text": off_topic[16], "label": "oos", "lang": "de"}]
    test = write_jsonl(tmp_path / "test.jsonl", rows)
    train = toy_train_file(tmp_path / "train.jsonl")
    args = ["eval", "--train", str(train), "--test", str(test), "--quiet", "--latency-sample", "0"]
    assert main([*args, "--json"]) == 0
    gate = json.loads(capsys.readouterr().out)["gate"]
    assert (gate["n_in_scope"], gate["rejected_sure"], gate["served_out_of_scope"]) == (3, 0.3333, 0.3333)
    assert gate["by_language"] == {"de": {"n_in_scope": 1, "rejected_sure": 1.0, "served_out_of_scope": 1.0},
                                   "en": {"n_in_scope": 2, "rejected_sure": 0.0, "served_out_of_scope": 0.0}}
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "In-scope queries thrown away as out of scope:" in text
    assert "  de              1        100.0%               100.0%" in text
