"""Load the tokenizer of a run and give it the chat template the data config asks for.

Model "tiny" (and a model directory that holds only a config.json, as in the speed recipe) uses the small
byte-level BPE tokenizer shipped in `assets/tiny_tokenizer.json`: trained offline with `train_tiny_tokenizer` on
the bundled sample rendered with the Qwen2.5 tool template, with Qwen2's pre-tokenizer regex and special tokens,
so nothing is downloaded. Rebuild it with `python tools/sample_data.py --tokenizer`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from gpucert.finetune.config import DataConfig, ModelConfig
from gpucert.finetune.data.hub import pretrained_source
from gpucert.finetune.data.template import ASSETS, SHIPPED_TEMPLATES, template_text

TINY_TOKENIZER_PATH = ASSETS / "tiny_tokenizer.json"
TINY_VOCAB_SIZE = 4096
# Qwen2's: <|endoftext|> pads, <|im_end|> ends a turn (and generation), <|im_start|> opens one. Ids 0, 1, 2.
PAD_TOKEN, TURN_START, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, TURN_START, EOS_TOKEN]
# Qwen2's pre-tokenizer split (its tokenizer.json): letters, single digits, punctuation runs, newlines.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Files that make a directory a tokenizer (a directory with only config.json is not one).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def train_tiny_tokenizer(texts: Iterable[str], path: Path, vocab_size: int = TINY_VOCAB_SIZE) -> None:
    """Train a byte-level BPE tokenizer on `texts` and save it as a tokenizers JSON file at `path`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))


def tiny_tokenizer(path: Path = TINY_TOKENIZER_PATH) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[TURN_START],
        model_max_length=1 << 20,
    )
    tokenizer.name_or_path = "tiny"
    return tokenizer


def _is_tokenizer_source(name: str) -> bool:
    directory = Path(name)
    return not directory.is_dir() or any((directory / f).exists() for f in _TOKENIZER_FILES)


def load_tokenizer(model_cfg: ModelConfig, data_cfg: DataConfig) -> PreTrainedTokenizerBase:
    """The run's tokenizer, with a pad token and the chat template named by data.template. A model name that is
    neither a directory here nor a hub id that can be loaded is a ModelSourceError (hub.py) within seconds."""
    tokenizer: PreTrainedTokenizerBase
    if model_cfg.name == "tiny":
        tokenizer = tiny_tokenizer()
    else:
        source, offline = pretrained_source(model_cfg.name)
        if _is_tokenizer_source(source):
            tokenizer = AutoTokenizer.from_pretrained(source, **offline)
        else:
            tokenizer = tiny_tokenizer()
    if tokenizer.pad_token is None:
        # Padding is never supervised (labels -100) and is its own document in packed rows, so reusing the
        # end-of-sequence token is safe.
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if tokenizer.pad_token is None:
        raise ValueError(f"tokenizer of {model_cfg.name!r} has neither a pad, an eos nor an unk token to pad with")
    if data_cfg.template in SHIPPED_TEMPLATES:
        tokenizer.chat_template = template_text(data_cfg.template)
    elif data_cfg.template == "tokenizer":
        if not tokenizer.chat_template:
            if data_cfg.format != "alpaca":
                raise ValueError(
                    f"data.template is 'tokenizer' but the tokenizer of {model_cfg.name!r} has no chat template; "
                    "use data.template: qwen2.5-tools"
                )
            # Base models (Mistral-7B-v0.1) have no chat template: alpaca data uses its plain prompt format.
            tokenizer.chat_template = template_text("alpaca")
    else:
        raise ValueError(
            f"data.template: unknown template {data_cfg.template!r}; expected 'tokenizer' or one of "
            f"{sorted(SHIPPED_TEMPLATES)}"
        )
    return tokenizer
