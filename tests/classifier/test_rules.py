from flywheel.classifier.rules import RuleEngine
from flywheel.classifier.settings.config import starter_intents_path
from flywheel.classifier.settings.intents import Rule, load_intents


def test_priority_then_file_order():
    eng = RuleEngine([
        Rule(id="low", intent="A", priority=1, kind="contains", patterns=("quota",)),
        Rule(id="high", intent="B", priority=5, kind="contains", patterns=("quota",)),
        Rule(id="high2", intent="C", priority=5, kind="contains", patterns=("quota",)),
    ])
    assert eng.match("my QUOTA").rule_id == "high"


def test_kinds():
    eng = RuleEngine([
        Rule(id="p", intent="A", kind="prefix", patterns=("you are a bot",)),
        Rule(id="r", intent="B", kind="regex", patterns=(r"\b\d+ ?%",)),
        Rule(id="k", intent="C", kind="keywords", patterns=(frozenset({"reset", "password"}),)),
    ])
    assert eng.match("  You are a bot. hi").rule_id == "p"
    assert eng.match("hi you are a bot") is None  # prefix only
    assert eng.match("at 20 % now").rule_id == "r"
    assert eng.match("please RESET my Password").rule_id == "k"
    assert eng.match("reset it") is None  # every word of the set is needed


def test_starter_rules_from_the_adr():
    eng = RuleEngine(load_intents(starter_intents_path()).rules)
    assert eng.match("You are a direct and concise assistant. Summarise X").intent == "PLATFORM"
    assert eng.match("usage percentage of 20%").intent == "PLATFORM"
    assert eng.match("my quota is at 85 percent").intent == "PLATFORM"
    assert eng.match("What is addVar in AVAP?") is None


def test_hundreds_of_rules_still_match_correctly():
    rules = [Rule(id=f"r{i}", intent="A", priority=i % 7, kind="regex", patterns=(rf"\bword{i}\b",))
             for i in range(500)]
    eng = RuleEngine(rules)
    assert eng.match("contains word317 here").rule_id == "r317"
    assert eng.match("nothing") is None


def test_prefilter_agrees_with_rule_by_rule_matching():
    rules = [Rule(id="c", intent="A", kind="contains", patterns=("Quota",)),
             Rule(id="p", intent="B", kind="prefix", patterns=("hello bot",)),
             Rule(id="r", intent="C", kind="regex", patterns=(r"\d+ ?%",))]
    eng = RuleEngine(rules)
    assert eng._prefilter is not None
    for text, want in [("my QUOTA", "c"), ("  Hello Bot!", "p"), ("say hello bot", None), ("at 5%", "r"),
                       ("nothing here", None)]:
        m = eng.match(text)
        assert (m.rule_id if m else None) == want
    # a pattern that compiles alone but not inside an alternation disables only the prefilter
    odd = RuleEngine([Rule(id="g", intent="A", kind="regex", patterns=("(?i)zzz",))] + rules)
    assert odd._prefilter is None
    assert odd.match("at 5%").rule_id == "r" and odd.match("ZZZ").rule_id == "g"
