#!/usr/bin/env python3
"""Writes DOCS documents of WORDS random words each, one JSON line per document ({"text": ...}),
for `megaplan data prepare`: the GPU scripts' corpus, where the token values do not change the work.

  bench/random_words_corpus.py OUT.jsonl DOCS WORDS
"""
import json
import random
import sys

random.seed(1)
VOCABULARY = "the a cat dog sat ran on to park mat river car door old small red open bird friend man".split()
out, docs, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(out, "w") as f:
    for _ in range(docs):
        f.write(json.dumps({"text": " ".join(random.choice(VOCABULARY) for _ in range(words))}) + "\n")
