#!/usr/bin/env python3
"""Compares `megaplan data prepare`'s token ids with the reference tokenizers on >= 10 MB of text.

  tokenizer_check.py MEGAPLAN_BINARY [--spm-model tiny.model] [--work DIR] [--megabytes 10]

Text: text files found on the machine (Python's own library sources and docs under sys.prefix,
/usr/share/doc), then generated lines of CJK, Cyrillic, Arabic, Devanagari, Thai and Greek, emoji
with ZWJ sequences and skin tones, and runs of spaces, tabs and newlines; written as .jsonl, one
document per line. Checks, each skipped with a line saying why when its reference is missing:
  - hf, Llama 3 style: a byte-level BPE trained here with HF `tokenizers` (Split regex +
    ByteLevel(use_regex=False), vocab ~8000, special tokens, ignore_merges), against
    tokenizer.encode(text, add_special_tokens=False).ids;
  - hf, GPT-2 style: the same with ByteLevel(use_regex=True);
  - sentencepiece: the --spm-model file against Python `sentencepiece`, else against the
    `spm_encode` CLI (Debian's sentencepiece package; it reads lines, so documents are lines).
Prints a table: tokenizer, documents, MB, tokens, mismatching documents, megaplan MB/s.
Nothing is downloaded. Exit status 1 when any document mismatches.
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
SCRIPTS = [
    "中文的文本和日本語のテキスト、한국어 문장입니다。漢字かなカナ",
    "Съешь же ещё этих мягких французских булок, да выпей чаю",
    "مرحبا بالعالم، هذا نص عربي للاختبار",
    "नमस्ते दुनिया, यह हिंदी पाठ है",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Καλημέρα κόσμε, αυτό είναι ελληνικό κείμενο",
    "emoji 😀👍🏽👩🏿‍💻 family 👨‍👩‍👧‍👦 flags 🏳️‍🌈🇩🇪 ok",
    "tabs\t\tand   spaces    \n\n\n  end\r\n",
    "café naïve résumé cafe\u0301 ½ ² ① Ⅻ ﬁ",
    "odd spaces\u00a0\u2003\u3000 and\u0085nel\u180emvs\u200bzw",
    "numbers 1234567 3.14159 0x7fff 1,000,000",
    "I'm you're we'VE they'LL it's DON'T",
]


def log(message):
    print(message, file=sys.stderr, flush=True)


def build_text(target_bytes, seed=1):
    """Documents of real text from the machine and generated mixed-script lines."""
    random.seed(seed)
    documents, total = [], 0
    roots = [os.path.join(sys.prefix, "lib"), os.path.join(sys.prefix, "share", "doc"), "/usr/share/doc",
             "/usr/lib/python3"]
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith((".py", ".txt", ".rst", ".md", ".html")):
                    continue
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as f:
                        text = f.read(200_000)
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip():
                    continue
                # Real files in paragraph-sized documents.
                for start in range(0, len(text), 4000):
                    documents.append(text[start:start + 4000])
                total += len(text.encode("utf-8"))
                if total >= target_bytes * 0.7:
                    break
            if total >= target_bytes * 0.7:
                break
        if total >= target_bytes * 0.7:
            break
    while total < target_bytes:
        lines = []
        for _ in range(random.randint(1, 8)):
            line = " ".join(random.choice(SCRIPTS) for _ in range(random.randint(1, 5)))
            if random.random() < 0.1:
                line += random.choice(SPECIALS)
            lines.append(line + random.choice(["\n", "\n\n", " \n", "\t\n", "   \n\n\n"]))
        document = "".join(lines)
        documents.append(document)
        total += len(document.encode("utf-8"))
    return documents


def write_jsonl(path, documents):
    with open(path, "w", encoding="utf-8") as f:
        for document in documents:
            f.write(json.dumps({"text": document}, ensure_ascii=False) + "\n")


def read_indexed_dataset(prefix):
    """Megatron's MMIDIDX .idx/.bin (executor/data/indexed_dataset.cc): the token ids per document."""
    dtypes = {1: ("B", 1), 2: ("b", 1), 3: ("h", 2), 4: ("i", 4), 5: ("q", 8), 8: ("H", 2)}
    with open(prefix + ".idx", "rb") as f:
        index = f.read()
    if index[:9] != b"MMIDIDX\x00\x00":
        raise ValueError(prefix + ".idx: no MMIDIDX magic")
    code = index[17]
    count, = struct.unpack_from("<Q", index, 18)
    offset = 34
    sizes = struct.unpack_from("<%di" % count, index, offset)
    offset += 4 * count
    pointers = struct.unpack_from("<%dq" % count, index, offset)
    letter, width = dtypes[code]
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    return [list(struct.unpack_from("<%d%s" % (size, letter), data, pointer)) for size, pointer in zip(sizes, pointers)]


