"""Data files for a run: rows read from JSON Lines or Parquet, tokenized by the checkpoint's
tokenizer, and cut into the batches each step's calls read.

Layout of a batch (token ids, -1 for padding, a fixed width so that every step has the shape the
plan was costed for):
  * prompts   (generation algorithms): prompts left-padded to `prompt_len`; longer prompts keep
              their last `prompt_len` tokens; each repeated `group_size` times (GRPO, RLOO);
  * pairs     (DPO): for each row, [prompt | chosen] then [prompt | rejected], the prompt
              left-padded to `prompt_len` and the completion (with the end-of-sequence token)
              right-padded to `completion_len`;
  * sequences (SFT): [prompt | completion] the same way, or a `text` right-padded.
Order: every epoch goes through the training rows in a fresh permutation drawn from the seed and
the epoch (none without `shuffle`); step s takes the next `count` rows of that stream. The
held-out rows (`eval`, or `eval_size` rows set apart by a permutation that depends on the data
alone) are never trained on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from realbench.errors import ConfigError
from realbench.plan.data import FIELDS, SFT_PAIR, DataSpec

GENERATION = ("ppo", "grpo", "rloo", "remax")


def read_rows(path: str) -> list[dict]:
    """The rows of a JSON Lines (`.jsonl`, `.json` with one object per line) or Parquet file, or
    of a folder written by Hugging Face datasets' `save_to_disk` (a DatasetDict's train split)."""
    p = Path(path)
    if p.is_dir():
        return _saved_dataset_rows(p)
    if not p.is_file():
        raise ConfigError("no such file" if not p.exists() else "not a regular file", source=str(p))
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist()
        except Exception as e:  # pyarrow's errors have no common base worth naming
            raise ConfigError(f"not a readable Parquet file: {str(e).splitlines()[0]}", source=str(p)) from None
    if suffix not in (".jsonl", ".json"):
        raise ConfigError("a data file is .jsonl (JSON Lines) or .parquet", source=str(p))
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ConfigError(f"line {n} is not JSON (one object per line)", source=str(p)) from None
            if not isinstance(row, dict):
                raise ConfigError(f"line {n} is not a JSON object", source=str(p))
            rows.append(row)
    if not rows:
        raise ConfigError("holds no rows", source=str(p))
    return rows


def _saved_dataset_rows(folder: Path) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(folder))
    except (FileNotFoundError, ValueError, OSError):
        raise ConfigError("a folder, but not one written by datasets' save_to_disk (no dataset_info.json / "
                          "dataset_dict.json)", source=str(folder)) from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ConfigError(f"a DatasetDict without a train split (splits: {', '.join(ds)}); save the split "
                              "to train on", source=str(folder))
        ds = ds["train"]
    rows = ds.to_list()
    if not rows:
        raise ConfigError("holds no rows", source=str(folder))
    return rows


def load_tokenizer(folder: str):
    """The tokenizer of a checkpoint folder (local files only: nothing is downloaded)."""
    import transformers

    if not Path(folder).is_dir():
        raise ConfigError("no such folder", source=folder)
    if not has_tokenizer(folder):
        raise ConfigError("no tokenizer (tokenizer.json / tokenizer_config.json)", source=folder)
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its notes about special tokens are not ours to print
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"unreadable tokenizer: {str(e).splitlines()[0]}", source=folder) from None
    finally:
        transformers.logging.set_verbosity(level)


def is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


@dataclass
class Encoder:
    """Text (or chat messages) to token ids, as the algorithm's fields need them."""

    tokenizer: Any
    chat: bool
    source: str

    def prompt(self, value: Any, where: str) -> list[int]:
        tok = self.tokenizer
        if isinstance(value, str) and self.chat:
            value = [{"role": "user", "content": value}]
        if is_messages(value):
            if not getattr(tok, "chat_template", None):
                raise ConfigError(f"{where}: chat messages, but the tokenizer has no chat template", source=self.source)
            text = tok.apply_chat_template(value, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text or a list of {{role, content}} messages, got "
                              f"{type(value).__name__}", source=self.source)
        return list(tok(value, add_special_tokens=True)["input_ids"])

    def completion(self, value: Any, where: str) -> list[int]:
        """A response to train on: its tokens and the end-of-sequence token."""
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {type(value).__name__}", source=self.source)
        return list(self.tokenizer(value, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]

    def text(self, value: Any, where: str) -> list[int]:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {type(value).__name__}", source=self.source)
        return list(self.tokenizer(value, add_special_tokens=True)["input_ids"]) + [self.tokenizer.eos_token_id]

    def scored(self, prompt: Any, completion: str) -> list[int]:
        """What a reward model with this (its own) tokenizer scores, as TRL builds it: a chat
        prompt and the completion as the assistant's message through the chat template, else the
        prompt's text followed by the completion's; no special tokens added beyond the template's."""
        tok = self.tokenizer
        if isinstance(prompt, str) and self.chat:
            prompt = [{"role": "user", "content": prompt}]
        if is_messages(prompt):
            if not getattr(tok, "chat_template", None):
                raise ConfigError("chat messages, but the reward model's tokenizer has no chat template",
                                  source=self.source)
            text = tok.apply_chat_template(list(prompt) + [{"role": "assistant", "content": completion}],
                                           tokenize=False)
        else:
            text = str(prompt) + completion
        return list(tok(text, add_special_tokens=False)["input_ids"])


def prompt_text(value: Any) -> str:
    """The words of a prompt (its messages' contents joined), to compare tokenizers on."""
    return " ".join(m["content"] for m in value) if is_messages(value) else str(value)


def same_tokenizer(a, b, texts: list[str]) -> bool:
    """Whether two tokenizers turn text into the same ids: the same vocabulary, end-of-sequence
    token and chat template, and the same ids for the texts given."""
    if a.get_vocab() != b.get_vocab() or a.eos_token_id != b.eos_token_id:
        return False
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return False
    return all(a(t)["input_ids"] == b(t)["input_ids"] for t in texts)


def has_tokenizer(folder: str) -> bool:
    return Path(folder, "tokenizer_config.json").is_file() or Path(folder, "tokenizer.json").is_file()


def stop_token_ids(tokenizer, checkpoint: Optional[str]) -> tuple[int, ...]:
    """The ids that end a response: the tokenizer's end-of-sequence token and every one of the
    checkpoint's `generation_config.json` (`eos_token_id`, a number or a list), as
    transformers' `generate` and TRL stop at them."""
    ids = [tokenizer.eos_token_id]
    path = Path(checkpoint, "generation_config.json") if checkpoint else None
    if path is not None and path.is_file():
        try:
            value = json.loads(path.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            raise ConfigError("unreadable (not a JSON object)", source=str(path)) from None
        extra = value if isinstance(value, list) else [] if value is None else [value]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in extra):
            raise ConfigError(f"eos_token_id {value!r} is not a token id or a list of them", source=str(path))
        ids += extra
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def percentile_len(lengths: list[int], pct: float) -> int:
    return max(1, int(math.ceil(np.percentile(np.asarray(lengths), pct))))


def _left(ids: list[int], width: int) -> list[int]:
    ids = ids[-width:]
    return [-1] * (width - len(ids)) + ids


def _right(ids: list[int], width: int) -> list[int]:
    ids = ids[:width]
    return ids + [-1] * (width - len(ids))


class Dataset:
    """The rows of a scenario's data files, encoded for its algorithm (see the module doc)."""

    def __init__(self, spec: DataSpec, algorithm: str, tokenizer_dir: str, seed: int = 0):
        if algorithm not in FIELDS:
            raise ConfigError(f"data files train the built-in algorithms ({', '.join(FIELDS)}), not {algorithm!r}",
                              "algorithm")
        self.spec, self.algorithm, self.seed = spec, algorithm, seed
        self.tokenizer = load_tokenizer(tokenizer_dir)
        if self.tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer has no end-of-sequence token (eos_token)", source=tokenizer_dir)
        rows = [r for f in spec.train for r in read_rows(f)]
        held = [r for f in spec.eval for r in read_rows(f)]
        if not held and spec.eval_size:
            if spec.eval_size >= len(rows):
                raise ConfigError(f"{spec.eval_size} held-out rows leave none of the {len(rows)} to train on",
                                  "data.eval_size")
            order = np.random.default_rng(0).permutation(len(rows))  # the data's own split, whatever the seed
            held = [rows[i] for i in sorted(order[-spec.eval_size:])]
            rows = [rows[i] for i in sorted(order[:-spec.eval_size])]
        self.fields = self._fields(rows[0])
        encoder = Encoder(self.tokenizer, spec.chat, spec.train[0])
        self.train = [self._encode(encoder, r, i) for i, r in enumerate(rows)]
        self.held_out = [self._encode(encoder, r, i) for i, r in enumerate(held)]
        self.rows, self.held_rows = rows, held
        self.pair_format = algorithm == "sft" and self.fields[0] == "prompt"
        self._orders: dict[int, np.ndarray] = {}

    def _fields(self, first: dict) -> tuple[str, ...]:
        """The fields this algorithm reads, checked against the first row's columns."""
        wanted = FIELDS[self.algorithm]
        if self.algorithm == "sft" and self.spec.column("text") not in first and self.spec.column("prompt") in first:
            wanted = SFT_PAIR
        for f in wanted:
            if self.spec.column(f) not in first:
                raise ConfigError(f"no column {self.spec.column(f)!r} for the {f} (columns: "
                                  f"{', '.join(sorted(first)) or 'none'}); map it with data.fields.{f}",
                                  source=self.spec.train[0])
        return wanted

    def _encode(self, enc: Encoder, row: dict, i: int) -> dict[str, list[int]]:
        out = {}
        for f in self.fields:
            column = self.spec.column(f)
            if column not in row:
                raise ConfigError(f"row {i + 1} has no column {column!r}", source=self.spec.train[0])
            value, where = row[column], f"row {i + 1}, {column}"
            if f == "prompt":
                out[f] = enc.prompt(value, where)
            elif f == "text":
                out[f] = enc.text(value, where)
            else:
                out[f] = enc.completion(value, where)
        return out

    # -- the widths the plan is costed for --------------------------------------------------------
    def widths(self) -> tuple[int, int, int]:
        """(prompt_len, completion_len, truncated rows): the prompt part's width is the
        `prompt_percentile` of the prompt lengths (likewise the completion part's for DPO and
        SFT), and how many rows do not fit."""
        pct = self.spec.prompt_percentile
        prompt = completion = 0
        if "prompt" in self.fields:
            prompt = percentile_len([len(r["prompt"]) for r in self.train], pct)
        if self.algorithm == "dpo":
            completion = percentile_len([max(len(r["chosen"]), len(r["rejected"])) for r in self.train], pct)
        elif self.pair_format:
            completion = percentile_len([len(r["completion"]) for r in self.train], pct)
        elif self.algorithm == "sft":
            completion = percentile_len([len(r["text"]) for r in self.train], pct)
        truncated = 0
        for r in self.train:
            long = "prompt" in r and len(r["prompt"]) > prompt
            long |= any(len(r[f]) > completion for f in ("chosen", "rejected", "completion", "text") if f in r)
            truncated += bool(long)
        return prompt, completion, truncated

    # -- batches ----------------------------------------------------------------------------------------
    def indices(self, step: int, count: int) -> list[int]:
        """The training rows step `step` reads (`count` of them)."""
        n = len(self.train)
        out = []
        for q in range(step * count, (step + 1) * count):
            epoch, k = divmod(q, n)
            out.append(int(self._order(epoch)[k]))
        return out

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders[epoch] = (np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
                                   if self.spec.shuffle else np.arange(len(self.train)))
        return self._orders[epoch]

    def epoch(self, step: int, count: int) -> float:
        return step * count / len(self.train)

    def rows_of(self, step: Optional[int], count: int, held_out: bool = False) -> list[int]:
        if held_out:
            return list(range(min(count, len(self.held_out))))
        return self.indices(step, count)

    def batch(self, key: str, idx: list[int], prompt_len: int, completion_len: int, group_size: int = 1,
              held_out: bool = False):
        """The token ids of `key` ("prompts", "pairs" or "sequences") for rows `idx`."""
        import torch

        rows = [(self.held_out if held_out else self.train)[i] for i in idx]
        if key == "prompts":
            out = [_left(r["prompt"], prompt_len) for r in rows for _ in range(group_size)]
        elif key == "pairs":
            out = [_left(r["prompt"], prompt_len) + _right(r[c], completion_len) for r in rows
                   for c in ("chosen", "rejected")]
        elif key == "sequences":
            out = [(_left(r["prompt"], prompt_len) + _right(r["completion"], completion_len)) if self.pair_format
                   else _right(r["text"], completion_len) for r in rows]
        else:
            raise ConfigError(f"the data has no key {key!r}")
        return torch.tensor(out, dtype=torch.long)

    def rescored_width(self, tokenizer, max_new_tokens: int) -> int:
        """The width a reward model with its own `tokenizer` scores: the `prompt_percentile` of
        the data's prompts as it tokenizes them (`Encoder.scored`, with an empty completion),
        plus `max_new_tokens` scaled by how many of its tokens the data's prompt texts take per
        token of the policy's tokenizer."""
        enc = Encoder(tokenizer, self.spec.chat, self.spec.train[0])
        prompts = [r[self.spec.column("prompt")] for r in self.rows]
        texts = [prompt_text(p) for p in prompts]
        theirs = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        ours = sum(len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        width = percentile_len([len(enc.scored(p, "")) for p in prompts], self.spec.prompt_percentile)
        return width + math.ceil(max_new_tokens * theirs / max(1, ours))

    def columns(self, idx: list[int], group_size: int = 1, held_out: bool = False) -> dict[str, list]:
        """The rows' columns as lists (each repeated `group_size` times), for reward functions."""
        rows = [(self.held_rows if held_out else self.rows)[i] for i in idx]
        keys = rows[0].keys() if rows else []
        return {k: [r.get(k) for r in rows for _ in range(group_size)] for k in keys}
