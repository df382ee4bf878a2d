"""The text_similarity grader's metrics, each from the library the field uses for it, scaled to
[0, 1]:
- fuzzy_match: rapidfuzz's `fuzz.ratio` (normalised Indel similarity) / 100;
- bleu: sacrebleu's sentence BLEU (its default smoothing, 'exp') / 100, capped at 1;
- gleu: NLTK's sentence GLEU (Google's BLEU variant), on whitespace tokens;
- meteor: NLTK's METEOR on whitespace tokens, with exact and Porter-stem matches; synonym
  matches need WordNet's data, which NLTK downloads and this service does not: when
  `nltk.data.find("corpora/wordnet")` finds it installed, synonyms count too;
- rouge_1 ... rouge_5, rouge_l: Google's rouge-score F-measure (Porter stemming off, as its
  default).
`cosine` needs an embedding model: none is configured, and a grader asking for it is refused when
it is parsed (mathrl/graders.py)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

# what the metrics import; the API image leaves them out (its 300 MB budget, docs/images.md), and an
# API without them sends text_similarity graders to a worker as a 'grade' job (api/grading.py)
LIBRARIES = ("rapidfuzz", "sacrebleu", "nltk", "rouge_score")


def available() -> bool:
    """Whether this process can score text_similarity graders (every metric's library is installed)."""
    return all(importlib.util.find_spec(name) is not None for name in LIBRARIES)


def similarity(metric: str, text: str, reference: str) -> float:
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return float(fuzz.ratio(text, reference)) / 100.0
    if metric == "bleu":
        import sacrebleu

        return min(1.0, float(sacrebleu.sentence_bleu(text, [reference]).score) / 100.0)
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu([reference.split()], text.split()))
    if metric == "meteor":
        from nltk.translate.meteor_score import meteor_score

        return float(meteor_score([reference.split()], text.split(), wordnet=_wordnet()))
    if metric.startswith("rouge_"):
        kind = "rougeL" if metric == "rouge_l" else metric.replace("_", "")
        return float(_rouge(kind).score(reference, text)[kind].fmeasure)
    raise ValueError(f"no text similarity metric {metric!r}")


@functools.lru_cache(maxsize=8)
def _rouge(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind])


class _NoSynonyms:
    """WordNet's interface with no synsets: METEOR's synonym stage matches nothing."""

    def synsets(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


@functools.lru_cache(maxsize=1)
def _wordnet() -> Any:
    import nltk

    try:
        nltk.data.find("corpora/wordnet")
    except LookupError:
        return _NoSynonyms()
    from nltk.corpus import wordnet

    return wordnet
