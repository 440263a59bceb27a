"""Data files: JSON Lines and Parquet, field maps, chat templates, seeded shuffling epoch by
epoch, the held-out split, and the fixed-width batches with -1 padding."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from realbench.errors import ConfigError
from realbench.plan.data import DataSpec
from realbench.plan.datafiles import Dataset, read_rows
from realbench.examples import arithmetic_prompts, train_tokenizer, write_jsonl

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    train_tokenizer(folder)
    return str(folder)


def spec(path, **kw):
    return DataSpec(train=(str(path),), **kw)


def test_jsonl_and_parquet_give_the_same_rows(tmp_path, tok_dir):
    rows = arithmetic_prompts(12)
    write_jsonl(tmp_path / "a.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    assert read_rows(str(tmp_path / "a.jsonl")) == read_rows(str(tmp_path / "a.parquet")) == rows
    a = Dataset(spec(tmp_path / "a.jsonl", fields={"prompt": "question"}), "grpo", tok_dir)
    b = Dataset(spec(tmp_path / "a.parquet", fields={"prompt": "question"}), "grpo", tok_dir)
    assert a.train == b.train and a.widths() == b.widths()
    (tmp_path / "a.csv").write_text("question\n")
    with pytest.raises(ConfigError, match=r"\.jsonl \(JSON Lines\) or \.parquet"):
        read_rows(str(tmp_path / "a.csv"))


def test_chat_messages_go_through_the_template(tmp_path, tok_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    messages = [{"role": "user", "content": "what is 2 + 3 ?"}]
    write_jsonl(tmp_path / "chat.jsonl", [{"prompt": messages}])
    ds = Dataset(spec(tmp_path / "chat.jsonl"), "grpo", tok_dir)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>what is 2 + 3 ?<|assistant|>"
    assert ds.train[0]["prompt"] == tok(text, add_special_tokens=False)["input_ids"]
    # plain text with chat: true becomes a user message; without, it is tokenized as it is
    write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "what is 2 + 3 ?"}])
    assert Dataset(spec(tmp_path / "plain.jsonl", chat=True), "grpo", tok_dir).train == ds.train
    assert Dataset(spec(tmp_path / "plain.jsonl"), "grpo", tok_dir).train[0]["prompt"] == \
        tok("what is 2 + 3 ?")["input_ids"]
    plain_tok = tmp_path / "no-template"
    train_tokenizer(plain_tok, chat=False)
    with pytest.raises(ConfigError, match="row 1, prompt: chat messages, but the tokenizer has no chat template"):
        Dataset(spec(tmp_path / "chat.jsonl"), "grpo", str(plain_tok))


def test_every_epoch_is_a_seeded_permutation_and_held_out_rows_are_never_trained_on(tmp_path, tok_dir):
    rows = [{"prompt": f"what is {i} + {i} ?", "id": i} for i in range(20)]
    write_jsonl(tmp_path / "d.jsonl", rows)
    ds = Dataset(spec(tmp_path / "d.jsonl", eval_size=5), "grpo", tok_dir, seed=1)
    assert len(ds.train) == 15 and len(ds.held_out) == 5
    held = {r["id"] for r in ds.held_rows}
    assert held.isdisjoint(r["id"] for r in ds.rows)
    # 3 epochs of 15 rows, 5 rows a step: every epoch reads each row once, in its own order
    epochs = [sum((ds.indices(s, 5) for s in range(3 * e, 3 * e + 3)), []) for e in range(3)]
    assert all(sorted(e) == list(range(15)) for e in epochs) and epochs[0] != epochs[1]
    assert ds.epoch(3, 5) == 1.0 and ds.epoch(4, 5) == pytest.approx(4 / 3)
    other = Dataset(spec(tmp_path / "d.jsonl", eval_size=5), "grpo", tok_dir, seed=2)
    assert other.indices(0, 15) != ds.indices(0, 15)
    assert {r["id"] for r in other.held_rows} == held  # the split depends on the data alone
    assert Dataset(spec(tmp_path / "d.jsonl", shuffle=False), "grpo", tok_dir).indices(0, 20) == list(range(20))


def test_batches_are_padded_to_the_data_widths(tmp_path, tok_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    rows = [{"prompt": "what is 1 + 1 ?", "chosen": "2", "rejected": "7"},
            {"prompt": "what is 10 + 1 ? what is 1 + 1 ?", "chosen": "11", "rejected": "3"}]
    write_jsonl(tmp_path / "p.jsonl", rows)
    ds = Dataset(spec(tmp_path / "p.jsonl", prompt_percentile=50), "dpo", tok_dir)
    lengths = [len(tok(r["prompt"])["input_ids"]) for r in rows]
    prompt, completion, truncated = ds.widths()
    assert prompt == -(-(lengths[0] + lengths[1]) // 2) and truncated == 1  # the median; the longer prompt is cut
    batch = ds.batch("pairs", [0, 1], prompt, completion)
    assert batch.shape == (4, prompt + completion)
    first = batch[0].tolist()
    ids = tok(rows[0]["prompt"])["input_ids"]
    assert first[:prompt] == [-1] * (prompt - len(ids)) + ids  # left-padded prompt
    chosen = tok("2", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert first[prompt:prompt + len(chosen)] == chosen and set(first[prompt + len(chosen):]) <= {-1}
    long = batch[2].tolist()[:prompt]
    assert long == tok(rows[1]["prompt"])["input_ids"][-prompt:]  # the long prompt keeps its end
    assert batch[0, :prompt].tolist() == batch[1, :prompt].tolist()  # chosen and rejected share the prompt
