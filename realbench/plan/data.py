"""The `data:` section of a scenario: which files an RLHF job trains on and how their columns
map to what each algorithm needs. Reading and tokenizing them is `realbench.plan.datafiles`'s.

    data:
      train: prompts.jsonl             # JSON Lines, Parquet or a datasets save_to_disk folder (or a list),
                                       # relative to the scenario; the Python API also takes a datasets.Dataset
      eval: held-out.jsonl             # optional; else `eval_size` rows are held out of train
      eval_size: 16
      fields: {prompt: question}       # realbench field -> column; the defaults are the field names
      max_new_tokens: 64               # generated tokens per response (the dataflow's gen_len)
      prompt_percentile: 100           # prompt_len = this percentile of the tokenized prompt lengths
      tokenizer: ckpt/                 # default: the actor's checkpoint folder
      chat: false                      # true: plain-text prompts become user messages (chat template)

Fields per algorithm (TRL's names): PPO, GRPO, RLOO and ReMax read `prompt`; DPO `prompt`,
`chosen`, `rejected`; SFT `text`, or `prompt` and `completion` (trained on the completion only).
A prompt that is a list of {role, content} messages goes through the tokenizer's chat template.
Every other column reaches reward functions as keyword arguments.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import ConfigDict, Field, field_validator

from realbench.schema import FileModel, unknown_key

FIELDS = {"ppo": ("prompt",), "grpo": ("prompt",), "rloo": ("prompt",), "remax": ("prompt",),
          "dpo": ("prompt", "chosen", "rejected"), "sft": ("text",)}
SFT_PAIR = ("prompt", "completion")
ALL_FIELDS = ("prompt", "chosen", "rejected", "text", "completion")


def _is_dataset(v: Any) -> bool:
    return type(v).__name__ == "Dataset" and hasattr(v, "save_to_disk") and hasattr(v, "_fingerprint")


def saved_dataset(ds: Any) -> str:
    """A `datasets.Dataset` given through the Python API, as the folder its `save_to_disk` wrote
    (under the cache folder, by the dataset's fingerprint: saved once), which every worker reads."""
    from realbench.cache import cache_folder

    folder = cache_folder() / "datasets" / ds._fingerprint
    if not (folder / "dataset_info.json").is_file():
        ds.save_to_disk(str(folder))
    return str(folder)


class DataSpec(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    train: tuple[str, ...] = Field(min_length=1)  # absolute paths once the scenario is read
    eval: tuple[str, ...] = ()
    eval_size: int = Field(default=0, ge=0)
    fields: dict[str, str] = Field(default_factory=dict)
    max_new_tokens: int = Field(default=0, ge=0)
    prompt_percentile: float = Field(default=100.0, gt=0, le=100)
    tokenizer: Optional[str] = None
    chat: bool = False
    shuffle: bool = True
    # what reading the files found (filled in when the scenario is read; reported by `validate`)
    rows: int = 0
    prompt_len: int = 0  # padded width of prompts (DPO/SFT: of the prompt part)
    completion_len: int = 0  # DPO/SFT: of the completion part (with its end-of-sequence token)
    truncated: int = 0  # rows cut to fit those widths
    vocab: int = 0  # the tokenizer's size: no model may have fewer embedding rows
    # models whose checkpoint folder holds a tokenizer other than the data's: role -> that folder,
    # and the width the sequences they score take once re-tokenized (reward models only)
    columns: tuple[str, ...] = ()  # of the training rows (reward functions get the others by name)
    tokenizers: dict[str, str] = Field(default_factory=dict)
    rescored_len: dict[str, int] = Field(default_factory=dict)

    @field_validator("train", "eval", mode="before")
    @classmethod
    def _files(cls, v: Any):
        if v is None:
            return ()
        if _is_dataset(v):  # the Python API: a datasets.Dataset, kept as a folder the workers read
            return (saved_dataset(v),)
        return (v,) if isinstance(v, str) else tuple(saved_dataset(x) if _is_dataset(x) else x for x in v)

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if key not in ALL_FIELDS:
                raise unknown_key(key, ALL_FIELDS)
        return v

    def column(self, field: str) -> str:
        return self.fields.get(field, field)
