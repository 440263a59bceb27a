"""The tests' user jobs: the library's own (realbench.examples)."""

from realbench.examples import (ARITHMETIC, REWARD_FUNCTION, arithmetic_prompts, save_model, tiny_grpo_job,  # noqa: F401
                                train_tokenizer, write_jsonl, write_scenario)

grpo_job = tiny_grpo_job
