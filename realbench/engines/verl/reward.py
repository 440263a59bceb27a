"""verl's built-in reward, as realbench's scenario names it.

A verl job that names neither a reward function (`reward.custom_reward_function.path`) nor a
reward model (`reward.reward_model.enable`) scores each response with verl's own rule-based
scorers, chosen by each row's `data_source` (GSM8K, MATH, ...: verl/utils/reward_score/__init__.py,
default_compute_score, called by its reward manager on the CPU). A scenario read from verl
(`realbench import verl`) names this function in its place: realbench prices its CPU time per
response (models.FunctionSpec.seconds_per_sample), never calls it, and writes the job back without
a custom reward function (`export --format verl`), so that verl scores with its own again.
"""


def default_compute_score(prompts, completions, **columns):
    raise RuntimeError("verl scores this job with its built-in rule-based scorers (verl/utils/reward_score, chosen by "
                       "each row's data_source); realbench plans a verl job and does not run it: export it "
                       "(--format verl)")
