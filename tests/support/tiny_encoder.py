"""A tiny random BERT (2 layers, hidden 32) with a WordPiece tokenizer, saved as a
Hugging Face model directory: what the ONNX export and encoder-tuning tests run on
instead of real weights (nothing is downloaded)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

#: texts whose characters the tiny vocabulary covers, besides the ONNX probe set
TEXTS = [
    "how do I reset my password",
    "cancel my last order",
    "¿dónde está mi pedido?",
    "ok",
    "what's the weather going to be like in paris tomorrow afternoon, and should I take an umbrella? " * 4,
]


def build_tiny_bert(path: Path, seed: int = 0, hidden: int = 32, layers: int = 2,
                    extra_texts: Iterable[str] = ()) -> Path:
    """Save a random 2-layer BERT, a WordPiece tokenizer (tokenizer.json) and a
    sentence_bert_config.json to ``path``; the vocabulary covers every character of
    the ONNX probe set, :data:`TEXTS` and ``extra_texts``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    from flywheel.classifier.encoders import onnx_runner

    path.mkdir(parents=True, exist_ok=True)
    chars = sorted(set("".join(onnx_runner.PROBE + tuple(TEXTS) + tuple(extra_texts)).lower()) - {" "})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars),
             "the", "my", "how", "order", "##s"]
    (path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    # the vocabulary positionally: transformers 5 names it ``vocab`` and ignores ``vocab_file``
    # (which left a 5-token vocabulary: every word [UNK])
    tok = BertTokenizer(str(path / "vocab.txt"), do_lower_case=True, model_max_length=512)
    tok.save_pretrained(str(path))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=hidden * 2, max_position_embeddings=512)
    BertModel(config).save_pretrained(str(path))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}), encoding="utf-8")
    return path
