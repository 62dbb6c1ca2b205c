#!/usr/bin/env python3
"""scripts/tokenizer_reference.py: the references of normtape's tokenizer (nn/data/tokenizer.h) that
need Python's `tokenizers` (Hugging Face) and `tiktoken` (OpenAI), which Debian does not package.
They run where those are installed (the GPU machine) and write small fixtures that the tests read.

  python3 scripts/tokenizer_reference.py fixtures
      Trains two byte-level BPEs with tokenizers on the first 200 KB of data/tinyshakespeare.txt and
      tests/fixtures/tokenizer/unicode.txt: one that splits by GPT-4's pattern (a Split before a
      ByteLevel, as Llama 3's files do; 1,000 tokens, two special tokens, merges by the list) and
      one by ByteLevel's own GPT-2 pattern (600 tokens, ignore_merges). Writes each as
      tests/fixtures/tokenizer/hf_{split,byte_level}.tokenizer.json, and their ids for three
      texts (unicode.txt, Shakespeare's last 4 KB, a text with the special tokens in it), from
      encode(text, add_special_tokens=False), to tests/fixtures/tokenizer/hf_ids.json.

  python3 scripts/tokenizer_reference.py invalid VOCAB
      tiktoken's ids for tests/fixtures/tokenizer/invalid_utf8.txt under gpt2, cl100k_base and
      o200k_base (VOCAB/NAME.tiktoken and NAME.json, as scripts/fetch_tiktoken.sh writes them), as
      normtape splits invalid UTF-8: each run of valid text by encode_ordinary, each run of
      invalid bytes as one piece (_encode_single_piece). Writes them to
      tests/fixtures/tokenizer/invalid_utf8.ids.json and prints how many ids tiktoken's own
      _encode_bytes, which merges everything from the first invalid byte on as one piece, gives.

  python3 scripts/tokenizer_reference.py compare VOCAB
      For each of gpt2, cl100k_base and o200k_base whose VOCAB/NAME.tokenizer.json exists
      (train_tokenizer --from VOCAB/NAME.tiktoken --out VOCAB/NAME writes it): the ids that
      tokenizers reads from it against tiktoken's, on data/tinyshakespeare.txt, unicode.txt and a
      text of special tokens, and decode back. Exits 1 on a difference.
"""
import base64
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
GPT4_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
ENCODINGS = ["gpt2", "cl100k_base", "o200k_base"]
SPECIAL_TEXT = "First<|endoftext|>second <|pad|><|endoftext|> end<|endofprompt|>\n"


def read(path, mode="r"):
    """The file's text as it is (newline="": a CR stays a CR), or its bytes with mode "rb"."""
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as f:
        return f.read()


def texts():
    shakespeare = read(os.path.join(ROOT, "data", "tinyshakespeare.txt"))
    return {"unicode.txt": read(os.path.join(FIXTURES, "unicode.txt")), "shakespeare_tail": shakespeare[-4000:],
            "special": SPECIAL_TEXT}


def fixtures():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    corpus = read(os.path.join(ROOT, "data", "tinyshakespeare.txt"))[:200_000] + read(os.path.join(FIXTURES, "unicode.txt"))
    ids = {}
    for kind, vocab_size, specials in [("split", 1000, ["<|endoftext|>", "<|pad|>"]), ("byte_level", 600, [])]:
        if kind == "split":
            tok = Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok = Tokenizer(models.BPE(ignore_merges=True))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([corpus], trainer)
        path = os.path.join(FIXTURES, f"hf_{kind}.tokenizer.json")
        tok.save(path)
        ids[kind] = {name: tok.encode(text, add_special_tokens=False).ids for name, text in texts().items()}
        for name, text in texts().items():
            assert tok.decode(ids[kind][name], skip_special_tokens=False) == text, (kind, name)
        print(f"{path}: {tok.get_vocab_size()} ids, {len(json.loads(read(path))['model']['merges'])} merges")
    with open(os.path.join(FIXTURES, "hf_ids.json"), "w") as f:
        json.dump(ids, f, separators=(",", ":"))
        f.write("\n")


def encoding(vocab, name):
    import tiktoken
    ranks = {}
    for line in read(os.path.join(vocab, f"{name}.tiktoken"), "rb").splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    meta = json.loads(read(os.path.join(vocab, f"{name}.json")))
    return tiktoken.Encoding(name, pat_str=meta["pat_str"], mergeable_ranks=ranks,
                             special_tokens=meta.get("special_tokens", {}))


def runs(data):
    """The text as (is_valid, bytes) runs: maximal valid UTF-8 and maximal invalid."""
    out, at = [], 0
    while at < len(data):
        try:
            data[at:].decode("utf-8")
            out.append((True, data[at:]))
            break
        except UnicodeDecodeError as e:
            if e.start > 0:
                out.append((True, data[at:at + e.start]))
            bad = data[at + e.start:at + e.end]
            if out and not out[-1][0]:
                out[-1] = (False, out[-1][1] + bad)
            else:
                out.append((False, bad))
            at += e.end
    return out


def invalid(vocab):
    data = read(os.path.join(FIXTURES, "invalid_utf8.txt"), "rb")
    result = {}
    for name in ENCODINGS:
        enc = encoding(vocab, name)
        ids = []
        for valid, part in runs(data):
            ids += enc.encode_ordinary(part.decode("utf-8")) if valid else enc._encode_single_piece(part)
        assert enc.decode_bytes(ids) == data
        theirs = enc._encode_bytes(data)
        same = next((i for i, (a, b) in enumerate(zip(ids, theirs)) if a != b), min(len(ids), len(theirs)))
        print(f"{name}: {len(ids)} ids; tiktoken's _encode_bytes gives {len(theirs)}, the same up to id {same}")
        result[name] = ids
    with open(os.path.join(FIXTURES, "invalid_utf8.ids.json"), "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")


def compare(vocab):
    from tokenizers import Tokenizer
    failed = 0
    all_texts = dict(texts(), shakespeare=read(os.path.join(ROOT, "data", "tinyshakespeare.txt")))
    for name in ENCODINGS:
        path = os.path.join(vocab, f"{name}.tokenizer.json")
        if not os.path.exists(path):
            print(f"{name}: no {path}")
            continue
        enc, hf = encoding(vocab, name), Tokenizer.from_file(path)
        for text_name, text in all_texts.items():
            theirs = enc.encode(text, allowed_special="all")
            ours = hf.encode(text, add_special_tokens=False).ids
            same = ours == theirs and hf.decode(ours, skip_special_tokens=False) == text
            failed += not same
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            print(f"{name} {text_name}: {len(theirs)} ids, tokenizers {'equal' if same else f'differs at id {first}'}")
    return failed


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "fixtures":
        fixtures()
    elif len(sys.argv) == 3 and sys.argv[1] == "invalid":
        invalid(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "compare":
        sys.exit(1 if compare(sys.argv[2]) else 0)
    else:
        sys.exit(__doc__)