def run_prepare(binary, jsonl, prefix, flags):
    start = time.perf_counter()
    result = subprocess.run([binary, "data", "prepare", "--input", jsonl, "--output-prefix", prefix] + flags,
                            capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError("megaplan data prepare failed: " + (result.stderr or result.stdout).strip())
    return read_indexed_dataset(prefix + "_text_document"), seconds


def compare(name, documents, got, expected, seconds, rows):
    megabytes = sum(len(d.encode("utf-8")) for d in documents) / 1e6
    mismatches = [i for i, (a, b) in enumerate(zip(got, expected)) if list(a) != list(b)]
    if len(got) != len(expected):
        mismatches.append(-1)
        log("%s: %d documents from megaplan, %d from the reference" % (name, len(got), len(expected)))
    for i in mismatches[:3]:
        if i >= 0:
            a, b = got[i], expected[i]
            first = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            log("%s: document %d differs at token %d: megaplan %s, reference %s; text %r" %
                (name, i, first, a[first:first + 8], b[first:first + 8], documents[i][:200]))
    rows.append((name, len(documents), megabytes, sum(len(t) for t in got), len(mismatches), megabytes / seconds))


def hf_checks(binary, work, documents, rows):
    try:
        from tokenizers import Tokenizer, Regex, models, pre_tokenizers, trainers
    except ImportError as error:
        log("hf: skipped, HF `tokenizers` is not importable (%s)" % error)
        return
    jsonl = os.path.join(work, "text.jsonl")
    training = os.path.join(work, "train.txt")
    with open(training, "w", encoding="utf-8") as f:
        f.write("\n".join(documents[::3]))
    variants = {
        "hf llama3-style": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        "hf gpt2-style": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    }
    for name, pre_tokenizer in variants.items():
        try:
            model = models.BPE(ignore_merges=True) if "llama3" in name else models.BPE()
        except TypeError:  # an older tokenizers without ignore_merges
            model = models.BPE()
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = pre_tokenizer
        trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=SPECIALS if "llama3" in name else ["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tokenizer.train([training], trainer)
        folder = os.path.join(work, name.replace(" ", "-"))
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "tokenizer.json")
        tokenizer.save(path)
        write_jsonl(jsonl, documents)
        got, seconds = run_prepare(binary, jsonl, os.path.join(folder, "out"), ["--tokenizer", "hf", "--tokenizer-file", path])
        expected = [tokenizer.encode(d, add_special_tokens=False).ids for d in documents]
        compare(name, documents, got, expected, seconds, rows)


def spm_check(binary, work, documents, model_path, rows):
    if not model_path:
        log("sentencepiece: skipped, no --spm-model given")
        return
    # spm_encode reads lines, so the SentencePiece documents are lines (without the newline).
    lines = [line for d in documents for line in d.split("\n") if line.strip() and "\r" not in line]
    jsonl = os.path.join(work, "spm.jsonl")
    write_jsonl(jsonl, lines)
    got, seconds = run_prepare(binary, jsonl, os.path.join(work, "spm-out"),
                               ["--tokenizer", "sentencepiece", "--tokenizer-model", model_path])
    try:
        import sentencepiece
        processor = sentencepiece.SentencePieceProcessor(model_file=model_path)
        expected = [processor.encode(line) for line in lines]
        name = "sentencepiece (python)"
    except ImportError:
        spm_encode = shutil.which("spm_encode")
        if spm_encode is None:
            log("sentencepiece: reference unavailable (neither Python sentencepiece nor spm_encode)")
            return
        result = subprocess.run([spm_encode, "--model=" + model_path, "--output_format=id"],
                                input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        expected = [[int(t) for t in row.split()] for row in result.stdout.split("\n")[:len(lines)]]
        name = "sentencepiece (spm_encode)"
    compare(name, lines, got, expected, seconds, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("megaplan", help="the megaplan binary")
    parser.add_argument("--spm-model", help="a SentencePiece .model (trained with spm_train)")
    parser.add_argument("--work", help="a folder for the files (default: a temporary one)")
    parser.add_argument("--megabytes", type=float, default=10.5)
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="tokenizer-check-")
    os.makedirs(work, exist_ok=True)
    documents = build_text(int(args.megabytes * 1e6))
    log("text: %d documents, %.1f MB" % (len(documents), sum(len(d.encode("utf-8")) for d in documents) / 1e6))
    rows = []
    if not args.skip_hf:
        try:
            hf_checks(os.path.abspath(args.megaplan), work, documents, rows)
        except Exception as error:  # report and go on to SentencePiece
            log("hf: failed: %s" % error)
            rows.append(("hf", len(documents), 0.0, 0, -1, 0.0))
    try:
        spm_check(os.path.abspath(args.megaplan), work, documents, args.spm_model, rows)
    except Exception as error:
        log("sentencepiece: failed: %s" % error)
        rows.append(("sentencepiece", len(documents), 0.0, 0, -1, 0.0))
    print("%-28s %10s %8s %12s %12s %14s" % ("tokenizer", "documents", "MB", "tokens", "mismatching", "megaplan MB/s"))
    for name, count, megabytes, tokens, mismatching, speed in rows:
        print("%-28s %10d %8.1f %12d %12s %14.1f" % (name, count, megabytes, tokens,
                                                   "error" if mismatching < 0 else mismatching, speed))
    return 1 if any(row[4] != 0 for row in rows) or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
