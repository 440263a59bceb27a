"""A job of the kind a user brings, made small enough to run on a laptop CPU in seconds: a
checkpoint folder saved by transformers (with a tokenizer trained on the spot by `tokenizers`),
a JSON Lines file of prompts, a reward function, and the scenario that names them. The notebooks
and tests build theirs with it; in your own work, the three files are yours:

    from realbench.examples import tiny_grpo_job
    scenario = tiny_grpo_job("my-job")      # my-job/ckpt/, train.jsonl, rewards.py, grpo-arithmetic.yaml
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

ARITHMETIC = [f"what is {a} + {b} ? {a + b}" for a in range(10) for b in range(10)]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIALS = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]


def train_tokenizer(folder: Path, vocab_size: int = 60, chat: bool = True):
    """A small BPE tokenizer trained on arithmetic text, saved as a transformers tokenizer."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
    tok.train_from_iterator(ARITHMETIC * 5, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                                unk_token="<unk>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def save_model(folder: Path, family: str = "Llama", vocab: int = 64, hidden: int = 64, layers: int = 4,
               heads: int = 4, kv_heads: int = 2, ffn: int = 176, cls: str | None = None, seed: int = 0,
               tokenizer: bool = True, **config):
    """A randomly initialised `<family>ForCausalLM` (or `cls`) saved with save_pretrained, with the
    arithmetic tokenizer beside it."""
    import torch
    import transformers

    folder = Path(folder)
    # the special tokens of the arithmetic tokenizer (<pad> 0, <eos> 1), so that the checkpoint's
    # generation config stops where the tokenizer says a text ends
    ids = {"pad_token_id": SPECIALS.index("<pad>"), "eos_token_id": SPECIALS.index("<eos>"), "bos_token_id": None}
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        **({"sliding_window": None} if family == "Mistral" else {}), **{"max_position_embeddings": 256, **ids, **config})
    torch.manual_seed(seed)
    model = getattr(transformers, cls or f"{family}ForCausalLM")(cfg)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        train_tokenizer(folder)
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def arithmetic_prompts(n: int = 48, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"question": f"what is {a} + {b} ?", "answer": str(a + b)})
    return rows


# A rule-based reward with TRL's convention: the share of the completion's characters that are
# digits, and 1 more when the completion holds the answer. A randomly initialised model can
# raise the first part quickly, which is what a short CPU test can show.
REWARD_FUNCTION = '''
def digits(prompts, completions, answer, **columns):
    out = []
    for completion, a in zip(completions, answer):
        text = completion.replace(" ", "")
        share = sum(ch.isdigit() for ch in text) / max(1, len(text))
        out.append(share + (1.0 if a in text else 0.0))
    return out


def broken(prompts, completions, **columns):
    return [1.0 / 0.0 for _ in completions]


def short(prompts, completions, **columns):
    return [0.0]
'''


# How the tiny jobs train: a tiny random model needs a far higher rate than TRL's default (1e-6,
# decayed linearly over the run) to learn anything in a few dozen steps on a CPU.
TINY_TRAINING = {"learning_rate": 1e-3, "lr_scheduler_type": "constant"}


# The algorithms a tiny job trains (their samples compared within a prompt's group), with their
# own training settings: GRPO's beta 0.04 (TRL's former GRPOConfig default; it is 0.0 now),
# RLOO's the default (TRL's RLOOConfig: 0.05).
GROUP_ALGORITHMS = {"grpo": {"beta": 0.04}, "rloo": {}}


def write_scenario(folder: Path, name: str, algorithm: str, models: dict, data: dict, dataflow: dict,
                   devices: int = 2, nodes: int = 1, training: dict | None = None) -> Path:
    doc = {"schema": "realbench.scenario/1", "name": name, "algorithm": algorithm,
           "cluster": {"nodes": nodes, "gpus_per_node": devices, "device": "cpu"}, "models": models, "data": data,
           "dataflow": {"algorithm": algorithm, **dataflow}, "training": training or TINY_TRAINING}
    path = Path(folder) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# The tiny checkpoints of the families a job may bring (transformers' config keys beside save_model's
# shapes): Qwen3's own head width and q/k norms; a Qwen3-MoE of 8 experts, 2 a token
TINY_FAMILIES = {"Llama": {}, "Qwen3": {"head_dim": 32},
                 "Qwen3Moe": {"head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                              "norm_topk_prob": True}}


def tiny_grpo_job(folder: Path, devices: int = 2, reward: str = "rewards.py:digits", prompts: int = 4,
             group_size: int = 4, max_new_tokens: int = 6, nodes: int = 1, algorithm: str = "grpo",
             family: str = "Llama", **data) -> Path:
    """The three files of a GRPO job (checkpoint folder, data file, reward function) and its
    scenario, in `folder`; `algorithm="rloo"`: the same job trained by RLOO (`rloo-arithmetic.yaml`,
    with RLOO's own beta, TRL's default 0.05); `family`: the checkpoint's (TINY_FAMILIES: Llama,
    Qwen3, Qwen3Moe)."""
    if algorithm not in GROUP_ALGORITHMS:
        raise ValueError(f"a tiny job of {', '.join(GROUP_ALGORITHMS)}, not {algorithm!r}")
    if family not in TINY_FAMILIES:
        raise ValueError(f"a tiny checkpoint of {', '.join(TINY_FAMILIES)}, not {family!r}")
    folder = Path(folder)
    if not (folder / "ckpt" / "config.json").is_file():
        save_model(folder / "ckpt", family, **TINY_FAMILIES[family])
    write_jsonl(folder / "train.jsonl", arithmetic_prompts())
    (folder / "rewards.py").write_text(REWARD_FUNCTION)
    return write_scenario(
        folder, f"{algorithm}-arithmetic", algorithm, {"actor": {"path": "ckpt"}, "ref": {"path": "ckpt"},
                                                       "reward": {"function": reward}},
        {"train": "train.jsonl", "fields": {"prompt": "question"}, "max_new_tokens": max_new_tokens,
         "eval_size": 8, **data},
        {"prompts": prompts, "group_size": group_size, "minibatches": 1}, devices, nodes,
        {**TINY_TRAINING, "max_grad_norm": 1.0, **GROUP_ALGORITHMS[algorithm], "temperature": 1.0})
